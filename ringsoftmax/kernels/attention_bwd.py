"""Attention backward for one (query block, key/value block) pair: dQ, dK, dV from the saved lse.

``attention_bwd`` recomputes ``P = exp(q k^T * scale - lse)`` tile by tile from the given ``lse``
(natural log, float32: for a ring, the lse of the whole row after merging) and
``delta = rowsum(dout * out)`` (``attention_delta``; a caller that also has a gradient for lse
passes ``delta - dlse``), then ``dS = P * (dP - delta)``. Two kernels:

- ``_attn_bwd_dkdv_kernel``: one program per ``BLOCK_N`` keys of one K/V head; loops over the query
  heads of its GQA group and their query tiles, so dK, dV (summed over the group) stay in registers.
  In the atomic mode (``attention_config.dq_by_atomics``) it also adds dQ = dS K by float32 atomics
  (5 matmuls per tile pair in all) and the second kernel is not launched.
- ``_attn_bwd_dq_kernel``: one program per ``BLOCK_M`` queries of one head; loops over key tiles,
  recomputing QK^T and dO V^T (7 matmuls per tile pair in all, no atomics, deterministic).

Both skip tiles no query sees and mask only tiles that straddle the causal boundary (positions as
in ``attention_fwd``). On Hopper (``attention_config.bwd_warp_spec``) a kernel can run instead with
WARP_SPEC: every visible tile in one loop that Triton splits into a TMA-load warp and two compute
groups, loads through tensor descriptors (rows past the end read 0 and add 0), every tile masked
(a branch in the loop would turn the splitting off), at head dim 128. The warp-specialized dK/dV
kernel never adds into the caller's buffers itself: in triton 3.6 that raced (NaN in repeated ring
replays); it writes fresh ones, added afterwards, and still raced (about 1 in 1000 calls), so it
runs only when asked for. On Hopper dK/dV of 16-bit dense blocks at head dim 64 or 128 come from a
Gluon kernel instead (``attention_bwd_gluon``, ``attention_config.dkdv_gluon``), warp-specialized by
hand with its own mbarriers, adding into the caller's buffers in its epilogue.
Gradients are float32 and are added into caller-given buffers, which may be strided views (the
ring accumulates dK/dV as they travel).
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from . import attention_bwd_gluon as gluon_bwd
from . import attention_config as config
from .attention_fwd import (LOG2E, _key_ranges, _load_rows, _query_tile, _seq_bounds, check_problem, check_scale,
                            descriptor_scratch, dot_precision, launch, launch_split, tma_ready, unit_last_stride)
from .compile_options import COMPILE_OPTIONS
from .hostmath import cdiv, next_power_of_2
from .launcher import launch_kernel


# ----------------------------------------------------------------------------- delta = rowsum(dout * out)
@triton.jit(do_not_specialize=["S"])
def _delta_kernel(O, DO, Delta, stride_ob, stride_os, stride_oh, stride_db, stride_ds, stride_dh,
                  stride_eb, stride_eh, stride_es, S, H,
                  HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_S: tl.constexpr):
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    rows = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D_PAD)
    mask = (rows < S)[:, None] & (offs_d < HEAD_DIM)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    o = tl.load(O + b * stride_ob + r64 * stride_os + h * stride_oh + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(DO + b * stride_db + r64 * stride_ds + h * stride_dh + offs_d[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + b * stride_eb + h * stride_eh + rows * stride_es, delta, mask=rows < S)


def attention_delta(out, dout):
    """``rowsum(dout * out)`` in float32: (B, Sq, H, D) -> (B, H, Sq), or packed (Tq, H, D) -> (H, Tq)."""
    if out.shape != dout.shape:
        raise ValueError(f"out {tuple(out.shape)} and dout {tuple(dout.shape)} differ")
    if out.dim() not in (3, 4):
        raise ValueError(f"out must be (B, S, H, D) or (T, H, D), got {tuple(out.shape)}")
    for name, x in (("out", out), ("dout", dout)):
        if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise TypeError(f"{name}.dtype is {x.dtype}; expected float16, bfloat16 or float32")
    out, dout = unit_last_stride(out), unit_last_stride(dout)
    packed = out.dim() == 3
    o4, do4 = (out.unsqueeze(0), dout.unsqueeze(0)) if packed else (out, dout)
    B, S, H, D = o4.shape
    delta = torch.empty((B, H, S), dtype=torch.float32, device=out.device)
    if delta.numel():
        d_pad = max(16, next_power_of_2(D))
        block_s = max(1, min(128, 8192 // d_pad))
        launch_kernel(_delta_kernel, (cdiv(S, block_s), B * H),
            o4, do4, delta, o4.stride(0), o4.stride(1), o4.stride(2), do4.stride(0), do4.stride(1), do4.stride(2),
            *delta.stride(), S, H, HEAD_DIM=D, D_PAD=d_pad, BLOCK_S=block_s, num_warps=4, **COMPILE_OPTIONS)
    return delta[0] if packed else delta


# ----------------------------------------------------------------------------- one tile pair
@triton.jit
def _lse_log2(lse):
    """lse (natural log) -> log2 units; rows with no mass anywhere (-inf) -> +inf, so that P = 0."""
    lse = lse * 1.4426950408889634
    return tl.where(lse == float("-inf"), float("inf"), lse)


@triton.jit
def _dkdv_tile(dk, dv, k, v, q, do, lse2, delta, qk_scale, visible, MASKED: tl.constexpr,
               DOT_PRECISION: tl.constexpr):
    """Add one query tile's share to dK, dV (BLOCK_N, D) of one key tile, transposed: P^T is (N, M).

    lse2: (BLOCK_M,) lse in log2 units (``_lse_log2``); where MASKED, P^T is zero outside
    ``visible`` (BLOCK_N, BLOCK_M). Returns (dk, dv, dS^T) (dS^T in q's dtype)."""
    s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
    p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])
    if MASKED:
        p_t = tl.where(visible, p_t, 0.0)
    dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)
    # dS^T = P^T * (dP^T - delta)
    dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
    dk += tl.dot(ds_t, q, input_precision=DOT_PRECISION)
    return dk, dv, ds_t


