"""Single-device attention of one block: argument checks, autograd, dispatch to the block kernels.

Tensors follow flash-attention: q (batch, seqlen_q, heads, head_dim), k/v (batch, seqlen_k,
kv_heads, head_dim) with ``heads % kv_heads == 0`` (GQA/MQA; K/V are never repeated), lse
(batch, heads, seqlen_q) float32. A query with no visible key gets out = 0 and lse = -inf.
"""
from __future__ import annotations

import math

import torch

from .backend import attention_ops, use_triton
from .kernels.hostmath import MAX_SCALE, check_scale  # (plain Python, no triton)
from .merge import accum_dtype
from .softmax import FLOAT_DTYPES, once_differentiable

KERNEL_MAX_HEAD_DIM = 256  # the Triton kernels' limit (kernels/attention_fwd.check_problem)


def check_qkv(q, k, v, fn: str, packed: bool = False) -> None:
    """Raise a clear error for q/k/v that don't form one attention problem.

    head_dim must be >= 1; where the block runs on the Triton kernels (CUDA float16 / bfloat16 /
    float32 tensors, or ``RINGSOFTMAX_BACKEND=triton``) also at most ``KERNEL_MAX_HEAD_DIM`` (256).
    The plain-torch path (CPU, float64) has no upper limit; there is no silent fallback to it.
    """
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
    _check_head_dim(q, fn)
    heads, kv_heads = q.shape[-2], k.shape[-2]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{fn}: q's heads ({heads}) must be a multiple of k/v's heads ({kv_heads}) for GQA/MQA")


def _check_head_dim(q: torch.Tensor, fn: str) -> None:
    """Raise unless q's head_dim (already equal to k's) is one the backend running q can compute."""
    head_dim = q.shape[-1]
    if head_dim < 1:
        raise ValueError(f"{fn}: head_dim must be >= 1, got q of shape {tuple(q.shape)}")
    if head_dim > KERNEL_MAX_HEAD_DIM and use_triton(q):
        raise ValueError(
            f"{fn}: head_dim is {head_dim}, but the Triton attention kernels (CUDA float16 / bfloat16 / float32, "
            f"or RINGSOFTMAX_BACKEND=triton) take head_dim 1..{KERNEL_MAX_HEAD_DIM}; use a smaller head_dim, "
            "or float64 / CPU tensors, which run the plain-torch path without that limit")


def check_causal(causal, fn: str) -> bool:
    """``causal`` itself if it is a bool; a TypeError otherwise (a string such as "False" would be truthy)."""
    if not isinstance(causal, bool):
        raise TypeError(f"{fn}: causal must be a bool (True or False), got {type(causal).__name__} {causal!r}")
    return causal


def default_scale(q: torch.Tensor, softmax_scale):
    """``softmax_scale`` as a float, or 1/sqrt(head_dim) when it is None.

    Raises TypeError for a tensor that requires grad (it would get no gradient: the scale is a
    constant of the kernels) or for something that is not a number, and ValueError unless the scale
    is positive, finite, and at most ``MAX_SCALE``, so that scale * log2(e) is a finite float32
    (``kernels.hostmath.check_scale``, which the kernels' launchers call too).
    A 0-d tensor that does not require grad is read with ``float``.
    """
    if softmax_scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    if isinstance(softmax_scale, torch.Tensor) and softmax_scale.requires_grad:
        raise TypeError("softmax_scale must be a Python number, got a tensor that requires grad: it would get no "
                        "gradient (pass float(scale), or scale.detach() if it is meant to be a constant)")
    try:
        float(softmax_scale)
    except (TypeError, ValueError):
        raise TypeError(f"softmax_scale must be a Python number or None, got {type(softmax_scale).__name__} "
                        f"{softmax_scale!r}") from None
    return check_scale(softmax_scale)


