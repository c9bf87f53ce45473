"""Attention forward in Gluon for Hopper: warp-specialized by hand, with the softmax under the matmuls.

Triton 3.6's automatic warp specialization (``attention_fwd``'s WARP_SPEC) takes a key loop with
no branch and waits for every matmul as soon as it is issued. Gluon states the schedule itself:

- a load warp brings Q once and K_j, V_j into ``STAGES`` shared-memory slots (TMA, mbarriers), and
  refills a slot once both compute warpgroups have released it;
- two compute warpgroups take 64 query rows each and walk every key tile; per tile j
  (FlashAttention-3's intra-warpgroup overlap, ``overlap``)

      issue S_j = Q K_j^T;  issue O += P_{j-1} V_{j-1};  wait for S_j only;
      softmax of S_j (runs while P_{j-1} V_{j-1} is on the tensor cores);  wait for O;  O *= alpha_j

- the masked tiles (the causal diagonal, a partial last key tile) are iterations of the same loop
  with a branch, so a causal block needs one launch and no float32 hand-over.

On an H200 (bf16, 16 heads, B*S = 32K) this forward ran at 553-631 TFLOP/s at D=128 for 4K-32K
tokens, causal and not, against 423-603 for the Triton kernels (.notes/attention.md, session 8).

Layouts: q (B, Sq, H, D), k/v (B, Sk, H_kv, D) with unit last stride and 16-byte aligned rows
(TMA), bfloat16 / float16, D = 64 or 128; out (B, Sq, H, D) in q's dtype and lse (B, H, Sq) float32
(natural log), both contiguous; causal: query i sees key j iff j <= i + delta. Rows with no visible
key get out = 0, lse = -inf. One program per 128-row query tile (heaviest first when causal).
"""
from __future__ import annotations

import torch
import triton

try:  # Gluon ships with triton >= 3.5 (the GPU machines have 3.6)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    _cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
except ImportError:  # pragma: no cover - older triton
    gluon = None


