"""The log-sum-exp update rule: the one place where two (out, lse) pairs become one.

For a row of scores split into blocks a and b, with ``out_x = softmax(x_x) @ V_x`` and
``lse_x = logsumexp(x_x)``::

    lse = logaddexp(lse_a, lse_b)
    out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

Written so that nothing positive is ever exponentiated, and a row with no valid entry on either side
(``lse = -inf``) stays ``(out = 0, lse = -inf)``: the merge's identity, never NaN.

Layouts follow the attention convention: ``out`` is ``(..., seqlen, heads, head_dim)`` and ``lse``
is ``(..., heads, seqlen)`` (``(batch, heads, seqlen)`` for dense attention, ``(heads, tokens)``
for packed varlen batches).
"""
from __future__ import annotations

import torch

NEG_INF = float("-inf")


def accum_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype partial results accumulate in: float32, or float64 when an input is float64."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def merge_lse(lse_a: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """``log(exp(lse_a) + exp(lse_b))`` as ``max + log1p(exp(-|a - b|))``; ``-inf`` with ``-inf`` is ``-inf``."""
    hi = torch.maximum(lse_a, lse_b)
    lo = torch.minimum(lse_a, lse_b)
    # hi == -inf means both are -inf: lo - hi would be NaN, the gap is "infinitely far" instead.
    gap = torch.where(hi == NEG_INF, torch.full_like(hi, NEG_INF), lo - hi)
    return hi + torch.log1p(torch.exp(gap))


def merge_stats(m_a: torch.Tensor, s_a: torch.Tensor, m_b: torch.Tensor, s_b: torch.Tensor):
    """The same rule on (max, sum) row statistics, ``lse = m + log(s)``: returns (m, s) of the union.

    Softmax rows are normalized from (m, s) rather than a rounded lse (see reference.row_stats);
    an empty side is (-inf, 0).
    """
    m = torch.maximum(m_a, m_b)
    safe = torch.where(m == NEG_INF, torch.zeros_like(m), m)
    return m, s_a * torch.exp(m_a - safe) + s_b * torch.exp(m_b - safe)


def stats_to_lse(m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """lse = m + log(s); -inf for an empty row (m = -inf, s = 0)."""
    return torch.where(s == 0, torch.full_like(m, NEG_INF), m + torch.log(s))


def _weight(lse_x: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``exp(lse_x - lse)`` in [0, 1]; 0 where the merged row is empty (``lse = -inf``)."""
    safe = torch.where(lse == NEG_INF, torch.zeros_like(lse), lse)
    return torch.exp(lse_x - safe)


def _rows_to_out(w: torch.Tensor) -> torch.Tensor:
    """(..., heads, seqlen) -> (..., seqlen, heads, 1), to scale an ``out`` tensor."""
    return w.transpose(-1, -2).unsqueeze(-1)


def check_pair(out: torch.Tensor, lse: torch.Tensor, name: str) -> None:
    """Raise unless ``out`` is a floating-point tensor and ``lse`` a float32 / float64 tensor of
    ``out``'s shape without head_dim, seqlen and heads swapped."""
    for arg, t in ((f"out_{name}", out), (f"lse_{name}", lse)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"merge: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if not out.is_floating_point():
        raise TypeError(f"merge: out_{name} must be a floating-point tensor (e.g. float16, bfloat16, float32, "
                        f"float64), got {out.dtype}")
    if out.dim() < 3:
        raise ValueError(f"merge: out_{name} must be (..., seqlen, heads, head_dim), got shape {tuple(out.shape)}")
    want = (*out.shape[:-3], out.shape[-2], out.shape[-3])
    if tuple(lse.shape) != want:
        raise ValueError(
            f"merge: lse_{name} must have shape {want} (out_{name} {tuple(out.shape)} is (..., seqlen, heads, "
            f"head_dim), so lse is (..., heads, seqlen)); got {tuple(lse.shape)}")
    if not lse.is_floating_point() or lse.dtype in (torch.float16, torch.bfloat16):
        raise TypeError(f"merge: lse_{name} must be float32 (or float64), got {lse.dtype}")


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor):
    """Merge two partial attention results over disjoint key blocks into one.

    Args:
        out_a, out_b: (..., seqlen, heads, head_dim), any float dtype, same shape and device.
        lse_a, lse_b: (..., heads, seqlen), float32 (or float64).
    Returns:
        (out, lse): out in float32 (float64 if any input is float64), lse in the same dtype.
    """
    check_pair(out_a, lse_a, "a")
    check_pair(out_b, lse_b, "b")
    if out_a.shape != out_b.shape:
        raise ValueError(f"merge: out_a {tuple(out_a.shape)} and out_b {tuple(out_b.shape)} must have one shape")
    if len({out_a.device, out_b.device, lse_a.device, lse_b.device}) != 1:
        raise ValueError("merge: all four tensors must be on one device")
    acc = accum_dtype(out_a.dtype, out_b.dtype, lse_a.dtype, lse_b.dtype)
    lse_a, lse_b = lse_a.to(acc), lse_b.to(acc)
    lse = merge_lse(lse_a, lse_b)
    out = _rows_to_out(_weight(lse_a, lse)) * out_a.to(acc) + _rows_to_out(_weight(lse_b, lse)) * out_b.to(acc)
    return out, lse


def merge_(acc_out: torch.Tensor, acc_lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """In-place ``(acc_out, acc_lse) <- merge(acc_out, acc_lse, out_b, lse_b)``.

    ``acc_out`` / ``acc_lse`` are float32 (or float64) accumulators and may be strided views (slices
    of a bigger accumulator along seqlen). Where the blocks run on the Triton kernels (CUDA float32
    accumulators, or ``RINGSOFTMAX_BACKEND=triton``) this is the fused kernel of ``kernels/merge.py``,
    which computes the same rule in one pass; otherwise the torch formula above.
    """
    from .backend import kernel_merge_, use_triton
    if acc_out.dtype == torch.float32 and use_triton(acc_out):
        kernel_merge_()(acc_out, acc_lse, out_b, lse_b)
        return
    out, lse = merge(acc_out, acc_lse, out_b, lse_b)
    acc_out.copy_(out)
    acc_lse.copy_(lse)
