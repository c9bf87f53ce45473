"""Single-device softmax with its log-sum-exp: argument checks, autograd, dispatch to the row kernels.

A row that is entirely ``-inf`` gives output 0 and lse ``-inf`` (torch.softmax gives NaN there):
that pair is the merge's identity, so empty shards and fully masked rows compose without NaN.
"""
from __future__ import annotations

import functools

import torch

from .backend import softmax_ops
from .layouts import check_dim
from .merge import accum_dtype

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_softmax_input(x: torch.Tensor, dim: int, fn: str) -> int:
    """Validate ``x`` and ``dim`` for ``fn``; return ``dim`` as a non-negative index."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{fn}: x must be float16, bfloat16, float32 or float64, got {x.dtype}; cast it first")
    return check_dim(x, dim, fn)


def to_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """View ``x`` as (M, N) rows with ``dim`` last (a copy only where strides cannot express it)."""
    if dim == x.dim() - 1:  # the common case, without movedim's ~2 us
        rows = x if x.dim() == 2 else x.reshape(x.shape[:-1].numel(), x.shape[-1])
    else:
        moved = x.movedim(dim, -1)
        rows = moved.reshape(moved.shape[:-1].numel(), moved.shape[-1])
    return unit_columns(rows)


def unit_columns(rows: torch.Tensor) -> torch.Tensor:
    """(M, N) ``rows`` with unit column stride, as the row kernels take them (a copy only where they lack it)."""
    return rows if rows.shape[-1] <= 1 or rows.stride(-1) == 1 else rows.contiguous()


def from_rows(rows: torch.Tensor, shape, dim: int) -> torch.Tensor:
    """Inverse of ``to_rows`` for a result of ``shape`` (the input's)."""
    if dim == len(shape) - 1:
        return rows if len(shape) == 2 else rows.reshape(shape)  # (2-D: rows has the shape already)
    return rows.reshape(tuple(shape[:dim]) + tuple(shape[dim + 1:]) + (shape[dim],)).movedim(-1, dim)


def lse_shape(x: torch.Tensor, dim: int):
    """``x``'s shape without ``dim``: the shape of its per-row lse."""
    return x.shape[:dim] + x.shape[dim + 1:]


def softmax_rows(x: torch.Tensor, dim: int, with_lse: bool):
    """(y like x, lse of ``lse_shape`` or None without ``with_lse``), no autograd: x as rows through
    the backend's row kernels and back (under torch.compile, through the custom op ``softmax_rows_op``,
    whose autograd formula is registered with it)."""
    rows = to_rows(x, dim)
    if torch.compiler.is_compiling():
        y, lse = softmax_rows_op(rows, with_lse)
    else:
        y, lse = softmax_ops(rows).softmax_fwd(rows, with_lse)
    return from_rows(y, x.shape, dim), lse.reshape(lse_shape(x, dim)) if with_lse else None


class _DoubleBackwardError(torch.autograd.Function):
    """(fn, grad, *anchors) -> grad: the identity on a gradient computed under ``create_graph=True``,
    recorded as depending on ``anchors`` so that differentiating it towards them raises."""

    @staticmethod
    def forward(ctx, fn, grad, *anchors):
        ctx.fn = fn
        return grad.view_as(grad)

    @staticmethod
    def backward(ctx, _):
        raise RuntimeError(
            f"{ctx.fn}: double backward is not supported: the gradient of {ctx.fn} is not differentiable, so "
            "a gradient taken with create_graph=True cannot be differentiated again (use torch's own ops where "
            "higher-order gradients are needed)")


def once_differentiable(fn: str):
    """Decorator for the ``backward`` of an autograd Function of ``fn`` whose gradient is not itself
    differentiable (the kernels and collectives are opaque to autograd).

    The backward runs without recording a graph. Under ``create_graph=True`` every gradient it returns
    goes through ``_DoubleBackwardError``, recorded as depending on the Function's saved tensors and
    incoming gradients (whichever need grad), so differentiating it raises a RuntimeError naming
    ``fn``; a gradient that is never differentiated again works as usual. Stricter than
    ``torch.autograd.function.once_differentiable``, which marks the gradients only when an incoming
    gradient requires grad, and then on a detached copy that ``torch.autograd.grad(..., inputs)``
    never reaches: a gradient penalty's second derivative silently lacked this Function's terms.
    """
    def decorate(backward):
        @functools.wraps(backward)
        def wrapper(ctx, *grads):
            if not torch.is_grad_enabled():  # create_graph=False: nothing will differentiate the result
                return backward(ctx, *grads)
            with torch.no_grad():
                result = backward(ctx, *grads)
            anchors = [t for t in (*ctx.saved_tensors, *grads) if isinstance(t, torch.Tensor) and t.requires_grad]
            return tuple(_DoubleBackwardError.apply(fn, g, *anchors) if isinstance(g, torch.Tensor) else g
                         for g in result)
        return wrapper
    return decorate


def softmax_rows_backward(y: torch.Tensor, dy, dlse) -> torch.Tensor:
    """dx of (M, N) rows: ``y * (dy - rowsum(dy * y) + dlse)``, no autograd.

    y: the forward's output rows; dy: their gradient (None: zero); dlse: (M,) the gradient of lse
    (None: zero). dx is (M, N) contiguous in dy's dtype (y's without dy).
    """
    dy = torch.zeros_like(y) if dy is None else dy
    ops = softmax_ops(y)
    delta = None
    if dlse is not None:
        # d lse / dx = y, so a gradient on lse enters as dx += y * dlse: fold it into delta.
        delta = ops.row_dot(y, dy)
        delta = delta - dlse.reshape(-1).to(delta.dtype)
    return ops.softmax_bwd(y, dy, delta)


class SoftmaxFunction(torch.autograd.Function):
    """(x, dim, with_lse) -> (y, lse, or None without with_lse); backward dx = y * (dy - rowsum(dy * y) + dlse)."""

    @staticmethod
    def forward(ctx, x, dim, with_lse):
        y, lse = softmax_rows(x, dim, with_lse)
        ctx.save_for_backward(y)
        ctx.dim = dim
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None, not zeros
        return y, lse

    @staticmethod
    @once_differentiable("softmax")
    def backward(ctx, dy, dlse):
        (y_out,) = ctx.saved_tensors
        dx = softmax_rows_backward(to_rows(y_out, ctx.dim), None if dy is None else to_rows(dy, ctx.dim), dlse)
        return from_rows(dx, y_out.shape, ctx.dim), None, None


def softmax_with_lse(x: torch.Tensor, dim: int = -1):
    """Softmax along ``dim`` and the log-sum-exp of each row; differentiable once (a gradient taken
    with ``create_graph=True`` raises if differentiated again).

    Args:
        x: any shape, float16 / bfloat16 / float32 / float64, CPU or CUDA.
        dim: the dimension to normalize over, an int.
    Returns:
        (y, lse): y like x (same dtype); lse has x's shape without ``dim``, float32 (float64 for
        float64 input), natural log. An all ``-inf`` row gives y = 0 and lse = -inf.
    """
    return _softmax(x, check_softmax_input(x, dim, "softmax_with_lse"), True)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax along ``dim`` (see ``softmax_with_lse``; lse is not written where that saves a store);
    differentiable once."""
    return _softmax(x, check_softmax_input(x, dim, "softmax"), False)[0]


def _softmax(x: torch.Tensor, dim: int, with_lse: bool):
    """Through autograd where x needs a gradient, else straight to the rows (autograd.Function costs
    the host ~7 us per call even when nothing is recorded). Under torch.compile straight to the rows
    too: their custom op carries its own autograd formula."""
    if torch.is_grad_enabled() and x.requires_grad and not torch.compiler.is_compiling():
        return SoftmaxFunction.apply(x, dim, with_lse)
    return softmax_rows(x, dim, with_lse)


# torch.compile: dynamo sees the rows' forward and backward as two opaque custom ops (their fakes
# give the outputs' shapes), not the kernels' launch code, which reads data pointers, memoizes plans
# and launches Triton / Gluon kernels that dynamo cannot trace (it failed or broke the graph there).
# Eager calls do not take them (the dispatcher would cost the host a few microseconds per call).

@torch.library.custom_op("ringsoftmax::softmax_rows", mutates_args=(),
                         schema="(Tensor rows, bool with_lse) -> (Tensor, Tensor)")
def softmax_rows_op(rows: torch.Tensor, with_lse: bool):
    """(M, N) rows -> (y (M, N) contiguous in rows' dtype, lse (M,) float32 (float64 for float64
    rows), or an empty (0,) tensor without ``with_lse``)."""
    rows = unit_columns(rows)
    y, lse = softmax_ops(rows).softmax_fwd(rows, with_lse)
    return y.contiguous(), lse if with_lse else rows.new_empty(0, dtype=accum_dtype(rows.dtype))


@softmax_rows_op.register_fake
def _softmax_rows_fake(rows, with_lse):
    m, n = rows.shape
    return rows.new_empty((m, n)), rows.new_empty((m if with_lse else 0,), dtype=accum_dtype(rows.dtype))


@torch.library.custom_op("ringsoftmax::softmax_rows_backward", mutates_args=(),
                         schema="(Tensor y, Tensor? dy, Tensor? dlse) -> Tensor")
def softmax_rows_backward_op(y: torch.Tensor, dy, dlse):
    """``softmax_rows_backward`` as an op: dx (M, N) contiguous. It has no gradient of its own, so a
    second differentiation raises."""
    dy = None if dy is None else unit_columns(dy)
    return softmax_rows_backward(unit_columns(y), dy, dlse).contiguous()


@softmax_rows_backward_op.register_fake
def _softmax_rows_backward_fake(y, dy, dlse):
    return y.new_empty(y.shape, dtype=(y if dy is None else dy).dtype)


def _softmax_rows_setup(ctx, inputs, output):
    ctx.with_lse = inputs[1]
    ctx.save_for_backward(output[0])


def _softmax_rows_grad(ctx, dy, dlse):
    (y,) = ctx.saved_tensors
    return softmax_rows_backward_op(y, dy, dlse if ctx.with_lse else None), None


softmax_rows_op.register_autograd(_softmax_rows_grad, setup_context=_softmax_rows_setup)
