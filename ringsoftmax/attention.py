"""Single-device attention of one block: argument checks, autograd, dispatch to the block kernels.

Tensors follow flash-attention: q (batch, seqlen_q, heads, head_dim), k/v (batch, seqlen_k,
kv_heads, head_dim) with ``heads % kv_heads == 0`` (GQA/MQA; K/V are never repeated), lse
(batch, heads, seqlen_q) float32. A query with no visible key gets out = 0 and lse = -inf.
"""
from __future__ import annotations

import math

import torch

from .backend import attention_ops
from .softmax import FLOAT_DTYPES


def check_qkv(q, k, v, fn: str, packed: bool = False) -> None:
    """Raise a clear error for q/k/v that don't form one attention problem."""
    want = 3 if packed else 4
    layout = "(total_tokens, heads, head_dim)" if packed else "(batch, seqlen, heads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != want:
            raise ValueError(f"{fn}: {name} must be {layout}, got shape {tuple(t.shape)}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{fn}: {name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"{fn}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"{fn}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"{fn}: k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if not packed and q.shape[0] != k.shape[0]:
        raise ValueError(f"{fn}: q has batch {q.shape[0]} but k/v have batch {k.shape[0]}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{fn}: q has head_dim {q.shape[-1]} but k/v have head_dim {k.shape[-1]}")
    heads, kv_heads = q.shape[-2], k.shape[-2]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{fn}: q's heads ({heads}) must be a multiple of k/v's heads ({kv_heads}) for GQA/MQA")


def default_scale(q: torch.Tensor, softmax_scale):
    """``softmax_scale`` or 1/sqrt(head_dim); raises ValueError unless it is positive and finite
    (the kernels take the row maximum before scaling)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale!r}")
    return scale


class AttentionFunction(torch.autograd.Function):
    """(q, k, v) -> (out, lse) of one block; ``block`` holds the mask and varlen arguments."""

    @staticmethod
    def forward(ctx, q, k, v, block: dict):
        out, lse = attention_ops(q).attention_fwd(q, k, v, **block)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block = block
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        ops = attention_ops(q)
        dout = torch.zeros_like(out) if dout is None else dout
        delta = ops.attention_delta(out, dout)
        if dlse is not None:
            # d lse / d s = p, so a gradient on lse enters as ds += p * dlse: fold it into delta.
            delta = delta - dlse.to(delta.dtype)
        kw = {key: val for key, val in ctx.block.items() if key != "out_dtype"}
        # gradients in the inputs' dtype, rounded once as the kernels write them
        dq, dk, dv = ops.attention_bwd(q, k, v, out, dout, lse, delta, grad_dtype=q.dtype, **kw)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def attention(q, k, v, causal: bool = False, softmax_scale=None):
    """Softmax attention of one device's q against its k/v; differentiable.

    Args:
        q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, kv_heads, head_dim); one float
            dtype and device. ``causal`` masks key j from query i when j > i (positions 0..S-1).
        softmax_scale: multiplies q @ k^T; default 1/sqrt(head_dim).
    Returns:
        (out, lse): out like q; lse (batch, heads, seqlen_q) float32 (float64 for float64 input).
    """
    check_qkv(q, k, v, "attention")
    block = dict(softmax_scale=default_scale(q, softmax_scale), causal=bool(causal))
    return AttentionFunction.apply(q, k, v, block)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k=None, causal: bool = False, softmax_scale=None):
    """Attention over packed variable-length sequences; differentiable.

    Args:
        q: (total_q, heads, head_dim); k, v: (total_k, kv_heads, head_dim).
        cu_seqlens_q: int32 (nseq + 1,) cumulative sequence starts of q, from 0 to total_q;
            cu_seqlens_k likewise for k/v (default: cu_seqlens_q). Tokens of different sequences never
            attend to each other; ``causal`` counts positions from 0 within each sequence.
    Returns:
        (out, lse): out (total_q, heads, head_dim) like q; lse (heads, total_q) float32.
    """
    check_qkv(q, k, v, "attention_varlen", packed=True)
    cu_k = cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k
    lens_q, lens_k = _check_cu_seqlens(cu_seqlens_q, q, "cu_seqlens_q"), _check_cu_seqlens(cu_k, k, "cu_seqlens_k")
    if len(lens_q) != len(lens_k):
        raise ValueError(f"attention_varlen: cu_seqlens_q has {len(lens_q)} sequences, cu_seqlens_k {len(lens_k)}")
    block = dict(softmax_scale=default_scale(q, softmax_scale), causal=bool(causal),
                 cu_seqlens_q=cu_seqlens_q.to(device=q.device, dtype=torch.int32),
                 cu_seqlens_k=cu_k.to(device=q.device, dtype=torch.int32),
                 max_seqlen_q=max(lens_q, default=0), max_seqlen_k=max(lens_k, default=0))
    return AttentionFunction.apply(q, k, v, block)


def _check_cu_seqlens(cu, t, name):
    """Validate cumulative lengths against the packed tensor ``t``; return the list of lengths."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2 or cu.is_floating_point():
        raise ValueError(f"attention_varlen: {name} must be a 1-D integer tensor (nseq + 1,) starting at 0")
    c = [int(x) for x in cu.tolist()]
    if c[0] != 0 or c[-1] != t.shape[0] or any(b < a for a, b in zip(c, c[1:])):
        raise ValueError(f"attention_varlen: {name} must rise from 0 to {t.shape[0]} (the packed length), got {c}")
    return [b - a for a, b in zip(c, c[1:])]