def attention_block_grads(q, k, v, out, lse, dout, dlse, block: dict):
    """(dq, dk, dv) of one block in q's, k's and v's dtypes, no autograd: ``dout`` the gradient of out
    (None: zero), ``dlse`` that of lse (None: zero); ``block`` as for the block's forward."""
    ops = attention_ops(q)
    dout = torch.zeros_like(out) if dout is None else dout
    delta = ops.attention_delta(out, dout)
    if dlse is not None:
        # d lse / d s = p, so a gradient on lse enters as ds += p * dlse: fold it into delta.
        delta = delta - dlse.to(delta.dtype)
    kw = {key: val for key, val in block.items() if key != "out_dtype"}
    # gradients in the inputs' dtype, rounded once as the kernels write them
    dq, dk, dv = ops.attention_bwd(q, k, v, out, dout, lse, delta, grad_dtype=q.dtype, **kw)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


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
    @once_differentiable("attention")
    def backward(ctx, dout, dlse):
        return *attention_block_grads(*ctx.saved_tensors, dout, dlse, ctx.block), None


def _attention_block(q, k, v, block: dict):
    """(out, lse) of one block with autograd: ``AttentionFunction``, or under torch.compile the custom
    op ``attention_block_op``, which carries its own autograd formula."""
    if torch.compiler.is_compiling():
        return attention_block_op(q, k, v, block["softmax_scale"], block["causal"], block.get("cu_seqlens_q"),
                                  block.get("cu_seqlens_k"), block.get("max_seqlen_q", 0),
                                  block.get("max_seqlen_k", 0))
    return AttentionFunction.apply(q, k, v, block)


def attention(q, k, v, causal: bool = False, softmax_scale=None):
    """Softmax attention of one device's q against its k/v; differentiable once (a gradient taken
    with ``create_graph=True`` raises if differentiated again).

    Args:
        q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, kv_heads, head_dim); one float
            dtype and device; head_dim >= 1, and at most 256 where the Triton kernels run (CUDA
            float16 / bfloat16 / float32). ``causal`` (a bool) masks key j from query i when j > i
            (positions 0..S-1).
        softmax_scale: multiplies q @ k^T; a Python number (or a 0-d tensor that does not require
            grad), positive and finite in float32; default 1/sqrt(head_dim).
    Returns:
        (out, lse): out like q; lse (batch, heads, seqlen_q) float32 (float64 for float64 input).
    """
    check_qkv(q, k, v, "attention")
    block = dict(softmax_scale=default_scale(q, softmax_scale), causal=check_causal(causal, "attention"))
    return _attention_block(q, k, v, block)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k=None, causal: bool = False, softmax_scale=None):
    """Attention over packed variable-length sequences; differentiable once (see ``attention``).

    Args:
        q: (total_q, heads, head_dim); k, v: (total_k, kv_heads, head_dim); head_dim as in ``attention``.
        cu_seqlens_q: int32 (nseq + 1,) cumulative sequence starts of q, from 0 to total_q;
            cu_seqlens_k likewise for k/v (default: cu_seqlens_q, which needs total_k == total_q).
            Their values are read on the host: on the CPU that costs nothing, on a GPU each call waits
            for the GPU's queue to drain (keep them on the CPU in a loop over layers).
            Tokens of different sequences never attend to each other; ``causal`` (a bool) counts
            positions from 0 within each sequence. ``softmax_scale`` as in ``attention``.
    Returns:
        (out, lse): out (total_q, heads, head_dim) like q; lse (heads, total_q) float32.
    """
    fn = "attention_varlen"
    check_qkv(q, k, v, fn, packed=True)
    causal = check_causal(causal, fn)
    if cu_seqlens_k is None and k.shape[0] != q.shape[0]:
        raise ValueError(f"{fn}: cu_seqlens_k was not given, so cu_seqlens_q would be used for k/v too, but k has "
                         f"{k.shape[0]} tokens and q has {q.shape[0]}: pass cu_seqlens_k")
    cu_k = cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k
    lens_q, lens_k = _check_cu_seqlens(cu_seqlens_q, q, "cu_seqlens_q"), _check_cu_seqlens(cu_k, k, "cu_seqlens_k")
    if len(lens_q) != len(lens_k):
        raise ValueError(f"attention_varlen: cu_seqlens_q has {len(lens_q)} sequences, cu_seqlens_k {len(lens_k)}")
    block = dict(softmax_scale=default_scale(q, softmax_scale), causal=causal,
                 cu_seqlens_q=_cu_on(cu_seqlens_q, q.device), cu_seqlens_k=_cu_on(cu_k, q.device),
                 max_seqlen_q=max(lens_q, default=0), max_seqlen_k=max(lens_k, default=0))
    return _attention_block(q, k, v, block)