@triton.jit
def _dq_tile(dq, q, do, lse2, delta, k, v, qk_scale, visible, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Add one key tile's share to dQ (BLOCK_M, D): dS K with dS = P * (dP - delta); where MASKED,
    P is zero outside ``visible`` (BLOCK_M, BLOCK_N)."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    p = tl.math.exp2(s * qk_scale - lse2[:, None])
    if MASKED:
        p = tl.where(visible, p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    ds = p * (dp - delta[:, None])
    return tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)


# ----------------------------------------------------------------------------- dK, dV
@triton.jit
def _dkdv_steps(dk, dv, k, v, Q, DO, Lse, Delta, DQ, stride_qs, stride_ds, stride_ls, stride_es, stride_dqs, lo, hi,
                Sq, k_pos, q_offset, q_stride, qk_scale, softmax_scale, offs_m, offs_d,
                HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL_MASK: tl.constexpr,
                CHECK_ROWS: tl.constexpr, DQ_ATOMIC: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Accumulate dK, dV of one key tile over query tiles [lo, hi) of one head (transposed: (N, M)).

    CAUSAL_MASK: the tiles straddle the causal boundary. CHECK_ROWS: the tiles may run past Sq
    (else every row is in range and the loads are unmasked). With DQ_ATOMIC, also add this key
    tile's share of dQ = dS K * scale into DQ (float32) by atomics.
    """
    q_tile = offs_m[:, None] * stride_qs + offs_d[None, :]
    do_tile = offs_m[:, None] * stride_ds + offs_d[None, :]
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        rows = start_m + offs_m
        row_ok = rows < Sq
        q = _load_rows(Q + start_m.to(tl.int64) * stride_qs + q_tile, rows, Sq, offs_d, HEAD_DIM, D_PAD, CHECK_ROWS)
        do = _load_rows(DO + start_m.to(tl.int64) * stride_ds + do_tile, rows, Sq, offs_d, HEAD_DIM, D_PAD,
                        CHECK_ROWS)
        # rows past the end read lse = +inf, hence P = 0
        if CHECK_ROWS:
            lse = tl.load(Lse + rows * stride_ls, mask=row_ok, other=float("inf"))
            delta = tl.load(Delta + rows * stride_es, mask=row_ok, other=0.0)
        else:
            lse = tl.load(Lse + rows * stride_ls)
            delta = tl.load(Delta + rows * stride_es)
        visible = k_pos[:, None] <= (q_offset + rows * q_stride)[None, :]
        dk, dv, ds_t = _dkdv_tile(dk, dv, k, v, q, do, _lse_log2(lse), delta, qk_scale, visible, CAUSAL_MASK,
                                  DOT_PRECISION)
        if DQ_ATOMIC:
            dq = tl.dot(tl.trans(ds_t), k, input_precision=DOT_PRECISION) * softmax_scale
            dq_ptrs = DQ + rows.to(tl.int64)[:, None] * stride_dqs + offs_d[None, :]
            tl.atomic_add(dq_ptrs, dq, mask=row_ok[:, None] & (offs_d < HEAD_DIM)[None, :], sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_ws_steps(dk, dv, k, v, Q, DO, Lse, Delta, stride_qs, stride_ds, stride_lh, stride_eh, lo, hi, Sq, GROUP,
                   qk_scale, key_gap, q_stride, k_stride, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dK, dV of one key tile over the query tiles [lo, hi) of every head of the GQA group, in ONE
    loop that Triton splits into a TMA-load warp and two compute groups (its Hopper warp
    specialization takes one loop and no branch in it). Every load goes through a tensor
    descriptor: ``Q``/``DO`` point at the group's first head and its GROUP heads lie side by side
    (head stride = HEAD_DIM); ``Lse``/``Delta`` at that head's row, rows ``stride_lh`` apart.

    Rows past Sq read q = dout = lse = delta = 0 and so add exactly 0. CAUSAL masks every tile:
    query i of a tile sees key j iff j*k_stride - i*q_stride <= key_gap + start_m*q_stride, with
    ``key_gap`` = q_offset - (position of the tile's first key); relative positions because
    triton 3.6's Hopper warp specialization offsets a "start + arange" row vector twice."""
    desc_q = tl.make_tensor_descriptor(Q, shape=[Sq, GROUP * HEAD_DIM], strides=[stride_qs, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    desc_do = tl.make_tensor_descriptor(DO, shape=[Sq, GROUP * HEAD_DIM], strides=[stride_ds, 1],
                                        block_shape=[BLOCK_M, HEAD_DIM])
    desc_l = tl.make_tensor_descriptor(Lse, shape=[GROUP, Sq], strides=[stride_lh, 1], block_shape=[1, BLOCK_M])
    desc_e = tl.make_tensor_descriptor(Delta, shape=[GROUP, Sq], strides=[stride_eh, 1], block_shape=[1, BLOCK_M])
    rel = (tl.arange(0, BLOCK_N) * k_stride)[:, None] - (tl.arange(0, BLOCK_M) * q_stride)[None, :]
    n_tiles = (hi - lo) // BLOCK_M
    for i in tl.range(0, GROUP * n_tiles, warp_specialize=True):
        # query tile (head g of the group, rows from start_m)
        g = i // n_tiles
        start_m = tl.multiple_of(lo + (i - g * n_tiles) * BLOCK_M, BLOCK_M)
        q = desc_q.load([start_m, g * HEAD_DIM])
        do = desc_do.load([start_m, g * HEAD_DIM])
        lse2 = _lse_log2(tl.reshape(desc_l.load([g, start_m]), [BLOCK_M]))
        delta = tl.reshape(desc_e.load([g, start_m]), [BLOCK_M])
        dk, dv, _ = _dkdv_tile(dk, dv, k, v, q, do, lse2, delta, qk_scale, rel <= key_gap + start_m * q_stride,
                               CAUSAL, DOT_PRECISION)
    return dk, dv


@triton.jit
def _add_store(Ptr, x, rows, n_rows, row_stride, offs_d, HEAD_DIM: tl.constexpr, ACCUMULATE: tl.constexpr):
    """Store (or add, if ACCUMULATE) a float32 (rows, D_PAD) tile into rows < n_rows, columns < HEAD_DIM,
    rounded to ``Ptr``'s dtype (float32 buffers, or 16-bit gradients asked for by ``grad_dtype``).

    Callers fold the tile's first row into ``Ptr`` and pass ``rows = arange(0, BLOCK)``: triton 3.6's
    Hopper warp specialization, splitting a tile's rows over two compute groups, offsets a
    "start + arange" row vector twice (a scalar base and a bare arange come out right)."""
    ptrs = Ptr + rows.to(tl.int64)[:, None] * row_stride + offs_d[None, :]
    mask = (rows < n_rows)[:, None] & (offs_d < HEAD_DIM)[None, :]
    if ACCUMULATE:
        x += tl.load(ptrs, mask=mask, other=0.0)
    tl.store(ptrs, x.to(Ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["Sq", "Sk", "q_offset", "k_offset"])
def _attn_bwd_dkdv_kernel(Q, K, V, DO, Lse, Delta, DK, DV, DQ, CuQ, CuK,
                          stride_qb, stride_qs, stride_qh,
                          stride_kb, stride_ks, stride_kh,
                          stride_vb, stride_vs, stride_vh,
                          stride_db, stride_ds, stride_dh,
                          stride_lb, stride_lh, stride_ls,
                          stride_eb, stride_eh, stride_es,
                          stride_dkb, stride_dks, stride_dkh,
                          stride_dvb, stride_dvs, stride_dvh,
                          stride_dqb, stride_dqs, stride_dqh,
                          Sq, Sk, KV_HEADS, GROUP, q_offset, q_stride, k_offset, k_stride, qk_scale, softmax_scale,
                          HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          CAUSAL: tl.constexpr, VARLEN: tl.constexpr, ACCUMULATE: tl.constexpr,
                          DQ_ATOMIC: tl.constexpr, SPLIT_TAIL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                          WARP_SPEC: tl.constexpr = False):
    # which key tile, batch (or sequence) and K/V head
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // KV_HEADS
    hk = pid_bh % KV_HEADS
    q_start, Sq = _seq_bounds(CuQ, b, Sq, VARLEN)
    k_start, Sk = _seq_bounds(CuK, b, Sk, VARLEN)
    start_n = pid_n * BLOCK_N
    if VARLEN:
        # the grid covers the longest sequence; shorter ones have no keys here
        if start_n >= Sk:
            return
    b64 = b.to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    k_pos = k_offset + offs_n * k_stride
    K += b64 * stride_kb + k_start.to(tl.int64) * stride_ks + hk * stride_kh
    V += b64 * stride_vb + k_start.to(tl.int64) * stride_vs + hk * stride_vh

    # this tile's K and V stay on chip for the whole loop
    if WARP_SPEC:
        k = tl.make_tensor_descriptor(K, shape=[Sk, HEAD_DIM], strides=[stride_ks, 1],
                                      block_shape=[BLOCK_N, HEAD_DIM]).load([start_n, 0])
        v = tl.make_tensor_descriptor(V, shape=[Sk, HEAD_DIM], strides=[stride_vs, 1],
                                      block_shape=[BLOCK_N, HEAD_DIM]).load([start_n, 0])
    else:
        k = _load_rows(K + start_n.to(tl.int64) * stride_ks + tl.arange(0, BLOCK_N)[:, None] * stride_ks
                       + offs_d[None, :], offs_n, Sk, offs_d, HEAD_DIM, D_PAD, True)
        v = _load_rows(V + start_n.to(tl.int64) * stride_vs + tl.arange(0, BLOCK_N)[:, None] * stride_vs
                       + offs_d[None, :], offs_n, Sk, offs_d, HEAD_DIM, D_PAD, True)
    dk = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    dv = tl.zeros([BLOCK_N, D_PAD], tl.float32)

    # query ranges: [m_lo, m_mid) straddles the causal boundary (masked), [m_mid, Sq) sees every key;
    # with SPLIT_TAIL, whole tiles up to m_end load without row checks, then the last partial tile.
    # WARP_SPEC: all of [m_lo, Sq) in one loop, every tile masked if causal.
    if CAUSAL:
        last_col = tl.minimum(start_n + BLOCK_N, Sk) - 1
        pos_first = k_offset + start_n * k_stride
        pos_last = k_offset + last_col * k_stride
        # first query row whose position is >= a key position p: ceil((p - q_offset) / q_stride)
        m_any = tl.minimum(tl.maximum(pos_first - q_offset + q_stride - 1, 0) // q_stride, Sq)
        m_all = tl.minimum(tl.maximum(pos_last - q_offset + q_stride - 1, 0) // q_stride, Sq)
        m_lo = (m_any // BLOCK_M) * BLOCK_M
        m_mid = tl.cdiv(m_all, BLOCK_M) * BLOCK_M
    else:
        m_lo = 0
        m_mid = 0
    if SPLIT_TAIL:
        m_end = tl.maximum((Sq // BLOCK_M) * BLOCK_M, m_mid)
    else:
        m_end = m_mid

    Q += b64 * stride_qb + q_start.to(tl.int64) * stride_qs
    DO += b64 * stride_db + q_start.to(tl.int64) * stride_ds
    Lse += b64 * stride_lb + q_start * stride_ls
    Delta += b64 * stride_eb + q_start * stride_es
    DQ += b64 * stride_dqb + q_start.to(tl.int64) * stride_dqs
    if WARP_SPEC:
        h0 = hk * GROUP
        dk, dv = _dkdv_ws_steps(dk, dv, k, v, Q + h0 * stride_qh, DO + h0 * stride_dh, Lse + h0 * stride_lh,
                                Delta + h0 * stride_eh, stride_qs, stride_ds, stride_lh, stride_eh, m_lo,
                                tl.cdiv(Sq, BLOCK_M) * BLOCK_M, Sq, GROUP, qk_scale,
                                q_offset - k_offset - start_n * k_stride, q_stride, k_stride, CAUSAL, HEAD_DIM,
                                BLOCK_M, BLOCK_N, DOT_PRECISION)
    else:
        # every query head of the GQA group adds into the same dK, dV
        for g in range(GROUP):
            h = hk * GROUP + g
            Qh = Q + h * stride_qh
            DOh = DO + h * stride_dh
            Lh = Lse + h * stride_lh
            Eh = Delta + h * stride_eh
            DQh = DQ + h * stride_dqh
            dk, dv = _dkdv_steps(dk, dv, k, v, Qh, DOh, Lh, Eh, DQh, stride_qs, stride_ds, stride_ls, stride_es,
                                 stride_dqs, m_lo, m_mid, Sq, k_pos, q_offset, q_stride, qk_scale, softmax_scale,
                                 offs_m, offs_d, HEAD_DIM, D_PAD, BLOCK_M, True, True, DQ_ATOMIC, DOT_PRECISION)
            if SPLIT_TAIL:
                dk, dv = _dkdv_steps(dk, dv, k, v, Qh, DOh, Lh, Eh, DQh, stride_qs, stride_ds, stride_ls, stride_es,
                                     stride_dqs, m_mid, m_end, Sq, k_pos, q_offset, q_stride, qk_scale, softmax_scale,
                                     offs_m, offs_d, HEAD_DIM, D_PAD, BLOCK_M, False, False, DQ_ATOMIC, DOT_PRECISION)
            dk, dv = _dkdv_steps(dk, dv, k, v, Qh, DOh, Lh, Eh, DQh, stride_qs, stride_ds, stride_ls, stride_es,
                                 stride_dqs, m_end, Sq, Sq, k_pos, q_offset, q_stride, qk_scale, softmax_scale, offs_m,
                                 offs_d, HEAD_DIM, D_PAD, BLOCK_M, False, True, DQ_ATOMIC, DOT_PRECISION)

    # write back (dK carries the softmax scale of dS q)
    DK += b64 * stride_dkb + k_start.to(tl.int64) * stride_dks + hk * stride_dkh
    DV += b64 * stride_dvb + k_start.to(tl.int64) * stride_dvs + hk * stride_dvh
    tile_rows = tl.arange(0, BLOCK_N)
    _add_store(DK + start_n.to(tl.int64) * stride_dks, dk * softmax_scale, tile_rows, Sk - start_n, stride_dks, offs_d,
               HEAD_DIM, ACCUMULATE)
    _add_store(DV + start_n.to(tl.int64) * stride_dvs, dv, tile_rows, Sk - start_n, stride_dvs, offs_d, HEAD_DIM,
               ACCUMULATE)


# ----------------------------------------------------------------------------- dQ
@triton.jit
def _dq_steps(dq, q, do, lse2, delta, K, V, desc_k, desc_v, stride_ks, stride_vs, lo, hi, Sk, q_pos, key_gap,
              k_offset, q_stride, k_stride, qk_scale, offs_n, offs_d, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              DOT_PRECISION: tl.constexpr, WARP_SPEC: tl.constexpr):
    """Accumulate dQ of one query tile over key tiles [lo, hi); lse2 in log2 units (``_lse_log2``).

    WARP_SPEC: K/V tiles come through the tensor descriptors ``desc_k``/``desc_v`` and Triton
    splits the loop into a TMA-load warp and two compute groups; every tile is masked then (keys
    past Sk and, if causal, by relative positions: query i of the tile sees key j iff
    j*k_stride - i*q_stride <= key_gap - start_n*k_stride, ``key_gap`` = the tile's first query
    position - k_offset; see ``_dkdv_ws_steps``). Else through pointers, masked where MASKED by
    the absolute positions ``q_pos``."""
    k_tile = offs_n[:, None] * stride_ks + offs_d[None, :]
    v_tile = offs_n[:, None] * stride_vs + offs_d[None, :]
    rel = (offs_n * k_stride)[None, :] - (tl.arange(0, BLOCK_M) * q_stride)[:, None]
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPEC):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if WARP_SPEC:
            k = desc_k.load([start_n, 0])
            v = desc_v.load([start_n, 0])
        else:
            k = _load_rows(K + start_n.to(tl.int64) * stride_ks + k_tile, cols, Sk, offs_d, HEAD_DIM, D_PAD, MASKED)
            v = _load_rows(V + start_n.to(tl.int64) * stride_vs + v_tile, cols, Sk, offs_d, HEAD_DIM, D_PAD, MASKED)
        # keys past the end and, if causal, keys after the query contribute nothing
        if WARP_SPEC:
            visible = (offs_n < Sk - start_n)[None, :]
            if CAUSAL:
                visible = visible & (rel <= key_gap - start_n * k_stride)
        else:
            visible = (cols < Sk)[None, :]
            if CAUSAL:
                visible = visible & ((k_offset + cols * k_stride)[None, :] <= q_pos[:, None])
        dq = _dq_tile(dq, q, do, lse2, delta, k, v, qk_scale, visible, MASKED, DOT_PRECISION)
    return dq


@triton.jit(do_not_specialize=["Sq", "Sk", "q_offset", "k_offset"])
def _attn_bwd_dq_kernel(Q, K, V, DO, Lse, Delta, DQ, CuQ, CuK,
                        stride_qb, stride_qs, stride_qh,
                        stride_kb, stride_ks, stride_kh,
                        stride_vb, stride_vs, stride_vh,
                        stride_db, stride_ds, stride_dh,
                        stride_lb, stride_lh, stride_ls,
                        stride_eb, stride_eh, stride_es,
                        stride_dqb, stride_dqs, stride_dqh,
                        Sq, Sk, H, GROUP, q_offset, q_stride, k_offset, k_stride, qk_scale, softmax_scale,
                        HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        CAUSAL: tl.constexpr, VARLEN: tl.constexpr, ACCUMULATE: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, WARP_SPEC: tl.constexpr = False):
    b, h, q_start, Sq, k_start, Sk, start_m = _query_tile(CuQ, CuK, Sq, Sk, H, BLOCK_M, CAUSAL, VARLEN)
    if VARLEN:
        # the grid covers the longest sequence; shorter ones have no rows here
        if start_m >= Sq:
            return
    b64 = b.to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    q_pos = q_offset + offs_m * q_stride
    Q += b64 * stride_qb + q_start.to(tl.int64) * stride_qs + h * stride_qh
    DO += b64 * stride_db + q_start.to(tl.int64) * stride_ds + h * stride_dh
    Lse += b64 * stride_lb + h * stride_lh + q_start * stride_ls
    Delta += b64 * stride_eb + h * stride_eh + q_start * stride_es
    K += b64 * stride_kb + k_start.to(tl.int64) * stride_ks + (h // GROUP) * stride_kh
    V += b64 * stride_vb + k_start.to(tl.int64) * stride_vs + (h // GROUP) * stride_vh

    # this tile's q, dout, lse and delta stay on chip for the whole loop (through tensor
    # descriptors when warp-specialized: past the last row they read 0, which gives dS = 0)
    if WARP_SPEC:
        q = tl.make_tensor_descriptor(Q, shape=[Sq, HEAD_DIM], strides=[stride_qs, 1],
                                      block_shape=[BLOCK_M, HEAD_DIM]).load([start_m, 0])
        do = tl.make_tensor_descriptor(DO, shape=[Sq, HEAD_DIM], strides=[stride_ds, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM]).load([start_m, 0])
        lse = tl.make_tensor_descriptor(Lse, shape=[Sq], strides=[1], block_shape=[BLOCK_M]).load([start_m])
        delta = tl.make_tensor_descriptor(Delta, shape=[Sq], strides=[1], block_shape=[BLOCK_M]).load([start_m])
        desc_k = tl.make_tensor_descriptor(K, shape=[Sk, HEAD_DIM], strides=[stride_ks, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        desc_v = tl.make_tensor_descriptor(V, shape=[Sk, HEAD_DIM], strides=[stride_vs, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
    else:
        row_ok = offs_m < Sq
        q_tile = tl.arange(0, BLOCK_M)[:, None] * stride_qs + offs_d[None, :]
        do_tile = tl.arange(0, BLOCK_M)[:, None] * stride_ds + offs_d[None, :]
        q = _load_rows(Q + start_m.to(tl.int64) * stride_qs + q_tile, offs_m, Sq, offs_d, HEAD_DIM, D_PAD, True)
        do = _load_rows(DO + start_m.to(tl.int64) * stride_ds + do_tile, offs_m, Sq, offs_d, HEAD_DIM, D_PAD, True)
        # rows past the end read lse = +inf, hence P = 0
        lse = tl.load(Lse + offs_m * stride_ls, mask=row_ok, other=float("inf"))
        delta = tl.load(Delta + offs_m * stride_es, mask=row_ok, other=0.0)
        desc_k = K
        desc_v = V
    lse2 = _lse_log2(lse)
    dq = tl.zeros([BLOCK_M, D_PAD], tl.float32)

    # keys every row sees (no mask), then keys some rows see (masked); the rest is skipped
    # (WARP_SPEC: all of [0, hi) in one loop, every tile masked)
    full_end, hi = _key_ranges(start_m, Sq, Sk, q_offset, q_stride, k_offset, k_stride, BLOCK_M, BLOCK_N, CAUSAL)
    key_gap = q_offset + start_m * q_stride - k_offset
    if WARP_SPEC:
        dq = _dq_steps(dq, q, do, lse2, delta, K, V, desc_k, desc_v, stride_ks, stride_vs, 0, hi, Sk, q_pos, key_gap,
                       k_offset, q_stride, k_stride, qk_scale, offs_n, offs_d, HEAD_DIM, D_PAD, BLOCK_M, BLOCK_N, True,
                       CAUSAL, DOT_PRECISION, True)
    else:
        dq = _dq_steps(dq, q, do, lse2, delta, K, V, desc_k, desc_v, stride_ks, stride_vs, 0, full_end, Sk, q_pos,
                       key_gap, k_offset, q_stride, k_stride, qk_scale, offs_n, offs_d, HEAD_DIM, D_PAD, BLOCK_M,
                       BLOCK_N, False, CAUSAL, DOT_PRECISION, False)
        dq = _dq_steps(dq, q, do, lse2, delta, K, V, desc_k, desc_v, stride_ks, stride_vs, full_end, hi, Sk, q_pos,
                       key_gap, k_offset, q_stride, k_stride, qk_scale, offs_n, offs_d, HEAD_DIM, D_PAD, BLOCK_M,
                       BLOCK_N, True, CAUSAL, DOT_PRECISION, False)

    # write back (dQ carries the softmax scale of dS k)
    DQ += b64 * stride_dqb + (q_start + start_m).to(tl.int64) * stride_dqs + h * stride_dqh
    _add_store(DQ, dq * softmax_scale, tl.arange(0, BLOCK_M), Sq - start_m, stride_dqs, offs_d, HEAD_DIM, ACCUMULATE)


# ----------------------------------------------------------------------------- host side
def _grad_buffer(buf, like: torch.Tensor, name: str, zero: bool = False,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, bool]:
    """(buffer, accumulate): the caller's float32 buffer shaped like ``like``, or a new one of
    ``dtype`` (zeroed if ``zero``: atomics add into it)."""
    if buf is None:
        alloc = torch.zeros if zero else torch.empty
        return alloc(like.shape, dtype=dtype, device=like.device), zero
    if buf.dtype != torch.float32 or buf.shape != like.shape or buf.device != like.device:
        raise ValueError(f"{name} must be float32 of shape {tuple(like.shape)} on {like.device}, got "
                         f"{buf.dtype} {tuple(buf.shape)} on {buf.device}")
    if buf.stride(-1) != 1:
        raise ValueError(f"{name} must have a unit last stride (it is written in place), got {buf.stride()}")
    return buf, True


def _check_rows(name: str, x: torch.Tensor, shape: tuple) -> None:
    if x.dtype != torch.float32 or tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must be float32 of shape {tuple(shape)}, got {x.dtype} {tuple(x.shape)}")


def attention_bwd(q, k, v, out, dout, lse, delta, *, softmax_scale, causal=False, q_offset=0, q_stride=1,
                  k_offset=0, k_stride=1, dq=None, dk=None, dv=None, cu_seqlens_q=None, cu_seqlens_k=None,
                  max_seqlen_q=None, max_seqlen_k=None, grad_dtype=None):
    """Gradients of one (query block, key/value block) pair, recomputing P from ``lse``.

    Args:
        q, k, v, masks, varlen arguments: as in ``attention_fwd``.
        out: the forward output (kept for the contract; the kernels read ``delta`` instead).
        dout: gradient of ``out``, shaped like q, any float dtype of the three.
        lse: float32 natural-log lse of the full rows, (B, H, Sq) or (H, Tq).
        delta: float32 ``rowsum(dout * out)`` (``attention_delta``), shaped like lse; pass
            ``delta - dlse`` to also propagate a gradient of lse.
        dq, dk, dv: optional float32 buffers shaped like q, k, v (strided views allowed) that the
            gradients are ADDED into; new buffers when None.
        grad_dtype: dtype of the new buffers (default float32). A 16-bit dtype gets the float32
            gradients rounded once as the kernels write them, as a cast afterwards would, without
            its extra pass (dQ by atomics stays float32 until the end; dK/dV when only one of dk, dv
            is given stay float32).

    Returns:
        (dq, dk, dv): shaped like q, k, v, in the buffers' dtype; dk/dv at the K/V head count
        (summed over the query heads of each GQA group).
    """
    q, k, v, dout = (unit_last_stride(x) for x in (q, k, v, dout))
    prob = check_problem(q, k, v, q_stride, k_stride, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if dout.shape != q.shape:
        raise ValueError(f"dout {tuple(dout.shape)} must be shaped like q {tuple(q.shape)}")
    rows_shape = (prob.heads, q.shape[0]) if prob.varlen else (prob.batch, prob.heads, prob.max_q)
    _check_rows("lse", lse, rows_shape)
    _check_rows("delta", delta, rows_shape)
    causal = bool(causal)
    atomic = config.dq_by_atomics(q.device, prob.d_pad, q.dtype, causal)
    split_tail = config.dkdv_split_tail(q.device, prob.d_pad, q.dtype, causal)
    new_dtype = torch.float32 if grad_dtype is None else grad_dtype
    if new_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"grad_dtype must be float16, bfloat16 or float32, got {grad_dtype}")
    cast_dq = atomic and dq is None and new_dtype != torch.float32   # atomics add into float32
    dq, acc_q = _grad_buffer(dq, q, "dq", zero=atomic, dtype=torch.float32 if atomic else new_dtype)
    kv_dtype = new_dtype if dk is None and dv is None else torch.float32
    dk, acc_k = _grad_buffer(dk, k, "dk", dtype=kv_dtype)
    dv, acc_v = _grad_buffer(dv, v, "dv", dtype=kv_dtype)
    if acc_k != acc_v:  # one kernel writes both: give it the same mode
        (dv if acc_k else dk).zero_()
        acc_k = acc_v = True
    if prob.batch == 0 or prob.heads == 0 or prob.max_k == 0 or prob.max_q == 0:
        # nothing to attend: the gradients are zero
        for buf, acc in ((dq, acc_q), (dk, acc_k), (dv, acc_v)):
            if not acc:
                buf.zero_()
        return (dq.to(new_dtype) if cast_dq else dq), dk, dv

    rows_strides = (lambda x: (0, *x.stride())) if prob.varlen else (lambda x: x.stride())
    cu_q, cu_k = prob.cu_args(q.device)
    common = (*prob.strides(q), *prob.strides(k), *prob.strides(v), *prob.strides(dout), *rows_strides(lse),
              *rows_strides(delta))
    scale = check_scale(softmax_scale)
    scalars = (int(q_offset), int(q_stride), int(k_offset), int(k_stride), scale * LOG2E, scale)
    kwargs = dict(HEAD_DIM=prob.head_dim, D_PAD=prob.d_pad, CAUSAL=causal, VARLEN=prob.varlen,
                  DOT_PRECISION=dot_precision(q.dtype))
    key = (q.device.type, prob.d_pad, q.dtype, causal)
    group = prob.heads // prob.kv_heads
    # the warp-specialized kernels where the table says so and the inputs allow it
    shorter = min(prob.max_q, prob.max_k)
    ready = not atomic and warp_spec_ready(prob, q, k, v, dout, lse, delta)
    gluon_dkdv = (not atomic and config.dkdv_gluon(q.device, prob.d_pad, q.dtype, causal)
                  and gluon_dkdv_ready(prob, q, k, v, dout, causal, q_stride, k_stride))
    ws_dkdv, ws_dq = (ready and config.bwd_warp_spec(name, q.device, prob.d_pad, q.dtype, causal, shorter)
                      for name in ("dkdv", "dq"))
    ws_dkdv = ws_dkdv and not gluon_dkdv

    with descriptor_scratch() if ws_dkdv or ws_dq or gluon_dkdv else contextlib.nullcontext():
        # dK, dV (and, by atomics, dQ) per key tile. The warp-specialized Triton kernel writes fresh
        # buffers that are added afterwards: adding into the caller's inside it raced (NaN in ring replays)
        fresh = ws_dkdv and acc_k
        dk_k, dv_k = (torch.empty(dk.shape, dtype=torch.float32, device=dk.device) for _ in range(2)) if fresh \
            else (dk, dv)
        if gluon_dkdv:
            gluon_bwd.launch(q, k, v, dout, lse, delta, dk, dv, qk_scale=scale * LOG2E, softmax_scale=scale,
                             causal=causal, delta_pos=int(q_offset) - int(k_offset), accumulate=acc_k)
        else:
            grid = lambda t: (cdiv(prob.max_k, t.block_n), prob.batch * prob.kv_heads)  # noqa: E731
            args = (q, k, v, dout, lse, delta, dk_k, dv_k, dq, cu_q, cu_k, *common, *prob.strides(dk_k),
                    *prob.strides(dv_k), *prob.strides(dq), prob.max_q, prob.max_k, prob.kv_heads, group, *scalars)
            _launch_either(_attn_bwd_dkdv_kernel, grid, args, dict(kwargs, ACCUMULATE=acc_k and not fresh,
                                                                    DQ_ATOMIC=atomic, SPLIT_TAIL=split_tail),
                           "dkdv", ws_dkdv, q.device, prob.d_pad, q.dtype, causal, (atomic, split_tail) + key)
        if fresh:
            dk.add_(dk_k)
            dv.add_(dv_k)
        if atomic:
            return (dq.to(new_dtype) if cast_dq else dq), dk, dv

        # dQ per query tile
        grid = lambda t: (cdiv(prob.max_q, t.block_m), prob.batch * prob.heads)  # noqa: E731
        args = (q, k, v, dout, lse, delta, dq, cu_q, cu_k, *common, *prob.strides(dq),
                prob.max_q, prob.max_k, prob.heads, group, *scalars)
        _launch_either(_attn_bwd_dq_kernel, grid, args, dict(kwargs, ACCUMULATE=acc_q), "dq", ws_dq, q.device,
                       prob.d_pad, q.dtype, causal, key)
    return dq, dk, dv


def _launch_either(kernel, grid, args: tuple, kwargs: dict, name: str, warp_spec: bool, device, d_pad: int, dtype,
                   causal: bool, key: tuple) -> None:
    """Launch backward kernel ``name`` ("dkdv" or "dq") warp-specialized in its table tile if
    ``warp_spec`` and that tile fits the device, else plain."""
    tile = config.tile_for(name, device, d_pad, dtype, causal)
    ws_tile = config.tile_for(name + "_ws", device, d_pad, dtype, causal)
    if not (warp_spec and launch_split(kernel, grid, args, kwargs, ws_tile, None, {}, tile, (name,) + key)):
        launch(kernel, grid, args, kwargs, tile, (name,) + key)


def gluon_dkdv_ready(prob, q, k, v, dout, causal: bool, q_stride: int, k_stride: int) -> bool:
    """Whether the Gluon dK/dV kernel (``attention_bwd_gluon``) computes this block pair: a Hopper GPU,
    dense 16-bit inputs, head dim 64 or 128, TMA-ready q/k/v/dout, unit position strides if causal."""
    return (q.is_cuda and gluon_bwd.gluon is not None and config.cuda_major(q.device) == 9 and not prob.varlen
            and gluon_bwd.supports(q, prob.head_dim, causal, q_stride, k_stride) and tma_ready(prob, q, k, v, dout))


def warp_spec_ready(prob, q, k, v, dout, lse, delta) -> bool:
    """Whether the warp-specialized backward can address these inputs through tensor descriptors:
    dense, q/k/v/dout as ``tma_ready`` says, the query heads of a GQA group side by side (head
    stride = head dim) and lse/delta with unit last stride and 16-byte aligned rows."""
    if prob.varlen or not tma_ready(prob, q, k, v, dout):
        return False
    if q.stride(2) != prob.head_dim or dout.stride(2) != prob.head_dim:
        return False
    return all(x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all(st % 4 == 0 for st in x.stride()[:-1])
               for x in (lse, delta))
