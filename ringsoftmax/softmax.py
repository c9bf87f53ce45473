"""Single-device softmax with its log-sum-exp: argument checks, autograd, dispatch to the row kernels.

A row that is entirely ``-inf`` gives output 0 and lse ``-inf`` (torch.softmax gives NaN there):
that pair is the merge's identity, so empty shards and fully masked rows compose without NaN.
"""
from __future__ import annotations

import torch

from .backend import softmax_ops

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_softmax_input(x: torch.Tensor, dim: int, fn: str) -> int:
    """Validate ``x`` and ``dim`` for ``fn``; return ``dim`` as a non-negative index."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{fn}: x must be float16, bfloat16, float32 or float64, got {x.dtype}; cast it first")
    if x.dim() == 0:
        raise ValueError(f"{fn}: x must have at least one dimension, got a scalar")
    if not -x.dim() <= dim < x.dim():
        raise IndexError(f"{fn}: dim={dim} is out of range for a tensor of {x.dim()} dims "
                         f"(use -{x.dim()} .. {x.dim() - 1})")
    return dim % x.dim()


def to_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """View ``x`` as (M, N) rows with ``dim`` last (a copy only where strides cannot express it)."""
    moved = x.movedim(dim, -1)
    rows = moved.reshape(moved.shape[:-1].numel(), moved.shape[-1]) if moved.dim() != 2 else moved
    return rows if rows.shape[-1] <= 1 or rows.stride(-1) == 1 else rows.contiguous()


def from_rows(rows: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
    """Inverse of ``to_rows`` for a result shaped like ``like``."""
    return rows.reshape(like.movedim(dim, -1).shape).movedim(-1, dim)


def lse_shape(x: torch.Tensor, dim: int):
    """``x``'s shape without ``dim``: the shape of its per-row lse."""
    return x.shape[:dim] + x.shape[dim + 1:]


class SoftmaxFunction(torch.autograd.Function):
    """(x, dim, with_lse) -> (y, lse, or None without with_lse); backward dx = y * (dy - rowsum(dy * y) + dlse)."""

    @staticmethod
    def forward(ctx, x, dim, with_lse):
        rows = to_rows(x, dim)
        y, lse = softmax_ops(rows).softmax_fwd(rows, with_lse)
        ctx.save_for_backward(y)
        ctx.dim, ctx.shape = dim, x.shape
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None, not zeros
        return from_rows(y, x, dim), None if lse is None else lse.reshape(lse_shape(x, dim))

    @staticmethod
    def backward(ctx, dy, dlse):
        (y,) = ctx.saved_tensors
        like = torch.empty(ctx.shape, device="meta")
        dy_rows = to_rows(dy, ctx.dim) if dy is not None else torch.zeros_like(y)
        ops = softmax_ops(y)
        delta = None
        if dlse is not None:
            # d lse / dx = y, so a gradient on lse enters as dx += y * dlse: fold it into delta.
            delta = ops.row_dot(y, dy_rows)
            delta = delta - dlse.reshape(-1).to(delta.dtype)
        dx = ops.softmax_bwd(y, dy_rows, delta)
        return from_rows(dx, like, ctx.dim), None, None


def softmax_with_lse(x: torch.Tensor, dim: int = -1):
    """Softmax along ``dim`` and the log-sum-exp of each row.

    Args:
        x: any shape, float16 / bfloat16 / float32 / float64, CPU or CUDA.
        dim: the dimension to normalize over.
    Returns:
        (y, lse): y like x (same dtype); lse has x's shape without ``dim``, float32 (float64 for
        float64 input), natural log. An all ``-inf`` row gives y = 0 and lse = -inf.
    """
    dim = check_softmax_input(x, dim, "softmax_with_lse")
    return SoftmaxFunction.apply(x, dim, True)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax along ``dim`` (see ``softmax_with_lse``; lse is not written where that saves a store);
    differentiable."""
    dim = check_softmax_input(x, dim, "softmax")
    return SoftmaxFunction.apply(x, dim, False)[0]