if gluon is not None:

    @gluon.jit
    def _issue_tile(desc, row, col, bar, dst):
        """Start the TMA copy of one (rows, D) tile into ``dst``; ``bar`` counts its bytes."""
        mbarrier.expect(bar, desc.block_type.nbytes)
        _tma_load(desc, [row, col], bar, dst)

    @gluon.jit
    def _softmax_tile(s, m_i, l_i, qk_scale, masked, lim, cols):
        """Online-softmax update with one (BLOCK_M, BLOCK_N) score tile ``s`` (float32).

        Scores in log2 units after ``qk_scale``. ``masked``: key c of the tile is visible to row r iff
        c <= lim[r]. Returns (p, m_new, l_new, alpha) with alpha the rescale of the old state."""
        if masked:
            s = gl.where(cols[None, :] <= lim[:, None], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet: p = 0
        p = gl.exp2(s * qk_scale - m_sub[:, None])
        alpha = gl.exp2(m_i - m_sub)
        l_new = l_i * alpha + gl.sum(p, axis=1)
        return p, m_new, l_new, alpha

    @gluon.jit
    def _ws_producer(q_desc, k_desc, v_desc, q_s, k_s, v_s, bars, start_m, n_tiles):
        """Load warp: Q once, then K_j and V_j into slot j % STAGES once both consumers freed it.

        bars: 0 Q ready; 1 + i K ready, 1 + S + i V ready, 1 + 2S + i K free, 1 + 3S + i V free.
        (Partitions take no constexpr arguments: triton 3.6 passes them as int32 values; sizes come
        from the buffers' shapes.)"""
        STAGES: gl.constexpr = k_s.shape[0]
        BLOCK_N: gl.constexpr = k_s.shape[1]
        _issue_tile(q_desc, start_m, 0, bars.index(0), q_s)
        for j in range(n_tiles):
            slot = j % STAGES
            free_phase = ((j // STAGES) & 1) ^ 1  # the slot's previous use (none yet: passes at once)
            mbarrier.wait(bars.index(1 + 2 * STAGES + slot), free_phase, pred=j >= STAGES)
            _issue_tile(k_desc, j * BLOCK_N, 0, bars.index(1 + slot), k_s.index(slot))
            mbarrier.wait(bars.index(1 + 3 * STAGES + slot), free_phase, pred=j >= STAGES)
            _issue_tile(v_desc, j * BLOCK_N, 0, bars.index(1 + STAGES + slot), v_s.index(slot))

    @gluon.jit
    def _ws_consumer(half: gl.constexpr, OVERLAP: gl.constexpr, q_s, k_s, v_s, bars, Lse, o_desc, Sq, Sk, bh,
                     start_m, n_full, n_tiles, qk_scale, delta, causal):
        """One compute warpgroup: rows [half * 64, half * 64 + 64) of the query tile, every key tile.

        OVERLAP: S_j = Q K_j^T and O += P_{j-1} V_{j-1} are in flight together and the softmax of
        S_j runs under the second (see the module doc); else each matmul is waited for at once."""
        BLOCK_M: gl.constexpr = q_s.shape[0]
        HEAD_DIM: gl.constexpr = q_s.shape[1]
        STAGES: gl.constexpr = k_s.shape[0]
        BLOCK_N: gl.constexpr = k_s.shape[1]
        HALF: gl.constexpr = BLOCK_M // 2
        dtype: gl.constexpr = q_s.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        q_h = q_s.slice(half * HALF, HALF, dim=0)
        row0 = start_m + half * HALF
        rows = gl.arange(0, HALF, gl.SliceLayout(1, s_layout))
        cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
        # the last key each row sees (tile 0's columns): causal i + delta, and always before Sk
        lim0 = gl.where(causal != 0, gl.minimum(row0 + rows + delta, Sk - 1), Sk - 1)
        s_zero = gl.zeros([HALF, BLOCK_N], gl.float32, s_layout)
        m_i = gl.full([HALF], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([HALF], gl.float32, gl.SliceLayout(1, s_layout))
        o = gl.zeros([HALF, HEAD_DIM], gl.float32, o_layout)
        mbarrier.wait(bars.index(0), 0)
        if OVERLAP:
            if n_tiles > 0:
                # tile 0: scores, then its softmax; its P V waits for the next tile's scores to be issued
                mbarrier.wait(bars.index(1), 0)
                s_tok = warpgroup_mma(q_h, k_s.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
                s = warpgroup_mma_wait(0, deps=[s_tok])
                mbarrier.arrive(bars.index(1 + 2 * STAGES), count=1)
                p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, n_full == 0, lim0, cols)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
                for j in range(1, n_tiles):
                    slot = j % STAGES
                    prev = (j - 1) % STAGES
                    # S_j and O += P_{j-1} V_{j-1} on the tensor cores; wait for S_j only
                    mbarrier.wait(bars.index(1 + slot), (j // STAGES) & 1)
                    s_tok = warpgroup_mma(q_h, k_s.index(slot).permute((1, 0)), s_zero, use_acc=False,
                                          is_async=True)
                    mbarrier.wait(bars.index(1 + STAGES + prev), ((j - 1) // STAGES) & 1)
                    o_tok = warpgroup_mma(p_op, v_s.index(prev), o, is_async=True)
                    s = warpgroup_mma_wait(1, deps=[s_tok])
                    mbarrier.arrive(bars.index(1 + 2 * STAGES + slot), count=1)
                    # the softmax of tile j runs while P_{j-1} V_{j-1} is in flight
                    p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, j >= n_full, lim0 - j * BLOCK_N,
                                                       cols)
                    o, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
                    mbarrier.arrive(bars.index(1 + 3 * STAGES + prev), count=1)
                    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                    p_op = gl.convert_layout(p.to(dtype), p_layout)
                last = (n_tiles - 1) % STAGES
                mbarrier.wait(bars.index(1 + STAGES + last), ((n_tiles - 1) // STAGES) & 1)
                o_tok = warpgroup_mma(p_op, v_s.index(last), o, is_async=True)
                o = warpgroup_mma_wait(0, deps=[o_tok])
                mbarrier.arrive(bars.index(1 + 3 * STAGES + last), count=1)
        else:
            for j in range(n_tiles):
                slot = j % STAGES
                phase = (j // STAGES) & 1
                # scores of key tile j; the K slot is free again once they are in registers
                mbarrier.wait(bars.index(1 + slot), phase)
                s_tok = warpgroup_mma(q_h, k_s.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
                s = warpgroup_mma_wait(0, deps=[s_tok])
                mbarrier.arrive(bars.index(1 + 2 * STAGES + slot), count=1)
                p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, j >= n_full, lim0 - j * BLOCK_N, cols)
                o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                p_op = gl.convert_layout(p.to(dtype), p_layout)
                mbarrier.wait(bars.index(1 + STAGES + slot), phase)
                o_tok = warpgroup_mma(p_op, v_s.index(slot), o, is_async=True)
                o = warpgroup_mma_wait(0, deps=[o_tok])
                mbarrier.arrive(bars.index(1 + 3 * STAGES + slot), count=1)

        # epilogue: normalize, store this half through its rows of the query buffer, lse
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
        o = o / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
        q_h.store(o.to(dtype))
        fence_async_shared()
        _tma_store(o_desc, [row0, 0], q_h)
        lse = gl.where(l_i > 0.0, (m_i + gl.log2(gl.where(l_i > 0.0, l_i, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        offs_m = row0 + rows
        gl.store(Lse + bh.to(gl.int64) * Sq + offs_m, lse, mask=offs_m < Sq)
        tma.store_wait(0)

    # the compute partitions, one per (warpgroup, schedule): partitions take no constexpr arguments
    @gluon.jit
    def _ws_consumer0(q_s, k_s, v_s, bars, Lse, o_desc, Sq, Sk, bh, start_m, n_full, n_tiles, qk_scale, delta,
                      causal):
        _ws_consumer(0, False, q_s, k_s, v_s, bars, Lse, o_desc, Sq, Sk, bh, start_m, n_full, n_tiles,
                     qk_scale, delta, causal)

    @gluon.jit
    def _ws_consumer1(q_s, k_s, v_s, bars, Lse, o_desc, Sq, Sk, bh, start_m, n_full, n_tiles, qk_scale, delta,
                      causal):
        _ws_consumer(1, False, q_s, k_s, v_s, bars, Lse, o_desc, Sq, Sk, bh, start_m, n_full, n_tiles,
                     qk_scale, delta, causal)

    @gluon.jit
    def _ws_consumer0_overlap(q_s, k_s, v_s, bars, Lse, o_desc, Sq, Sk, bh, start_m, n_full, n_tiles, qk_scale, delta,
                              causal):
        _ws_consumer(0, True, q_s, k_s, v_s, bars, Lse, o_desc, Sq, Sk, bh, start_m, n_full, n_tiles,
                     qk_scale, delta, causal)

    @gluon.jit
    def _ws_consumer1_overlap(q_s, k_s, v_s, bars, Lse, o_desc, Sq, Sk, bh, start_m, n_full, n_tiles, qk_scale, delta,
                              causal):
        _ws_consumer(1, True, q_s, k_s, v_s, bars, Lse, o_desc, Sq, Sk, bh, start_m, n_full, n_tiles,
                     qk_scale, delta, causal)

    @gluon.jit(do_not_specialize=["Sq", "Sk", "delta"])
    def _gl_attn_fwd_ws_kernel(Q, K, V, Out, Lse, Sq, Sk, H, GROUP,
                               stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                               stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
                               qk_scale, delta,
                               HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                               STAGES: gl.constexpr, CAUSAL: gl.constexpr, OVERLAP: gl.constexpr,
                               CONSUMER_REGS: gl.constexpr):
        """Query rows [start_m, start_m + BLOCK_M) of one (batch, head): a load warp and two 64-row
        compute warpgroups (the kernel's own 4 warps and a worker) sharing the K/V slots."""
        dtype: gl.constexpr = Q.dtype.element_ty
        q_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
        kv_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
        o_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M // 2, HEAD_DIM], dtype)
        pid_m = gl.program_id(0)
        if CAUSAL:
            pid_m = gl.num_programs(0) - 1 - pid_m
        bh = gl.program_id(1)
        b = (bh // H).to(gl.int64)
        h = bh % H
        start_m = pid_m * BLOCK_M
        q_desc = tma.make_tensor_descriptor(Q + b * stride_qb + h * stride_qh, [Sq, HEAD_DIM], [stride_qs, 1],
                                            [BLOCK_M, HEAD_DIM], q_smem)
        k_desc = tma.make_tensor_descriptor(K + b * stride_kb + (h // GROUP) * stride_kh, [Sk, HEAD_DIM],
                                            [stride_ks, 1], [BLOCK_N, HEAD_DIM], kv_smem)
        v_desc = tma.make_tensor_descriptor(V + b * stride_vb + (h // GROUP) * stride_vh, [Sk, HEAD_DIM],
                                            [stride_vs, 1], [BLOCK_N, HEAD_DIM], kv_smem)
        o_desc = tma.make_tensor_descriptor(Out + b * stride_ob + h * stride_oh, [Sq, HEAD_DIM], [stride_os, 1],
                                            [BLOCK_M // 2, HEAD_DIM], o_smem)
        # key tiles: [0, n_full) every row sees, [n_full, n_tiles) masked (causal diagonal, a partial
        # last tile); causal: query i sees key j iff j <= i + delta
        if CAUSAL:
            hi = gl.maximum(gl.minimum(start_m + BLOCK_M + delta, Sk), 0)
            n_full = gl.minimum(gl.maximum(start_m + delta + 1, 0) // BLOCK_N, Sk // BLOCK_N)
        else:
            hi = Sk
            n_full = Sk // BLOCK_N
        n_tiles = gl.cdiv(hi, BLOCK_N)

        q_s = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_smem)
        k_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_smem)
        v_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_smem)
        bars = gl.allocate_shared_memory(gl.int64, [1 + 4 * STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bars.index(0), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(1 + i), count=1)
            mbarrier.init(bars.index(1 + STAGES + i), count=1)
            mbarrier.init(bars.index(1 + 2 * STAGES + i), count=2)  # freed by both compute warpgroups
            mbarrier.init(bars.index(1 + 3 * STAGES + i), count=2)
        fence_async_shared()
        consumer_args = (q_s, k_s, v_s, bars, Lse, o_desc, Sq, Sk, bh, start_m, n_full, n_tiles, qk_scale,
                         delta, 1 if CAUSAL else 0)
        producer_args = (q_desc, k_desc, v_desc, q_s, k_s, v_s, bars, start_m, n_tiles)
        if OVERLAP:
            gl.warp_specialize([(_ws_consumer0_overlap, consumer_args), (_ws_consumer1_overlap, consumer_args),
                                (_ws_producer, producer_args)], [4, 1], [CONSUMER_REGS, 40])
        else:
            gl.warp_specialize([(_ws_consumer0, consumer_args), (_ws_consumer1, consumer_args),
                                (_ws_producer, producer_args)], [4, 1], [CONSUMER_REGS, 40])


#: The tile: 128 query rows (two warpgroups of 64), 128 keys per step, K/V slots, compute registers.
BLOCK_M, BLOCK_N, STAGES, CONSUMER_REGS = 128, 128, 2, 232
HEAD_DIMS = (64, 128)
_DTYPES = (torch.float16, torch.bfloat16)


def supports(q: torch.Tensor, head_dim: int, causal: bool, q_stride: int, k_stride: int, out_dtype) -> bool:
    """Whether the kernel computes this problem (beyond ``available`` and TMA-ready strides): 16-bit
    inputs and output, head dim 64 or 128, and, if causal, unit position strides."""
    return (q.dtype in _DTYPES and out_dtype == q.dtype and head_dim in HEAD_DIMS
            and (not causal or (int(q_stride) == 1 and int(k_stride) == 1)))


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *,
           qk_scale: float, causal: bool, delta: int = 0, overlap: bool = True, block_n: int = BLOCK_N,
           stages: int = STAGES, consumer_regs: int = CONSUMER_REGS) -> None:
    """Fill ``out`` (B, Sq, H, D) and ``lse`` (B, H, Sq) contiguous from q (B, Sq, H, D), k, v
    (B, Sk, H_kv, D), 16-bit with 16-byte aligned rows; ``qk_scale`` includes log2(e); causal: query i
    sees key j iff j <= i + delta. Needs a global-scratch allocator for the on-device descriptors
    (``attention_fwd.descriptor_scratch``). ``overlap`` and the sizes are for probes."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    grid = (triton.cdiv(Sq, BLOCK_M), B * H)
    _gl_attn_fwd_ws_kernel[grid](q, k, v, out, lse, Sq, Sk, H, H // Hkv,
                                 q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                                 v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                                 qk_scale, int(delta),
                                 HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=block_n, STAGES=stages, CAUSAL=bool(causal),
                                 OVERLAP=overlap, CONSUMER_REGS=consumer_regs, num_warps=4)
