"""Fused in-place LSE merge in Triton: ``merge_(acc_out, acc_lse, out_b, lse_b)``.

The kernel computes the rule of ``ringsoftmax/merge.py`` in float32, in one pass over the rows
(b, s, h) of the attention layout: read acc_out, out_b and the two lse values, write acc_out and
acc_lse. It uses the weights' sigmoid form, so the result does not depend on rounding the merged
lse (exact at lse magnitudes of 1e4)::

    hi, lo = max(a, b), min(a, b);  t = exp(lo - hi) in [0, 1]
    lse = hi + log(1 + t);  w_hi = 1 / (1 + t);  w_lo = t / (1 + t)
    out = w_a * out_a + w_b * out_b

Both lse = -inf gives lse = -inf and out = 0, never NaN.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .compile_options import COMPILE_OPTIONS
from .hostmath import cdiv, next_power_of_2
from .launcher import launch_kernel

#: Elements of head_dim handled per step, and rows (b, s, h) per program.
BLOCK_D_MAX = 128
ROWS_PER_PROGRAM_ELEMS = 4096


@triton.jit
def _merge_kernel(ACC, ACC_LSE, OB, LSE_B, R, S, H, D,
                  sa0, sa1, sa2, sl0, sl1, sl2, sb0, sb1, sb2, sc0, sc1, sc2,
                  BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """BLOCK_R rows (b, s, h) per program, head_dim in steps of BLOCK_D."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < R
    r64 = r.to(tl.int64)
    # row index -> (b, s, h), then the four base offsets
    h = r64 % H
    s = (r64 // H) % S
    b = r64 // (H * S)
    acc_row = b * sa0 + s * sa1 + h * sa2
    ob_row = b * sb0 + s * sb1 + h * sb2
    la_off = b * sl0 + h * sl1 + s * sl2
    lb_off = b * sc0 + h * sc1 + s * sc2
    lse_a = tl.load(ACC_LSE + la_off, mask=r_ok, other=float("-inf"))
    lse_b = tl.load(LSE_B + lb_off, mask=r_ok, other=float("-inf"))
    # merged lse and the two weights, never exponentiating a positive number
    hi = tl.maximum(lse_a, lse_b)
    lo = tl.minimum(lse_a, lse_b)
    empty = hi == float("-inf")
    t = tl.exp(lo - tl.where(empty, 0.0, hi))
    lse = hi + tl.log(1.0 + t)
    w_hi = tl.where(empty, 0.0, 1.0 / (1.0 + t))
    w_lo = tl.where(empty, 0.0, t / (1.0 + t))
    a_is_hi = lse_a >= lse_b
    w_a = tl.where(a_is_hi, w_hi, w_lo)
    w_b = tl.where(a_is_hi, w_lo, w_hi)
    # out = w_a * out_a + w_b * out_b over head_dim (a zero weight contributes 0 even for inf / NaN)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        mask = r_ok[:, None] & (d[None, :] < D)
        pa = ACC + acc_row[:, None] + d[None, :]
        oa = tl.load(pa, mask=mask, other=0.0)
        ob = tl.load(OB + ob_row[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
        out = tl.where(w_a[:, None] > 0, w_a[:, None] * oa, 0.0) + tl.where(w_b[:, None] > 0, w_b[:, None] * ob, 0.0)
        tl.store(pa, out, mask=mask)
    # every thread has read acc_lse above before any thread overwrites it
    tl.debug_barrier()
    tl.store(ACC_LSE + la_off, lse, mask=r_ok)


def _check(acc_out, acc_lse, out_b, lse_b) -> None:
    if acc_out.dim() != 4:
        raise ValueError(f"merge_: acc_out must be (B, S, H, D), got shape {tuple(acc_out.shape)}")
    bsz, s, h, _ = acc_out.shape
    if tuple(out_b.shape) != tuple(acc_out.shape):
        raise ValueError(f"merge_: out_b {tuple(out_b.shape)} must have acc_out's shape {tuple(acc_out.shape)}")
    for name, lse in (("acc_lse", acc_lse), ("lse_b", lse_b)):
        if tuple(lse.shape) != (bsz, h, s):
            raise ValueError(f"merge_: {name} must be (B, H, S) = {(bsz, h, s)}, got {tuple(lse.shape)}")
        if lse.dtype != torch.float32:
            raise TypeError(f"merge_: {name} must be float32, got {lse.dtype}")
    if acc_out.dtype != torch.float32:
        raise TypeError(f"merge_: acc_out must be float32, got {acc_out.dtype}")
    if out_b.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"merge_: out_b must be float32, float16 or bfloat16, got {out_b.dtype}")
    if acc_out.shape[-1] > 1 and (acc_out.stride(-1) != 1 or out_b.stride(-1) != 1):
        raise ValueError("merge_: acc_out and out_b must have stride 1 along head_dim")
    if len({t.device for t in (acc_out, acc_lse, out_b, lse_b)}) != 1:
        raise ValueError("merge_: all four tensors must be on one device")


def merge_(acc_out: torch.Tensor, acc_lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """In place: ``(acc_out, acc_lse) <- merge((acc_out, acc_lse), (out_b, lse_b))``.

    Args:
        acc_out: (B, S, H, D) float32, may be a strided view (last stride 1); updated in place.
        acc_lse: (B, H, S) float32, may be a strided view; updated in place.
        out_b: (B, S, H, D) float32 / float16 / bfloat16, any strides with last stride 1.
        lse_b: (B, H, S) float32, any strides.
    """
    _check(acc_out, acc_lse, out_b, lse_b)
    bsz, s, h, d = acc_out.shape
    rows = bsz * s * h
    if rows == 0:
        return
    block_d = min(next_power_of_2(max(d, 1)), BLOCK_D_MAX)
    block_r = max(1, min(ROWS_PER_PROGRAM_ELEMS // block_d, next_power_of_2(rows)))
    warps = max(1, min(8, block_r * block_d // 512))
    launch_kernel(_merge_kernel, (cdiv(rows, block_r),),
        acc_out, acc_lse, out_b, lse_b, rows, s, h, d,
        *acc_out.stride()[:3], *acc_lse.stride(), *out_b.stride()[:3], *lse_b.stride(),
        BLOCK_R=block_r, BLOCK_D=block_d, num_warps=warps, **COMPILE_OPTIONS)
