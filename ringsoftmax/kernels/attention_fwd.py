"""Attention forward for one (query block, key/value block) pair: returns ``(out, lse)``.

``attention_fwd(q, k, v, ...)`` computes ``out = softmax(q k^T * scale + mask) v`` and
``lse = logsumexp(q k^T * scale + mask)`` (natural log, float32) for one block pair, the unit the
ring merges. Masks come from global token positions: query ``i`` sits at ``q_offset + i*q_stride``
and key ``j`` at ``k_offset + j*k_stride``; with ``causal`` a key is visible iff its position is
<= the query's. Each program takes ``BLOCK_M`` query rows of one head and walks the keys in three
ranges computed from those positions: tiles every row sees (no mask), tiles some rows see (masked)
and tiles no row sees (skipped). A row with no visible key gets ``out = 0`` and ``lse = -inf``.

Layouts: dense ``q (B, Sq, H, D)``, ``k, v (B, Sk, Hkv, D)`` with ``H % Hkv == 0`` (GQA reads the
shared K/V head, never a copy), any strides with unit last stride; or packed variable-length
``q (Tq, H, D)``, ``k, v (Tk, Hkv, D)`` with ``cu_seqlens`` (positions restart at 0 in each
sequence). The helpers ``_key_ranges``, ``_load_rows``, ``_query_tile`` and ``_Problem`` are shared with
``attention_bwd.py``.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from . import attention_config as config
from . import attention_fwd_gluon as gluon_fwd
from .compile_options import COMPILE_OPTIONS
from .hostmath import LOG2E, cdiv, check_scale, next_power_of_2
from .launcher import launch_kernel
from .kept_tensors import no_int32s

LN2 = 0.6931471805599453


# ----------------------------------------------------------------------------- shared jit helpers
@triton.jit
def _load_rows(ptrs, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
               CHECK_ROWS: tl.constexpr):
    """Load a (rows, D_PAD) tile; rows >= n_rows (if CHECK_ROWS) and columns >= HEAD_DIM read 0."""
    if CHECK_ROWS:
        if D_PAD == HEAD_DIM:
            x = tl.load(ptrs, mask=(rows < n_rows)[:, None], other=0.0)
        else:
            x = tl.load(ptrs, mask=(rows < n_rows)[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    else:
        if D_PAD == HEAD_DIM:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
    return x


@triton.jit
def _key_ranges(start_m, Sq, Sk, q_offset, q_stride, k_offset, k_stride,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Key ranges for query rows [start_m, start_m + BLOCK_M): ([0, full_end) unmasked, [full_end, hi) masked).

    ``full_end`` is a multiple of BLOCK_N; keys >= hi are invisible to every row of the tile.
    """
    if CAUSAL:
        last_row = tl.minimum(start_m + BLOCK_M, Sq) - 1
        pos_first = q_offset + start_m * q_stride
        pos_last = q_offset + last_row * q_stride
        # key j is visible to position p iff k_offset + j*k_stride <= p, i.e. j < (p - k_offset)//k_stride + 1
        n_all = tl.minimum(tl.maximum(pos_first - k_offset + k_stride, 0) // k_stride, Sk)
        hi = tl.minimum(tl.maximum(pos_last - k_offset + k_stride, 0) // k_stride, Sk)
    else:
        n_all = Sk
        hi = Sk
    full_end = (n_all // BLOCK_N) * BLOCK_N
    return full_end, hi


@triton.jit
def _seq_bounds(Cu, seq, n_dense, VARLEN: tl.constexpr):
    """(first token, length) of sequence ``seq``: from cu_seqlens if VARLEN, else (0, n_dense)."""
    if VARLEN:
        start = tl.load(Cu + seq)
        n = tl.load(Cu + seq + 1) - start
    else:
        start = seq * 0
        n = n_dense
    return start, n


@triton.jit
def _query_tile(CuQ, CuK, Sq, Sk, H, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr, VARLEN: tl.constexpr):
    """This program's query tile (grid: query tiles x batch*heads); causal: heaviest tiles first.

    Returns (batch or sequence, head, first query token, Sq, first key token, Sk, first row)."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    q_start, Sq = _seq_bounds(CuQ, b, Sq, VARLEN)
    k_start, Sk = _seq_bounds(CuK, b, Sk, VARLEN)
    return b, h, q_start, Sq, k_start, Sk, pid_m * BLOCK_M


# ----------------------------------------------------------------------------- forward kernel
@triton.jit
def _fwd_steps(acc, l_i, m_i, q, K, V, desc_k, desc_v, k_row, k_col, stride_ks, stride_vs, lo, hi, Sk, row_lim,
               k_stride, qk_scale, offs_n, offs_d, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
               TMA: tl.constexpr, WARP_SPEC: tl.constexpr):
    """Online-softmax steps over key tiles [lo, hi); scores in log2 units (scale includes log2 e).

    K/V tiles come through the tensor descriptors ``desc_k``/``desc_v`` when TMA (key j at row
    ``k_row + j``, columns from ``k_col``; rows past the descriptor read 0), else through pointers
    from ``K``/``V``. WARP_SPEC asks Triton to split the loop into
    load and compute warps (Hopper/Blackwell, with TMA). Where MASKED, key j of the tile at start_n
    is visible to row i iff j < Sk - start_n and, if causal, j*k_stride <= row_lim[i] - start_n*k_stride
    (``row_lim[i]`` = position of query i - position of key 0): both folded into one compare per score."""
    k_tile = offs_n[:, None] * stride_ks + offs_d[None, :]
    v_tile = offs_n[:, None] * stride_vs + offs_d[None, :]
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPEC):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        # load the K tile and score it
        if TMA:
            k = desc_k.load([k_row + start_n, k_col])
        else:
            k = _load_rows(K + start_n.to(tl.int64) * stride_ks + k_tile, cols, Sk, offs_d, HEAD_DIM, D_PAD, MASKED)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if MASKED:
            # hide keys past the end and, if causal, keys after the query (one compare per score)
            if CAUSAL:
                lim = tl.minimum(row_lim - start_n * k_stride, (Sk - 1 - start_n) * k_stride)
                visible = (offs_n * k_stride)[None, :] <= lim[:, None]
            else:
                visible = (offs_n < Sk - start_n)[None, :]
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            # rows with nothing visible yet keep m = -inf; subtract 0 for them so p = 0, not NaN
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_sub = m_new
        # (qk_scale > 0, so the row maximum commutes with the scale; one FMA per score)
        p = tl.math.exp2(s * qk_scale - m_sub[:, None])
        # rescale the running sums to the new maximum, then add this tile
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        if TMA:
            v = desc_v.load([k_row + start_n, k_col])
        else:
            v = _load_rows(V + start_n.to(tl.int64) * stride_vs + v_tile, cols, Sk, offs_d, HEAD_DIM, D_PAD, MASKED)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_tile(Q, K, V, Out, Lse, Prev, desc_q, desc_k, desc_v, q_row, q_col, k_row, k_col, b64, h, q_start, start_m,
              stride_qs, stride_ks, stride_vs, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls,
              Sq, Sk, q_offset, q_stride, k_offset, k_stride, qk_scale,
              HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, WARP_SPEC: tl.constexpr,
              RESUME: tl.constexpr):
    """Query rows [start_m, start_m + BLOCK_M) of head ``h`` of batch (or sequence) ``b64``.

    Pointer loads: Q/K/V already point at this (batch, head)'s first row. Descriptor loads (TMA):
    row ``q_row + i`` and columns from ``q_col`` of ``desc_q`` hold query i (``k_row``, ``k_col``
    likewise for keys): 0 for descriptors of this head alone, a (batch, head) offset for
    descriptors over the whole tensor (the persistent kernel)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    # position of each query row minus that of key 0
    row_lim = (q_offset - k_offset + start_m * q_stride) + tl.arange(0, BLOCK_M) * q_stride

    # the query tile stays in registers/shared memory for the whole loop
    if TMA:
        q = desc_q.load([q_row + start_m, q_col])
    else:
        q_tile = tl.arange(0, BLOCK_M)[:, None] * stride_qs + offs_d[None, :]
        q = _load_rows(Q + start_m.to(tl.int64) * stride_qs + q_tile, offs_m, Sq, offs_d, HEAD_DIM, D_PAD, True)
    # keys every row sees (no mask), then keys some rows see (masked); the rest is skipped.
    # Split over two launches (Triton's Hopper warp specialization takes a kernel with one loop):
    # WARP_SPEC runs the unmasked keys only; RESUME runs the masked keys only, continuing from the
    # (out, lse) of the unmasked keys that the first launch left in Prev (float32) and Lse.
    # (One warp-specialized loop over every key with each tile masked measured 2-10% slower than
    # both, causal D=128 4K-32K on an H200 (session 4); persistent, no faster than the plain kernel
    # at 4K and 1-10% slower at 8K-32K (session 7): a compare and a select per score, every tile.)
    full_end, hi = _key_ranges(start_m, Sq, Sk, q_offset, q_stride, k_offset, k_stride, BLOCK_M, BLOCK_N, CAUSAL)
    if RESUME:
        # online-softmax state from (out, lse): m = lse (log2 units), l = 1, acc = out
        row_ok = offs_m < Sq
        prev_lse = tl.load(Lse + b64 * stride_lb + h * stride_lh + offs_m * stride_ls, mask=row_ok,
                           other=float("-inf"))
        m_i = prev_lse * 1.4426950408889634
        l_i = tl.where(prev_lse == float("-inf"), 0.0, 1.0)
        acc = tl.load(Prev + b64 * stride_ob + offs_m.to(tl.int64)[:, None] * stride_os + h * stride_oh
                      + offs_d[None, :], mask=row_ok[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
        acc, l_i, m_i = _fwd_steps(acc, l_i, m_i, q, K, V, desc_k, desc_v, k_row, k_col, stride_ks, stride_vs, 0,
                                   full_end, Sk, row_lim, k_stride, qk_scale, offs_n, offs_d, HEAD_DIM, D_PAD, BLOCK_N,
                                   False, CAUSAL, DOT_PRECISION, TMA, WARP_SPEC)
    if not WARP_SPEC:
        acc, l_i, m_i = _fwd_steps(acc, l_i, m_i, q, K, V, desc_k, desc_v, k_row, k_col, stride_ks, stride_vs,
                                   full_end, hi, Sk, row_lim, k_stride, qk_scale, offs_n, offs_d, HEAD_DIM, D_PAD,
                                   BLOCK_N, True, CAUSAL, DOT_PRECISION, TMA, False)

    # epilogue: normalize; rows that saw no key get out = 0, lse = -inf
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    if WARP_SPEC:
        # through descriptors (scalar offsets): triton 3.6's Hopper warp specialization, splitting
        # the rows over two compute groups, offsets a "start + arange" row vector twice
        desc_o = tl.make_tensor_descriptor(Out + b64 * stride_ob + h * stride_oh, shape=[Sq, HEAD_DIM],
                                           strides=[stride_os, 1], block_shape=[BLOCK_M, D_PAD])
        desc_o.store([start_m, 0], out.to(Out.dtype.element_ty))
        desc_lse = tl.make_tensor_descriptor(Lse + b64 * stride_lb + h * stride_lh, shape=[Sq], strides=[1],
                                             block_shape=[BLOCK_M])
        desc_lse.store([start_m], lse)
    else:
        row_ok = offs_m < Sq
        o_ptrs = (Out + b64 * stride_ob + (q_start + offs_m).to(tl.int64)[:, None] * stride_os + h * stride_oh
                  + offs_d[None, :])
        if D_PAD == HEAD_DIM:
            tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None])
        else:
            tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & (offs_d < HEAD_DIM)[None, :])
        tl.store(Lse + b64 * stride_lb + h * stride_lh + (q_start + offs_m) * stride_ls, lse, mask=row_ok)


@triton.jit(do_not_specialize=["Sq", "Sk", "q_offset", "k_offset"])
def _attn_fwd_kernel(Q, K, V, Out, Lse, Prev, CuQ, CuK,
                     stride_qb, stride_qs, stride_qh,
                     stride_kb, stride_ks, stride_kh,
                     stride_vb, stride_vs, stride_vh,
                     stride_ob, stride_os, stride_oh,
                     stride_lb, stride_lh, stride_ls,
                     Sq, Sk, BATCH, H, GROUP, q_offset, q_stride, k_offset, k_stride, qk_scale,
                     HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
                     TMA: tl.constexpr = False, WARP_SPEC: tl.constexpr = False,
                     RESUME: tl.constexpr = False, PERSISTENT: tl.constexpr = False):
    """One query tile per program (grid: query tiles x batch*heads), or, if PERSISTENT (dense,
    warp-specialized), a grid of about one program per multiprocessor, each walking the tiles
    p, p + P, ... in the plain grid's order; see ``attention_fwd`` for the layouts."""
    if PERSISTENT:
        # descriptors over the whole tensors, built once: rows are (batch, token), the heads of a
        # token side by side in columns (``persistent_ready``: batch stride = tokens * token stride).
        # Rows of a partial query tile past Sq read the next batch's tokens: their results are not
        # stored (the out/lse stores clip at Sq), and every key tile lies inside its batch.
        desc_q = tl.make_tensor_descriptor(Q, shape=[BATCH * Sq, (H - 1) * stride_qh + HEAD_DIM],
                                           strides=[stride_qs, 1], block_shape=[BLOCK_M, D_PAD])
        k_cols = (H // GROUP - 1) * stride_kh + HEAD_DIM
        desc_k = tl.make_tensor_descriptor(K, shape=[BATCH * Sk, k_cols], strides=[stride_ks, 1],
                                           block_shape=[BLOCK_N, D_PAD])
        k_cols = (H // GROUP - 1) * stride_vh + HEAD_DIM
        desc_v = tl.make_tensor_descriptor(V, shape=[BATCH * Sk, k_cols], strides=[stride_vs, 1],
                                           block_shape=[BLOCK_N, D_PAD])
        tiles_m = tl.cdiv(Sq, BLOCK_M)
        for tile in tl.range(tl.program_id(0), tiles_m * BATCH * H, tl.num_programs(0)):
            pid_m = tile % tiles_m
            if CAUSAL:   # heaviest tiles first, as in the plain grid
                pid_m = tiles_m - 1 - pid_m
            b = tile // tiles_m // H
            h = tile // tiles_m % H
            _fwd_tile(Q, K, V, Out, Lse, Prev, desc_q, desc_k, desc_v, b * Sq, h * stride_qh, b * Sk,
                      (h // GROUP) * stride_kh, b.to(tl.int64), h, 0, pid_m * BLOCK_M,
                      stride_qs, stride_ks, stride_vs, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                      stride_ls, Sq, Sk, q_offset, q_stride, k_offset, k_stride, qk_scale,
                      HEAD_DIM, D_PAD, BLOCK_M, BLOCK_N, CAUSAL, DOT_PRECISION, True, WARP_SPEC, False)
    else:
        b, h, q_start, Sq, k_start, Sk, start_m = _query_tile(CuQ, CuK, Sq, Sk, H, BLOCK_M, CAUSAL, VARLEN)
        if VARLEN:
            # the grid covers the longest sequence; shorter ones have no rows here
            if start_m >= Sq:
                return
        # base pointers of this (batch, head); K/V of the group's shared head
        b64 = b.to(tl.int64)
        Q += b64 * stride_qb + q_start.to(tl.int64) * stride_qs + h * stride_qh
        K += b64 * stride_kb + k_start.to(tl.int64) * stride_ks + (h // GROUP) * stride_kh
        V += b64 * stride_vb + k_start.to(tl.int64) * stride_vs + (h // GROUP) * stride_vh
        if TMA:
            # tensor descriptors of this head's (rows, HEAD_DIM) slices: TMA reads 0 past the last row
            desc_q = tl.make_tensor_descriptor(Q, shape=[Sq, HEAD_DIM], strides=[stride_qs, 1],
                                               block_shape=[BLOCK_M, D_PAD])
            desc_k = tl.make_tensor_descriptor(K, shape=[Sk, HEAD_DIM], strides=[stride_ks, 1],
                                               block_shape=[BLOCK_N, D_PAD])
            desc_v = tl.make_tensor_descriptor(V, shape=[Sk, HEAD_DIM], strides=[stride_vs, 1],
                                               block_shape=[BLOCK_N, D_PAD])
        else:
            desc_q = Q
            desc_k = K
            desc_v = V
        _fwd_tile(Q, K, V, Out, Lse, Prev, desc_q, desc_k, desc_v, 0, 0, 0, 0, b64, h, q_start, start_m,
                  stride_qs, stride_ks, stride_vs, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ls,
                  Sq, Sk, q_offset, q_stride, k_offset, k_stride, qk_scale,
                  HEAD_DIM, D_PAD, BLOCK_M, BLOCK_N, CAUSAL, DOT_PRECISION, TMA, WARP_SPEC, RESUME)


# ----------------------------------------------------------------------------- host side
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class _Problem:
    """Shapes of one attention call, dense or packed varlen, in the form the kernels take."""
    batch: int        # B, or the number of sequences
    max_q: int        # Sq, or the longest query sequence
    max_k: int
    heads: int
    kv_heads: int
    head_dim: int
    d_pad: int
    varlen: bool
    cu_q: torch.Tensor | None
    cu_k: torch.Tensor | None

    def strides(self, x: torch.Tensor) -> tuple[int, int, int]:
        """(batch, token, head) strides of a q/k/v-shaped tensor; batch stride 0 when packed."""
        if self.varlen:
            return 0, x.stride(0), x.stride(1)
        return x.stride(0), x.stride(1), x.stride(2)

    def cu_args(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.varlen:
            return self.cu_q, self.cu_k
        dummy = no_int32s(device)   # (the kernels never read it when not packed)
        return dummy, dummy


def unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself if its last dim is contiguous, else a contiguous copy (inputs only)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def check_problem(q, k, v, q_stride, k_stride, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                  max_seqlen_k) -> _Problem:
    """Validate q/k/v (dense or varlen) and describe the problem; raises on anything unsupported."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in _DTYPES:
            raise TypeError(f"{name}.dtype is {x.dtype}; the Triton attention kernels take float16, bfloat16 "
                            f"or float32 (use ringsoftmax.reference for float64)")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device}, q on {q.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if int(q_stride) < 1 or int(k_stride) < 1:
        raise ValueError(f"q_stride and k_stride must be >= 1, got {q_stride}, {k_stride}")
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    want_dim = 3 if varlen else 4
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != want_dim:
            layout = "(total_tokens, heads, head_dim) with cu_seqlens" if varlen else "(batch, seqlen, heads, head_dim)"
            raise ValueError(f"{name} must be {layout}, got shape {tuple(x.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    heads, kv_heads, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    if k.shape[-1] != head_dim:
        raise ValueError(f"q head_dim {head_dim} != k head_dim {k.shape[-1]}")
    if head_dim > 256 or head_dim < 1:
        raise ValueError(f"attention kernels (Triton): head_dim must be in 1..256, got {head_dim} (q of shape "
                         f"{tuple(q.shape)}); the plain-torch path (ringsoftmax.reference: CPU tensors or float64) "
                         "has no upper limit")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"q heads ({heads}) must be a multiple of k/v heads ({kv_heads})")
    d_pad = max(16, next_power_of_2(head_dim))
    if not varlen:
        if q.shape[0] != k.shape[0]:
            raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}")
        return _Problem(q.shape[0], q.shape[1], k.shape[1], heads, kv_heads, head_dim, d_pad, False, None, None)
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("varlen needs both cu_seqlens_q and cu_seqlens_k")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2 or cu.device != q.device:
            raise ValueError(f"{name} must be int32 of shape (nseq + 1,) on {q.device}, got "
                             f"{cu.dtype} {tuple(cu.shape)} on {cu.device}")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError("cu_seqlens_q and cu_seqlens_k hold different numbers of sequences")
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    if max_seqlen_k is None:
        max_seqlen_k = int((cu_seqlens_k[1:] - cu_seqlens_k[:-1]).max())
    return _Problem(cu_seqlens_q.numel() - 1, int(max_seqlen_q), int(max_seqlen_k), heads, kv_heads, head_dim,
                    d_pad, True, cu_seqlens_q, cu_seqlens_k)


def dot_precision(dtype: torch.dtype) -> str:
    """float32 inputs use exact fp32 products; 16-bit inputs ignore the setting."""
    return "ieee" if dtype == torch.float32 else "tf32"


def tma_ready(prob: _Problem, *tensors: torch.Tensor) -> bool:
    """Whether tensor descriptors can address these q/k/v-shaped tensors: a power-of-two head dim,
    16-byte aligned base addresses and 16-byte multiples for every stride but the last."""
    if prob.d_pad != prob.head_dim:
        return False
    for x in tensors:
        size = x.element_size()
        if x.data_ptr() % 16 or any((st * size) % 16 for st in x.stride()[:-1]):
            return False
    return True


def _scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


@contextlib.contextmanager
def descriptor_scratch():
    """On-device tensor descriptors live in a scratch buffer that Triton asks for at launch: use
    torch's allocator for it during this block, unless the caller has set an allocator."""
    try:
        from triton.runtime import _allocation
        var, null = _allocation._allocator, _allocation.NullAllocator
    except (ImportError, AttributeError):   # older layout: set it for good
        triton.set_allocator(_scratch)
        yield
        return
    if not isinstance(var.get(), null):
        yield
        return
    token = var.set(_scratch)
    try:
        yield
    finally:
        var.reset(token)


_FALLBACK_CHOICE: dict[tuple, config.Tile] = {}


def launch(kernel, grid, args: tuple, kwargs: dict, tile: config.Tile, key: tuple,
           fallback: tuple = config.FALLBACK) -> None:
    """Launch ``kernel`` with ``tile``; if it needs more shared memory than the device has, try
    ``fallback`` in order and remember the first that fits for ``key``."""
    first = _FALLBACK_CHOICE.get(key + (tile,), tile)
    for t in (first,) + tuple(f for f in fallback if f != first):
        try:
            launch_kernel(kernel, grid(t), *args, **kwargs, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
                          num_warps=t.num_warps, num_stages=t.num_stages, **COMPILE_OPTIONS)
        except OutOfResources:
            continue
        _FALLBACK_CHOICE[key + (tile,)] = t
        return
    raise RuntimeError(f"no attention tile fits the shared memory of {args[0].device} for {key}")


def attention_fwd(q, k, v, *, softmax_scale, causal=False, q_offset=0, q_stride=1, k_offset=0, k_stride=1,
                  out_dtype=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """Attention of one (query block, key/value block) pair, masked by global positions.

    Args:
        q: (B, Sq, H, D), or (Tq, H, D) packed with ``cu_seqlens_q``; float16/bfloat16/float32.
        k, v: (B, Sk, Hkv, D), or (Tk, Hkv, D) packed; same dtype; ``H % Hkv == 0``.
        softmax_scale: multiplies the scores q.k.
        causal: key j visible to query i iff ``k_offset + j*k_stride <= q_offset + i*q_stride``.
        q_offset, q_stride, k_offset, k_stride: global positions of the rows (within each sequence
            when packed; positions restart at 0 per sequence).
        out_dtype: dtype of ``out`` (default q.dtype; the ring asks for float32).
        cu_seqlens_q, cu_seqlens_k: int32 (nseq + 1,) cumulative lengths (varlen); tokens of
            different sequences never attend to each other.
        max_seqlen_q, max_seqlen_k: longest sequences (computed, with a sync, when omitted).

    Returns:
        out: new contiguous tensor shaped like q, in ``out_dtype``; 0 for rows with no visible key.
        lse: float32 natural-log logsumexp of the scaled scores, (B, H, Sq) or (H, Tq); -inf for
            rows with no visible key.
    """
    q, k, v = unit_last_stride(q), unit_last_stride(k), unit_last_stride(v)
    prob = check_problem(q, k, v, q_stride, k_stride, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k)
    out_dtype = q.dtype if out_dtype is None else out_dtype
    if out_dtype not in _DTYPES:
        raise TypeError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    out = torch.empty(q.shape, dtype=out_dtype, device=q.device)
    if prob.varlen:
        lse = torch.empty((prob.heads, q.shape[0]), dtype=torch.float32, device=q.device)
        lse_strides = (0, lse.stride(0), lse.stride(1))
    else:
        lse = torch.empty((prob.batch, prob.heads, prob.max_q), dtype=torch.float32, device=q.device)
        lse_strides = lse.stride()
    if q.numel() == 0 or prob.batch == 0 or prob.max_q == 0:
        return out, lse
    if (config.fwd_gluon(q.device, prob.d_pad, q.dtype, bool(causal), prob.max_k)
            and gluon_ready(prob, q, k, v, causal, q_stride, k_stride, out_dtype)):
        # Hopper, 16-bit dense blocks: the hand-scheduled Gluon kernel, masked tiles included (one launch)
        with descriptor_scratch():
            gluon_fwd.launch(q, k, v, out, lse, qk_scale=check_scale(softmax_scale) * LOG2E, causal=bool(causal),
                             delta=int(q_offset) - int(k_offset))
        return out, lse
    tile = config.tile_for("fwd", q.device, prob.d_pad, q.dtype, bool(causal))
    cu_q, cu_k = prob.cu_args(q.device)
    args = (q, k, v, out, lse, out, cu_q, cu_k, *prob.strides(q), *prob.strides(k), *prob.strides(v),
            *prob.strides(out), *lse_strides, prob.max_q, prob.max_k, prob.batch, prob.heads,
            prob.heads // prob.kv_heads,
            int(q_offset), int(q_stride), int(k_offset), int(k_stride), check_scale(softmax_scale) * LOG2E)
    # loads through tensor descriptors (TMA) where the table says so and the inputs allow it; the
    # warp-specialized kernel (always TMA) for the unmasked keys where the table says so, followed,
    # if any tile needs a mask, by a launch for the masked keys that resumes from its (out, lse);
    # the warp-specialized kernel runs persistent (one program per multiprocessor walking the
    # query tiles) where the table says so for this many keys and the strides allow it
    descriptors = tma_ready(prob, q, k, v)
    persistent = (descriptors and config.fwd_persistent(q.device, prob.d_pad, q.dtype, bool(causal), prob.max_k)
                  and persistent_ready(prob, q, k, v))
    warp_spec = (descriptors and warp_spec_ready(prob)
                 and (persistent or config.fwd_warp_spec(q.device, prob.d_pad, q.dtype, bool(causal))))
    tma = descriptors and config.fwd_tma(q.device, prob.d_pad, q.dtype, bool(causal))
    kwargs = dict(HEAD_DIM=prob.head_dim, D_PAD=prob.d_pad, CAUSAL=bool(causal), VARLEN=prob.varlen,
                  DOT_PRECISION=dot_precision(q.dtype))
    grid = lambda t: (cdiv(prob.max_q, t.block_m), prob.batch * prob.heads)  # noqa: E731
    key = ("fwd", q.device.type, prob.d_pad, q.dtype, bool(causal))
    with descriptor_scratch() if descriptors else contextlib.nullcontext():
        if warp_spec:
            ws_tile = config.tile_for("fwd_ws", q.device, prob.d_pad, q.dtype, bool(causal))
            masked = bool(prob.max_k % ws_tile.block_n) or not every_key_visible(prob, causal, q_offset, k_offset,
                                                                                 k_stride)
            warp_spec = not masked or prob.max_k >= config.fwd_resume_min_keys(q.device)
        if warp_spec:
            # the unmasked part's (out, lse), in float32 when the masked part continues from it
            part = out if (out_dtype == torch.float32 or not masked) else torch.empty(
                q.shape, dtype=torch.float32, device=q.device)
            # persistent if the table says so and it fits the shared memory (the float32 output's
            # store buffer at D=128 does not), else one program per query tile
            for pers in (True, False) if persistent else (False,):
                if launch_split(_attn_fwd_kernel, grid, _with_outputs(args, part, part),
                                dict(kwargs, TMA=True, PERSISTENT=pers), ws_tile,
                                _with_outputs(args, out, part) if masked else None,
                                dict(kwargs, TMA=True, RESUME=True), tile, key + (pers, part.dtype),
                                ws_grid=_persistent_grid(grid, q.device) if pers else None):
                    return out, lse
        launch(_attn_fwd_kernel, grid, args, dict(kwargs, TMA=tma), tile, key + (tma,))
    return out, lse


def launch_split(kernel, grid, args: tuple, kwargs: dict, ws_tile: config.Tile, rest_args, rest_kwargs: dict,
                 tile: config.Tile, key: tuple, ws_grid=None) -> bool:
    """Run ``kernel`` with WARP_SPEC=True (its unmasked tiles, in ``ws_tile``, on ``ws_grid``, default
    ``grid``), then, unless ``rest_args`` is None, once more on ``rest_args`` with ``rest_kwargs``
    (the tiles that need a mask) in the same block sizes, so that both launches agree where masks
    start, and ``tile``'s warps and stages. False, with nothing run, if ``ws_tile`` does not fit."""
    if key + (ws_tile,) in _MISFITS:
        return False
    try:  # its one tile only: other tiles are not validated with warp specialization
        launch(kernel, ws_grid or grid, args, dict(kwargs, WARP_SPEC=True), ws_tile, key + ("ws",), fallback=())
    except RuntimeError:   # does not fit this device's shared memory: remember it
        _MISFITS.add(key + (ws_tile,))
        return False
    if rest_args is not None:
        rest = config.Tile(ws_tile.block_m, ws_tile.block_n, tile.num_warps, tile.num_stages)
        launch(kernel, grid, rest_args, rest_kwargs, rest, key + ("rest",), fallback=())
    return True


_MISFITS: set[tuple] = set()


def _persistent_grid(grid, device: torch.device):
    """``grid`` (query tiles x batch*heads) folded into one program per multiprocessor, or fewer."""
    programs = multiprocessors(device)
    return lambda t: (min(programs, grid(t)[0] * grid(t)[1]),)


def _with_outputs(args: tuple, out: torch.Tensor, prev: torch.Tensor) -> tuple:
    """The forward kernel's arguments with ``Out`` and ``Prev`` replaced (same shape and strides)."""
    return args[:3] + (out, args[4], prev) + args[6:]


def gluon_ready(prob: _Problem, q, k, v, causal: bool, q_stride: int, k_stride: int, out_dtype) -> bool:
    """Whether the Gluon forward (``attention_fwd_gluon``) computes this block pair: a Hopper GPU,
    dense 16-bit inputs, the output in their dtype or float32, head dim 64 or 128, TMA-ready
    strides, and unit position strides if causal (any offsets)."""
    return (q.is_cuda and gluon_fwd.gluon is not None and config.cuda_major(q.device) == 9 and not prob.varlen
            and gluon_fwd.supports(q, prob.head_dim, bool(causal), q_stride, k_stride, out_dtype)
            and tma_ready(prob, q, k, v))


def warp_spec_ready(prob: _Problem) -> bool:
    """Whether the warp-specialized forward can run: dense inputs, and each (batch, head) row of the
    fresh contiguous lse starts 16-byte aligned (``Sq % 4 == 0``), as its descriptor store needs."""
    return not prob.varlen and prob.max_q % 4 == 0


def persistent_ready(prob: _Problem, *tensors: torch.Tensor) -> bool:
    """Whether the persistent kernel's descriptors over whole q/k/v-shaped tensors can address them:
    rows of (batch, token) at one stride (batch stride = tokens * token stride, or one batch), each
    token's heads side by side within its row (as in a contiguous (B, S, H, D) tensor)."""
    if prob.varlen:
        return False
    for x in tensors:
        batch, tokens, heads, dim = x.shape
        if batch > 1 and x.stride(0) != tokens * x.stride(1):
            return False
        if (heads - 1) * x.stride(2) + dim > x.stride(1) or x.stride(2) < 0:
            return False
    return True


@functools.lru_cache(maxsize=None)
def _multiprocessors_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (the persistent grid's size); 4 off CUDA (the
    interpreter), so that tests walk several tiles per program."""
    if device.type != "cuda":
        return 4
    return _multiprocessors_of(torch.cuda.current_device() if device.index is None else device.index)


def every_key_visible(prob: _Problem, causal: bool, q_offset: int, k_offset: int, k_stride: int) -> bool:
    """Whether every query row sees every key: not causal, or the last key at or before the first
    query. (A block pair has no masked tile if also its tiles divide the rows they walk.)"""
    return not causal or int(k_offset) + (prob.max_k - 1) * int(k_stride) <= int(q_offset)
