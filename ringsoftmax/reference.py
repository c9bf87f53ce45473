"""Plain-torch versions of every kernel: the CPU path and the tests' oracle.

Each function has the signature and contract of the Triton launcher of the same name in
``ringsoftmax/kernels/`` (so ``backend.py`` can pick either module), and also runs in float64.

Softmax functions work on rows: ``x`` is (M, N) and the reduction is over the last dim. Attention
functions work on one (query block, key block) pair: ``q`` (B, Sq, H, D), ``k``/``v`` (B, Sk, Hkv, D)
with ``H % Hkv == 0``; query ``i`` sits at global position ``q_offset + i * q_stride`` and key ``j``
at ``k_offset + j * k_stride``; with ``causal`` a key is visible to a query iff its position is not
greater. Attention runs in (query chunk, key chunk) tiles merged with ``merge.merge_``, so memory
stays O(chunk^2), never O(Sq * Sk).
"""
from __future__ import annotations

import torch

from .merge import NEG_INF, accum_dtype, merge_, stats_to_lse

CHUNK = 512


def _finite_or_zero(lse: torch.Tensor) -> torch.Tensor:
    """``lse`` with -inf replaced by 0, so ``exp(x - lse)`` is 0 (not NaN) on empty rows."""
    return torch.where(lse == NEG_INF, torch.zeros_like(lse), lse)


# ----------------------------------------------------------------------------------------------
# softmax over the last dim of (M, N) rows
# ----------------------------------------------------------------------------------------------

def row_stats(x: torch.Tensor):
    """(M, N) -> (m, s), each (M,) float32 (float64 for float64 input): the row max and
    ``sum(exp(x - m))``. A row with no finite entry (all -inf, or N == 0) gives (-inf, 0).

    Rows are normalized from (m, s), not from a rounded lse: ``exp(x - m) / s`` keeps float32
    precision at any magnitude, while ``exp(x - lse)`` with |lse| ~ 1e4 loses four digits.
    """
    acc = accum_dtype(x.dtype)
    if x.shape[-1] == 0:
        return (torch.full(x.shape[:-1], NEG_INF, dtype=acc, device=x.device),
                torch.zeros(x.shape[:-1], dtype=acc, device=x.device))
    xa = x.to(acc)
    m = xa.amax(dim=-1)
    return m, torch.exp(xa - _finite_or_zero(m).unsqueeze(-1)).sum(-1)


