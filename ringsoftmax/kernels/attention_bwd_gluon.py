"""Attention backward dK/dV in Gluon for Hopper: warp-specialized by hand, its synchronization stated.

Triton 3.6's automatic warp specialization of the dK/dV loop (``attention_bwd``'s WARP_SPEC) was
15-25% faster than the plain kernel at D=128 but raced: non-finite dK/dV in about 1 of 1000 calls
(session 20, ``benchmarks/probes/bwd_race.py``). Here every hand-over is an mbarrier of our own:

- one program per 128 keys of one K/V head (a grid over key tiles and (batch, K/V head));
- a load warp streams the query tiles of every query head of the GQA group through ``STAGES``
  shared-memory slots: Q_i, dO_i (TMA boxes of (BLOCK_M, D)) and lse_i, delta_i (1-D TMA boxes of
  BLOCK_M floats over the (B, H, Sq) rows laid flat, each row padded to a multiple of 4 floats if it
  is not (``tma_rows``): a box that starts off 16 bytes was an illegal instruction on an H100), all
  counted by one ``ready`` barrier per slot;
  a slot is refilled once both compute warpgroups released it (``free``, count 2);
- two compute warpgroups own 64 keys each, their K and V rows loaded once; per query tile

      issue S^T = K Q_i^T and dP^T = V dO_i^T;  wait for S^T;  P^T = exp2(S^T * scale - lse_i)
      issue dV += P^T dO_i;  wait for dP^T;  dS^T = P^T (dP^T - delta_i)
      issue dK += dS^T Q_i;  wait for both;  release the slot

  (P^T and dS^T stay in registers as the A operands of their matmuls);
- masks by tile: the causal diagonal (query i sees key j iff j <= i + delta) and the last partial
  query tile (rows past Sq read zeros, or the padding or the next head's lse and delta, and are
  masked out of P^T);
- the epilogue writes dK * softmax_scale and dV by pointers, adding into the caller's buffers if
  asked (float32 or 16-bit).

Layouts: q, dout (B, Sq, H, D), k, v (B, Sk, H_kv, D), bfloat16 / float16, unit last stride, 16-byte
aligned with 16-byte multiples for the other strides; lse, delta (B, H, Sq) float32; dk, dv
(B, Sk, H_kv, D) unit last stride. D = 64 or 128.
"""
from __future__ import annotations

import torch

from . import attention_fwd_gluon as fwd_gluon
from .compile_options import COMPILE_OPTIONS
from .gluon_compat import (fence_async_shared, gl, gluon, mbarrier, tma, tma_load as _tma_load, warpgroup_mma,
                           warpgroup_mma_wait)
from .hostmath import cdiv
from .launcher import launch_kernel