def _cu_on(cu: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``cu`` as int32 on ``device``. From the CPU to a GPU without waiting for the GPU's queue (a copy
    from pageable memory would wait): through a pinned buffer of this call's own, so that the caller
    may change ``cu`` before the copy runs (torch's host allocator reuses the buffer only after it)."""
    if cu.device.type == "cpu" and device.type == "cuda":
        staged = torch.empty(cu.shape, dtype=torch.int32, pin_memory=True).copy_(cu)
        return staged.to(device, non_blocking=True)
    return cu.to(device=device, dtype=torch.int32)


def _check_cu_seqlens(cu, t, name):
    """Validate cumulative lengths against the packed tensor ``t``; return the list of lengths."""
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2 or cu.is_floating_point():
        raise ValueError(f"attention_varlen: {name} must be a 1-D integer tensor (nseq + 1,) starting at 0")
    c = [int(x) for x in cu.tolist()]
    if c[0] != 0 or c[-1] != t.shape[0] or any(b < a for a, b in zip(c, c[1:])):
        raise ValueError(f"attention_varlen: {name} must rise from 0 to {t.shape[0]} (the packed length), got {c}")
    return [b - a for a, b in zip(c, c[1:])]


# torch.compile: dynamo sees a block's forward and backward as two opaque custom ops (see the note
# above ``softmax.softmax_rows_op``). Dense blocks pass no cu_seqlens (and max_seqlen 0).
_BLOCK_ARGS = "float softmax_scale, bool causal, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, " \
              "int max_seqlen_k"


def _block(softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> dict:
    """The ops' arguments as the ``block`` dict of ``attention`` / ``attention_varlen``."""
    block = dict(softmax_scale=softmax_scale, causal=causal)
    if cu_seqlens_q is not None:
        block.update(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                     max_seqlen_k=max_seqlen_k)
    return block


@torch.library.custom_op("ringsoftmax::attention_block", mutates_args=(),
                         schema=f"(Tensor q, Tensor k, Tensor v, {_BLOCK_ARGS}) -> (Tensor, Tensor)")
def attention_block_op(q, k, v, *args):
    """(out like q, contiguous; lse (batch, heads, seqlen_q), packed (heads, total_q), float32 or float64)."""
    out, lse = attention_ops(q).attention_fwd(q, k, v, **_block(*args))
    return out.contiguous(), lse.contiguous()


@attention_block_op.register_fake
def _attention_block_fake(q, k, v, softmax_scale, causal, cu_seqlens_q, *_):
    lse_shape = (q.shape[1], q.shape[0]) if cu_seqlens_q is not None else (q.shape[0], q.shape[2], q.shape[1])
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=accum_dtype(q.dtype))


@torch.library.custom_op("ringsoftmax::attention_block_backward", mutates_args=(),
                         schema="(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dout, Tensor? dlse, "
                                f"{_BLOCK_ARGS}) -> (Tensor, Tensor, Tensor)")
def attention_block_backward_op(q, k, v, out, lse, dout, dlse, *args):
    """``attention_block_grads`` as an op: (dq, dk, dv) contiguous. It has no gradient of its own, so a
    second differentiation raises."""
    return tuple(g.contiguous() for g in attention_block_grads(q, k, v, out, lse, dout, dlse, _block(*args)))


@attention_block_backward_op.register_fake
def _attention_block_backward_fake(q, k, v, *_):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_block_setup(ctx, inputs, output):
    ctx.args = inputs[3:]
    ctx.save_for_backward(*inputs[:3], *output)


def _attention_block_grad(ctx, dout, dlse):
    grads = attention_block_backward_op(*ctx.saved_tensors, dout, dlse, *ctx.args)
    return *grads, *(None for _ in ctx.args)


attention_block_op.register_autograd(_attention_block_grad, setup_context=_attention_block_setup)