def normalize(x: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(M, N), (M,), (M,) -> y = exp(x - m) / s in x.dtype; rows with s = 0 give 0."""
    acc = accum_dtype(x.dtype, m.dtype)
    s = s.to(acc)
    e = torch.exp(x.to(acc) - _finite_or_zero(m.to(acc)).unsqueeze(-1))
    return (e / torch.where(s == 0, torch.ones_like(s), s).unsqueeze(-1)).to(x.dtype)


def softmax_fwd(x: torch.Tensor, with_lse: bool = True):
    """(M, N) -> (y (M, N) in x.dtype, lse (M,) float32, or None without ``with_lse``): softmax of
    each row and its log-sum-exp."""
    m, s = row_stats(x)
    return normalize(x, m, s), stats_to_lse(m, s) if with_lse else None


def row_dot(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """(M, N), (M, N) -> (M,) sum(y * dy) per row, in float32 (float64 for float64 input)."""
    acc = accum_dtype(y.dtype, dy.dtype)
    return (y.to(acc) * dy.to(acc)).sum(-1)


def softmax_bwd(y: torch.Tensor, dy: torch.Tensor, delta: torch.Tensor | None = None) -> torch.Tensor:
    """dx = y * (dy - delta), delta = rowsum(y * dy) unless given; (M, N) in dy.dtype."""
    acc = accum_dtype(y.dtype, dy.dtype)
    if delta is None:
        delta = row_dot(y, dy)
    return (y.to(acc) * (dy.to(acc) - delta.to(acc).unsqueeze(-1))).to(dy.dtype)


# ----------------------------------------------------------------------------------------------
# attention over one (query block, key block) pair
# ----------------------------------------------------------------------------------------------

def _positions(n: int, offset: int, stride: int, device) -> torch.Tensor:
    return offset + stride * torch.arange(n, device=device)


def _tiles(sq, sk, causal, qpos, kpos, chunk):
    """Yield (query slice, key slice, mask or None) for every tile with at least one visible key.

    ``mask`` is True where a key is hidden; None when the whole tile is visible.
    """
    for qs in range(0, sq, chunk):
        qsl = slice(qs, min(qs + chunk, sq))
        for ks in range(0, sk, chunk):
            ksl = slice(ks, min(ks + chunk, sk))
            if not causal:
                yield qsl, ksl, None
                continue
            if kpos[ksl.start] > qpos[qsl.stop - 1]:  # positions increase: the whole tile is hidden
                continue
            hidden = kpos[ksl].unsqueeze(0) > qpos[qsl].unsqueeze(1)
            yield qsl, ksl, (hidden if bool(hidden.any()) else None)


def _scores(qc, kc, scale, mask):
    """(B, cq, Hkv, G, D) x (B, ck, Hkv, D) -> (B, Hkv, G, cq, ck) scaled scores, hidden = -inf."""
    s = torch.einsum("bqhgd,bkhd->bhgqk", qc, kc) * scale
    if mask is not None:
        s = s.masked_fill(mask, NEG_INF)
    return s


def _grouped(t: torch.Tensor, hkv: int) -> torch.Tensor:
    """(B, S, H, D) -> (B, S, Hkv, H // Hkv, D): query heads grouped by the K/V head they read."""
    b, s, h, d = t.shape
    return t.reshape(b, s, hkv, h // hkv, d)


def attention_fwd(q, k, v, *, softmax_scale, causal=False, q_offset=0, q_stride=1, k_offset=0, k_stride=1,
                  out_dtype=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                  chunk=CHUNK):
    """Attention of one block pair: returns (out (B, Sq, H, D) in out_dtype or q.dtype, lse (B, H, Sq) float32).

    With ``cu_seqlens_q`` / ``cu_seqlens_k`` (int (nseq + 1,)), q is packed (Tq, H, D), k/v (Tk, Hkv, D),
    positions restart at 0 in every sequence, and the result is (out (Tq, H, D), lse (H, Tq)).
    """
    if cu_seqlens_q is not None:
        return _varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale=softmax_scale, causal=causal,
                           q_offset=q_offset, q_stride=q_stride, k_offset=k_offset, k_stride=k_stride,
                           out_dtype=out_dtype, chunk=chunk)
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    acc = accum_dtype(q.dtype)
    out = torch.zeros(b, sq, h, d, dtype=acc, device=q.device)
    lse = torch.full((b, h, sq), NEG_INF, dtype=acc, device=q.device)
    qpos = _positions(sq, q_offset, q_stride, q.device)
    kpos = _positions(sk, k_offset, k_stride, q.device)
    for qsl, ksl, mask in _tiles(sq, sk, causal, qpos, kpos, chunk):
        qc = _grouped(q[:, qsl].to(acc), hkv)
        s = _scores(qc, k[:, ksl].to(acc), softmax_scale, mask)
        blk_lse = torch.logsumexp(s, dim=-1)                                 # (B, Hkv, G, cq)
        p = torch.exp(s - _finite_or_zero(blk_lse).unsqueeze(-1))
        cq = qc.shape[1]  # explicit sizes, not -1: a reshape can't infer a size when batch or heads is 0
        blk_out = torch.einsum("bhgqk,bkhd->bqhgd", p, v[:, ksl].to(acc)).reshape(b, cq, h, d)
        merge_(out[:, qsl], lse[:, :, qsl], blk_out, blk_lse.reshape(b, h, cq))
    return out.to(out_dtype or q.dtype), lse


def attention_delta(out: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
    """rowsum(dout * out) over head_dim: (B, S, H, D) -> (B, H, S) (packed (T, H, D) -> (H, T)), float32."""
    acc = accum_dtype(out.dtype, dout.dtype)
    return (out.to(acc) * dout.to(acc)).sum(-1).transpose(-1, -2).contiguous()


def attention_bwd(q, k, v, out, dout, lse, delta, *, softmax_scale, causal=False, q_offset=0, q_stride=1,
                  k_offset=0, k_stride=1, dq=None, dk=None, dv=None, cu_seqlens_q=None, cu_seqlens_k=None,
                  max_seqlen_q=None, max_seqlen_k=None, grad_dtype=None, chunk=CHUNK):
    """Gradients of one block pair, recomputing P from q, k and the given lse.

    ``delta`` (B, H, Sq) is rowsum(dout * out) (minus the gradient of lse, if any). dq/dk/dv, when
    given, are float32 (or float64) tensors shaped like q/k/v that this adds into; otherwise zeros
    are allocated, and the gradients they get are returned in ``grad_dtype`` if given (computed in
    float32/float64, rounded once). Returns (dq, dk, dv); dk/dv at the K/V head count.
    """
    if grad_dtype is not None:
        new = [buf is None for buf in (dq, dk, dv)]
        grads = attention_bwd(q, k, v, out, dout, lse, delta, softmax_scale=softmax_scale, causal=causal,
                              q_offset=q_offset, q_stride=q_stride, k_offset=k_offset, k_stride=k_stride, dq=dq,
                              dk=dk, dv=dv, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, chunk=chunk)
        return tuple(g.to(grad_dtype) if fresh else g for g, fresh in zip(grads, new))
    acc = accum_dtype(q.dtype, lse.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device) if dq is None else dq
    dk = torch.zeros(k.shape, dtype=acc, device=k.device) if dk is None else dk
    dv = torch.zeros(v.shape, dtype=acc, device=v.device) if dv is None else dv
    if cu_seqlens_q is not None:
        for qsl, ksl in _sequences(cu_seqlens_q, cu_seqlens_k):
            attention_bwd(q[qsl][None], k[ksl][None], v[ksl][None], None, dout[qsl][None], lse[:, qsl][None],
                          delta[:, qsl][None], softmax_scale=softmax_scale, causal=causal, q_offset=q_offset,
                          q_stride=q_stride, k_offset=k_offset, k_stride=k_stride,
                          dq=dq[qsl][None], dk=dk[ksl][None], dv=dv[ksl][None], chunk=chunk)
        return dq, dk, dv
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    qpos = _positions(sq, q_offset, q_stride, q.device)
    kpos = _positions(sk, k_offset, k_stride, q.device)
    lse_g = _finite_or_zero(lse.to(acc)).reshape(b, hkv, h // hkv, sq)
    delta_g = delta.to(acc).reshape(b, hkv, h // hkv, sq)
    for qsl, ksl, mask in _tiles(sq, sk, causal, qpos, kpos, chunk):
        qc, doc = _grouped(q[:, qsl].to(acc), hkv), _grouped(dout[:, qsl].to(acc), hkv)
        kc, vc = k[:, ksl].to(acc), v[:, ksl].to(acc)
        p = torch.exp(_scores(qc, kc, softmax_scale, mask) - lse_g[..., qsl].unsqueeze(-1))  # hidden: exp(-inf) = 0
        dv[:, ksl] += torch.einsum("bhgqk,bqhgd->bkhd", p, doc)
        ds = p * (torch.einsum("bqhgd,bkhd->bhgqk", doc, vc) - delta_g[..., qsl].unsqueeze(-1))
        dq[:, qsl] += (torch.einsum("bhgqk,bkhd->bqhgd", ds, kc) * softmax_scale).reshape(b, qc.shape[1], h, d)
        dk[:, ksl] += torch.einsum("bhgqk,bqhgd->bkhd", ds, qc) * softmax_scale
    return dq, dk, dv


def _sequences(cu_seqlens_q, cu_seqlens_k):
    """Yield (query slice, key slice) of each packed sequence."""
    cq = [int(c) for c in cu_seqlens_q.tolist()]
    ck = [int(c) for c in (cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k).tolist()]
    for i in range(len(cq) - 1):
        yield slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])


def _varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, *, out_dtype, **kw):
    """Packed sequences, one dense call each: (out (Tq, H, D), lse (H, Tq))."""
    out = torch.empty(q.shape, dtype=out_dtype or q.dtype, device=q.device)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=accum_dtype(q.dtype), device=q.device)
    for qsl, ksl in _sequences(cu_seqlens_q, cu_seqlens_k):
        o, l = attention_fwd(q[qsl][None], k[ksl][None], v[ksl][None], out_dtype=out_dtype, **kw)
        out[qsl], lse[:, qsl] = o[0], l[0]
    return out, lse