if gluon is not None:
    from .attention_fwd_gluon import _issue_tile, _tile_view, _wgmma_layout

    KEYS_PER_GROUP = gl.constexpr(64)  # key rows per compute warpgroup; two of them per program

    @gluon.jit
    def _query_range(start_n, Sq, delta, causal, BLOCK_M: gl.constexpr):
        """Query tiles [m_lo, n_m) that see any key of the tile starting at ``start_n``."""
        n_m = gl.cdiv(Sq, BLOCK_M)
        if causal != 0:   # the first query that sees key start_n: i >= start_n - delta
            m_lo = gl.minimum(gl.maximum(start_n - delta, 0) // BLOCK_M, n_m)
        else:
            m_lo = n_m * 0
        return m_lo, n_m

    @gluon.jit
    def _dkdv_producer(q_desc, do_desc, l_desc, e_desc, q_s, do_s, l_s, e_s, ready, free, Sq, ROW, H, GROUP,
                       KV_HEADS, delta, causal):
        """Load warp: the query tiles of every head of the group, in order, into slot i % STAGES once
        both compute warpgroups freed it."""
        STAGES: gl.constexpr = q_s.shape[0]
        BLOCK_M: gl.constexpr = q_s.shape[1]
        b = gl.program_id(1) // KV_HEADS
        hk = gl.program_id(1) % KV_HEADS
        m_lo, n_m = _query_range(gl.program_id(0) * 2 * KEYS_PER_GROUP, Sq, delta, causal, BLOCK_M)
        per_head = n_m - m_lo
        nbytes: gl.constexpr = 2 * q_desc.block_type.nbytes + 2 * l_desc.block_type.nbytes
        for i in range(GROUP * per_head):
            slot = i % STAGES
            mbarrier.wait(free.index(slot), ((i // STAGES) & 1) ^ 1, pred=i >= STAGES)
            g = i // per_head
            h = hk * GROUP + g
            start_m = (m_lo + i - g * per_head) * BLOCK_M
            bar = ready.index(slot)
            mbarrier.expect(bar, nbytes)
            _tma_load(q_desc, [b, start_m, h, 0], bar, _tile_view(q_s.index(slot)))
            _tma_load(do_desc, [b, start_m, h, 0], bar, _tile_view(do_s.index(slot)))
            row = (b * H + h) * ROW + start_m   # 16-byte aligned: ROW and start_m are multiples of 4
            _tma_load(l_desc, [row], bar, l_s.index(slot))
            _tma_load(e_desc, [row], bar, e_s.index(slot))

    @gluon.jit
    def _dkdv_consumer(part: gl.constexpr, k_desc, v_desc, DK, DV, stride_dkb, stride_dks, stride_dkh, stride_dvb,
                       stride_dvs, stride_dvh, q_s, do_s, l_s, e_s, k_s, v_s, kv_bar, ready, free, Sq, Sk, GROUP,
                       KV_HEADS, qk_scale, softmax_scale, delta, causal, accumulate):
        """One compute warpgroup: dK, dV of keys [start_n + part * 64, + 64) over every query tile the
        producer streams (see the module doc)."""
        STAGES: gl.constexpr = q_s.shape[0]
        BLOCK_M: gl.constexpr = q_s.shape[1]
        HEAD_DIM: gl.constexpr = q_s.shape[2]
        ROWS: gl.constexpr = k_s.shape[1]
        dtype: gl.constexpr = q_s.dtype
        s_layout: gl.constexpr = _wgmma_layout(BLOCK_M)
        o_layout: gl.constexpr = _wgmma_layout(HEAD_DIM)
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
        b = gl.program_id(1) // KV_HEADS
        hk = gl.program_id(1) % KV_HEADS
        start_n = gl.program_id(0) * 2 * ROWS
        key0 = start_n + part * ROWS
        m_lo, n_m = _query_range(start_n, Sq, delta, causal, BLOCK_M)
        per_head = n_m - m_lo
        n_items = GROUP * per_head

        # this warpgroup's K and V rows, once
        k_p = k_s.index(part)
        v_p = v_s.index(part)
        if n_items > 0:
            _issue_tile(k_desc, [b, key0, hk, 0], kv_bar.index(part), _tile_view(k_p))
            mbarrier.expect(kv_bar.index(2 + part), v_desc.block_type.nbytes)
            _tma_load(v_desc, [b, key0, hk, 0], kv_bar.index(2 + part), _tile_view(v_p))
            mbarrier.wait(kv_bar.index(part), 0)
            mbarrier.wait(kv_bar.index(2 + part), 0)

        rows = gl.arange(0, ROWS, gl.SliceLayout(1, s_layout))
        cols = gl.arange(0, BLOCK_M, col_layout)
        s_zero = gl.zeros([ROWS, BLOCK_M], gl.float32, s_layout)
        dk = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
        dv = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
        for i in range(n_items):
            slot = i % STAGES
            g = i // per_head
            start_m = (m_lo + i - g * per_head) * BLOCK_M
            q_t = q_s.index(slot)
            do_t = do_s.index(slot)
            mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
            # S^T and dP^T on the tensor cores; wait for S^T only
            s_tok = warpgroup_mma(k_p, q_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            dp_tok = warpgroup_mma(v_p, do_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            lse = l_s.index(slot).load(col_layout)
            lse2 = gl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
            s = warpgroup_mma_wait(1, deps=[s_tok])
            p = gl.exp2(s * qk_scale - lse2[None, :])
            # masks: the causal diagonal (key0 + r <= start_m + c + delta) and rows past Sq
            if ((causal != 0) & (key0 + ROWS - 1 > start_m + delta)) | (start_m + BLOCK_M > Sq):
                # (one expression: naming the diagonal part doubled the spills at D=128, ptxas 3.6)
                ok = (cols[None, :] < Sq - start_m) & (
                    (causal == 0) | (rows[:, None] - cols[None, :] <= start_m + delta - key0))
                p = gl.where(ok, p, 0.0)
            p_op = gl.convert_layout(p.to(dtype), a_layout)
            # dV += P^T dO under dP^T's wait
            dv_tok = warpgroup_mma(p_op, do_t, dv, is_async=True)
            dp = warpgroup_mma_wait(1, deps=[dp_tok])
            dlt = e_s.index(slot).load(col_layout)
            ds = p * (dp - dlt[None, :])
            ds_op = gl.convert_layout(ds.to(dtype), a_layout)
            dk_tok = warpgroup_mma(ds_op, q_t, dk, is_async=True)
            dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, p_op, ds_op])
            mbarrier.arrive(free.index(slot), count=1)

        # epilogue: dK carries the softmax scale of dS Q; rows past Sk are not written
        rows_o = key0 + gl.arange(0, ROWS, gl.SliceLayout(1, o_layout))
        cols_o = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
        keep = (rows_o < Sk)[:, None] & (cols_o < HEAD_DIM)[None, :]   # full shape: a (rows, 1) mask fails to lower
        dk_ptrs = (DK + b.to(gl.int64) * stride_dkb + hk.to(gl.int64) * stride_dkh
                   + rows_o.to(gl.int64)[:, None] * stride_dks + cols_o[None, :])
        dv_ptrs = (DV + b.to(gl.int64) * stride_dvb + hk.to(gl.int64) * stride_dvh
                   + rows_o.to(gl.int64)[:, None] * stride_dvs + cols_o[None, :])
        dk = dk * softmax_scale
        if accumulate != 0:
            dk += gl.load(dk_ptrs, mask=keep, other=0.0).to(gl.float32)
            dv += gl.load(dv_ptrs, mask=keep, other=0.0).to(gl.float32)
        gl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=keep)
        gl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=keep)

    # the compute partitions, one per warpgroup (partitions take no constexpr arguments)
    @gluon.jit
    def _dkdv_consumer0(k_desc, v_desc, DK, DV, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs,
                        stride_dvh, q_s, do_s, l_s, e_s, k_s, v_s, kv_bar, ready, free, Sq, Sk, GROUP, KV_HEADS,
                        qk_scale, softmax_scale, delta, causal, accumulate):
        _dkdv_consumer(0, k_desc, v_desc, DK, DV, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs,
                       stride_dvh, q_s, do_s, l_s, e_s, k_s, v_s, kv_bar, ready, free, Sq, Sk, GROUP, KV_HEADS,
                       qk_scale, softmax_scale, delta, causal, accumulate)

    @gluon.jit
    def _dkdv_consumer1(k_desc, v_desc, DK, DV, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs,
                        stride_dvh, q_s, do_s, l_s, e_s, k_s, v_s, kv_bar, ready, free, Sq, Sk, GROUP, KV_HEADS,
                        qk_scale, softmax_scale, delta, causal, accumulate):
        _dkdv_consumer(1, k_desc, v_desc, DK, DV, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs,
                       stride_dvh, q_s, do_s, l_s, e_s, k_s, v_s, kv_bar, ready, free, Sq, Sk, GROUP, KV_HEADS,
                       qk_scale, softmax_scale, delta, causal, accumulate)

    @gluon.jit(do_not_specialize=["Sq", "Sk", "ROW", "delta"])
    def _gl_attn_bwd_dkdv_kernel(Q, K, V, DO, Lse, Delta, DK, DV, Sq, Sk, ROW, B, H, GROUP,
                                 stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                                 stride_vb, stride_vs, stride_vh, stride_db, stride_ds, stride_dh,
                                 stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
                                 qk_scale, softmax_scale, delta,
                                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                                 CAUSAL: gl.constexpr, ACCUMULATE: gl.constexpr, CONSUMER_REGS: gl.constexpr):
        """Keys [program_id(0) * 128, + 128) of (batch, K/V head) program_id(1): a load warp and two
        compute warpgroups of 64 keys (the kernel's own 4 warps and a worker)."""
        dtype: gl.constexpr = Q.dtype.element_ty
        tile_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
        box: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=tile_smem.swizzle_byte_width,
                                                 element_bitwidth=tile_smem.element_bitwidth, rank=4)
        row_smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
        KV_HEADS = H // GROUP
        # descriptors over the whole tensors: (1, rows, 1, D) boxes of (B, S, H, D); lse/delta rows flat
        q_desc = tma.make_tensor_descriptor(Q, [B, Sq, H, HEAD_DIM], [stride_qb, stride_qs, stride_qh, 1],
                                            [1, BLOCK_M, 1, HEAD_DIM], box)
        do_desc = tma.make_tensor_descriptor(DO, [B, Sq, H, HEAD_DIM], [stride_db, stride_ds, stride_dh, 1],
                                             [1, BLOCK_M, 1, HEAD_DIM], box)
        k_desc = tma.make_tensor_descriptor(K, [B, Sk, KV_HEADS, HEAD_DIM], [stride_kb, stride_ks, stride_kh, 1],
                                            [1, KEYS_PER_GROUP, 1, HEAD_DIM], box)
        v_desc = tma.make_tensor_descriptor(V, [B, Sk, KV_HEADS, HEAD_DIM], [stride_vb, stride_vs, stride_vh, 1],
                                            [1, KEYS_PER_GROUP, 1, HEAD_DIM], box)
        l_desc = tma.make_tensor_descriptor(Lse, [B * H * ROW], [1], [BLOCK_M], row_smem)
        e_desc = tma.make_tensor_descriptor(Delta, [B * H * ROW], [1], [BLOCK_M], row_smem)

        # query-tile slots (streamed) and each warpgroup's K, V rows (kept)
        q_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], tile_smem)
        do_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], tile_smem)
        l_s = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], row_smem)
        e_s = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], row_smem)
        kv_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS_PER_GROUP, HEAD_DIM], dtype)
        k_s = gl.allocate_shared_memory(dtype, [2, KEYS_PER_GROUP, HEAD_DIM], kv_smem)
        v_s = gl.allocate_shared_memory(dtype, [2, KEYS_PER_GROUP, HEAD_DIM], kv_smem)
        # barriers, each kind an allocation of its own (see attention_fwd_gluon._ws_producer): K and V
        # landed per warpgroup; per slot ready (count 1) and free (both warpgroups: count 2)
        bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
        kv_bar = gl.allocate_shared_memory(gl.int64, [4, 1], bar_layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        for i in gl.static_range(4):
            mbarrier.init(kv_bar.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(free.index(i), count=2)
        fence_async_shared()
        causal = 1 if CAUSAL else 0
        accumulate = 1 if ACCUMULATE else 0
        consumer_args = (k_desc, v_desc, DK, DV, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs,
                         stride_dvh, q_s, do_s, l_s, e_s, k_s, v_s, kv_bar, ready, free, Sq, Sk, GROUP, KV_HEADS,
                         qk_scale, softmax_scale, delta, causal, accumulate)
        producer_args = (q_desc, do_desc, l_desc, e_desc, q_s, do_s, l_s, e_s, ready, free, Sq, ROW, H, GROUP,
                         KV_HEADS, delta, causal)
        gl.warp_specialize([(_dkdv_consumer0, consumer_args), (_dkdv_consumer1, consumer_args),
                            (_dkdv_producer, producer_args)], [4, 1], [CONSUMER_REGS, 40])

#: Keys per program (two compute warpgroups of 64).
BLOCK_N = 128
#: Per head dim: query rows per step, query-tile slots, compute registers. On an H100 (bf16, 16
#: heads, B*S = 32K, 4K-32K tokens; benchmarks/probes/bwd_gluon.py) 3 slots were even or slower, and
#: 128 query rows per step spill at both head dims.
CONFIG = {64: (64, 2, 240), 128: (64, 2, 240)}


def supports(q: torch.Tensor, head_dim: int, causal: bool, q_stride: int, k_stride: int) -> bool:
    """Whether the kernel computes this problem (beyond a Hopper GPU, a dense batch and TMA-ready
    q/k/v/dout): what the Gluon forward takes (16-bit inputs, head dim 64 or 128, unit position
    strides if causal)."""
    return fwd_gluon.supports(q, head_dim, causal, q_stride, k_stride, q.dtype)


def tma_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(rows, row length): ``x`` (B, H, Sq) float32 as the kernel reads it, one flat TMA row whose
    (batch, head) rows start 16-byte aligned: ``x`` itself if it is contiguous with Sq a multiple of
    4 at an aligned address, else a copy in rows padded with zeros to a multiple of 4."""
    B, H, Sq = x.shape
    if x.is_contiguous() and Sq % 4 == 0 and x.data_ptr() % 16 == 0:
        return x, Sq
    row = Sq + (-Sq) % 4
    rows = torch.zeros((B, H, row), dtype=x.dtype, device=x.device)
    rows[..., :Sq] = x
    return rows, row


def launch(q, k, v, dout, lse, delta, dk, dv, *, qk_scale: float, softmax_scale: float, causal: bool,
           delta_pos: int = 0, accumulate: bool = False, config: tuple | None = None) -> None:
    """dK (times ``softmax_scale``) and dV of k, v (B, Sk, H_kv, D) into ``dk``, ``dv`` (same shape, unit
    last stride, float32 or 16-bit; added to them if ``accumulate``), from q, dout (B, Sq, H, D), lse
    and delta (B, H, Sq) float32 (``supports``; q/k/v/dout 16-byte aligned with 16-byte multiples for
    every stride but the last). ``qk_scale`` includes log2(e); causal: query i sees key j iff
    j <= i + ``delta_pos``. Needs a global-scratch allocator for the on-device descriptors
    (``attention_fwd.descriptor_scratch``). ``config`` = (BLOCK_M, STAGES, compute registers), for probes."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    if B * Hkv == 0 or Sk == 0:
        return
    if Sq == 0:   # no query: the gradients are zero (a descriptor cannot have an empty dimension)
        if not accumulate:
            dk.zero_()
            dv.zero_()
        return
    if B * H * (Sq + 3) >= 2 ** 31:
        raise ValueError(f"lse of {B * H} rows of {Sq} queries is too long for one TMA row")
    block_m, stages, regs = config or CONFIG[D]
    (lse, row), (delta, _) = tma_rows(lse), tma_rows(delta)
    grid = (cdiv(Sk, BLOCK_N), B * Hkv)
    launch_kernel(_gl_attn_bwd_dkdv_kernel, grid, q, k, v, dout, lse, delta, dk, dv, Sq, Sk, row, B, H, H // Hkv,
                  q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                  v.stride(0), v.stride(1), v.stride(2), dout.stride(0), dout.stride(1),
                  dout.stride(2), dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0),
                  dv.stride(1), dv.stride(2), qk_scale, softmax_scale, int(delta_pos),
                  HEAD_DIM=D, BLOCK_M=block_m, STAGES=stages, CAUSAL=bool(causal),
                  ACCUMULATE=bool(accumulate), CONSUMER_REGS=regs, num_warps=4, **COMPILE_OPTIONS)
