"""Attention forward in Gluon for Hopper: warp-specialized by hand, with the softmax under the matmuls.

Triton 3.6's automatic warp specialization (``attention_fwd``'s WARP_SPEC) takes a key loop with
no branch and waits for every matmul as soon as it is issued. Gluon states the schedule itself:

- a load warp brings K_j, V_j into ``STAGES`` shared-memory slots (TMA, mbarriers) and refills a
  slot once both compute warpgroups have released it;
- two compute warpgroups load 64 query rows each and walk every key tile; per tile j
  (FlashAttention-3's intra-warpgroup overlap)

      issue S_j = Q K_j^T;  issue O += P_{j-1} V_{j-1};  wait for S_j only;
      softmax of S_j (runs while P_{j-1} V_{j-1} is on the tensor cores);  wait for O;  O *= alpha_j

- the masked tiles (the causal diagonal, a partial last key tile) are iterations of the same loop
  with a branch, so a causal block needs one launch and no float32 hand-over.

On an H200 (bf16, 16 heads, B*S = 32K) this forward ran at 553-631 TFLOP/s at D=128 for 4K-32K
tokens, causal and not, against 423-603 for the Triton kernels (.notes/attention.md, session 8).
Triton 3.6 specifics: partitions take no constexpr arguments (sizes come from the buffers' shapes)
and shared-memory shapes are powers of two.

Layouts: q (B, Sq, H, D), k/v (B, Sk, H_kv, D) with unit last stride and 16-byte aligned rows
(TMA), bfloat16 / float16, D = 64 or 128; out (B, Sq, H, D) in q's dtype or float32 (the ring's
block outputs) and lse (B, H, Sq) float32 (natural log), both contiguous; causal: query i sees key
j iff j <= i + delta. Rows with no visible key get out = 0, lse = -inf. One program per 128-row
query tile (heaviest first when causal).
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
    def _ws_producer(k_desc, v_desc, q_s, k_s, v_s, bars, n_tiles):
        """Load warp: K_j and V_j into slot j % STAGES once every compute warpgroup freed it.

        bars: Q of warpgroup c at c (c < Q_SLOTS, the length of q_s); then from Q_SLOTS: K ready (S
        slots), V ready, K free, V free. (Partitions take no constexpr arguments: triton 3.6 passes
        them as int32 values; sizes come from the buffers' shapes.)"""
        Q_SLOTS: gl.constexpr = q_s.shape[0]
        STAGES: gl.constexpr = k_s.shape[0]
        BLOCK_N: gl.constexpr = k_s.shape[1]
        for j in range(n_tiles):
            slot = j % STAGES
            free_phase = ((j // STAGES) & 1) ^ 1  # the slot's previous use (none yet: passes at once)
            mbarrier.wait(bars.index(Q_SLOTS + 2 * STAGES + slot), free_phase, pred=j >= STAGES)
            _issue_tile(k_desc, j * BLOCK_N, 0, bars.index(Q_SLOTS + slot), k_s.index(slot))
            mbarrier.wait(bars.index(Q_SLOTS + 3 * STAGES + slot), free_phase, pred=j >= STAGES)
            _issue_tile(v_desc, j * BLOCK_N, 0, bars.index(Q_SLOTS + STAGES + slot), v_s.index(slot))

    @gluon.jit
    def _ws_consumer(part: gl.constexpr, q_desc, o_desc, o_ptr, stride_os, q_s, k_s, v_s, bars, Lse, Sq, Sk, bh,
                     start_m, n_full, n_tiles, qk_scale, delta, causal):
        """One compute warpgroup: query rows [start_m + part * 64, + 64), every key tile; it loads
        its rows of Q itself and stores its rows of O through the same buffer (16-bit O, ``o_desc``)
        or by pointers from ``o_ptr`` (float32 O, the ring's block outputs). S_j = Q K_j^T and
        O += P_{j-1} V_{j-1} are in flight together and the softmax of S_j runs under the second
        (see the module doc)."""
        Q_SLOTS: gl.constexpr = q_s.shape[0]
        ROWS: gl.constexpr = q_s.shape[1]
        HEAD_DIM: gl.constexpr = q_s.shape[2]
        STAGES: gl.constexpr = k_s.shape[0]
        BLOCK_N: gl.constexpr = k_s.shape[1]
        K_READY: gl.constexpr = Q_SLOTS
        V_READY: gl.constexpr = Q_SLOTS + STAGES
        K_FREE: gl.constexpr = Q_SLOTS + 2 * STAGES
        V_FREE: gl.constexpr = Q_SLOTS + 3 * STAGES
        dtype: gl.constexpr = q_s.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        q_p = q_s.index(part)
        row0 = start_m + part * ROWS
        _issue_tile(q_desc, row0, 0, bars.index(part), q_p)
        rows = gl.arange(0, ROWS, gl.SliceLayout(1, s_layout))
        cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
        # the last key each row sees (tile 0's columns): causal i + delta, and always before Sk
        lim0 = gl.where(causal != 0, gl.minimum(row0 + rows + delta, Sk - 1), Sk - 1)
        s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
        o = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
        mbarrier.wait(bars.index(part), 0)
        if n_tiles > 0:
            # tile 0: scores, then its softmax; its P V waits for the next tile's scores to be issued
            mbarrier.wait(bars.index(K_READY), 0)
            s_tok = warpgroup_mma(q_p, k_s.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=[s_tok])
            mbarrier.arrive(bars.index(K_FREE), count=1)
            p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, n_full == 0, lim0, cols)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            for j in range(1, n_tiles):
                slot = j % STAGES
                prev = (j - 1) % STAGES
                # S_j and O += P_{j-1} V_{j-1} on the tensor cores; wait for S_j only
                mbarrier.wait(bars.index(K_READY + slot), (j // STAGES) & 1)
                s_tok = warpgroup_mma(q_p, k_s.index(slot).permute((1, 0)), s_zero, use_acc=False,
                                      is_async=True)
                mbarrier.wait(bars.index(V_READY + prev), ((j - 1) // STAGES) & 1)
                o_tok = warpgroup_mma(p_op, v_s.index(prev), o, is_async=True)
                s = warpgroup_mma_wait(1, deps=[s_tok])
                mbarrier.arrive(bars.index(K_FREE + slot), count=1)
                # the softmax of tile j runs while P_{j-1} V_{j-1} is in flight
                p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, j >= n_full, lim0 - j * BLOCK_N,
                                                   cols)
                o, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
                mbarrier.arrive(bars.index(V_FREE + prev), count=1)
                o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                p_op = gl.convert_layout(p.to(dtype), p_layout)
            last = (n_tiles - 1) % STAGES
            mbarrier.wait(bars.index(V_READY + last), ((n_tiles - 1) // STAGES) & 1)
            o_tok = warpgroup_mma(p_op, v_s.index(last), o, is_async=True)
            o = warpgroup_mma_wait(0, deps=[o_tok])
            mbarrier.arrive(bars.index(V_FREE + last), count=1)

        # epilogue: normalize, store these rows through their part of the query buffer, lse
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
        o = o / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
        if o_ptr.dtype.element_ty == dtype:
            q_p.store(o.to(dtype))
            fence_async_shared()
            _tma_store(o_desc, [row0, 0], q_p)
        else:
            rows_o = row0 + gl.arange(0, ROWS, gl.SliceLayout(1, o_layout))
            cols_o = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
            gl.store(o_ptr + rows_o.to(gl.int64)[:, None] * stride_os + cols_o[None, :],
                     o.to(o_ptr.dtype.element_ty), mask=(rows_o < Sq)[:, None])
        lse = gl.where(l_i > 0.0, (m_i + gl.log2(gl.where(l_i > 0.0, l_i, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        offs_m = row0 + rows
        gl.store(Lse + bh.to(gl.int64) * Sq + offs_m, lse, mask=offs_m < Sq)
        tma.store_wait(0)

    # the compute partitions, one per warpgroup (partitions take no constexpr arguments)
    @gluon.jit
    def _ws_consumer0(q_desc, o_desc, o_ptr, stride_os, q_s, k_s, v_s, bars, Lse, Sq, Sk, bh, start_m, n_full,
                      n_tiles, qk_scale, delta, causal):
        _ws_consumer(0, q_desc, o_desc, o_ptr, stride_os, q_s, k_s, v_s, bars, Lse, Sq, Sk, bh, start_m,
                     n_full, n_tiles, qk_scale, delta, causal)

    @gluon.jit
    def _ws_consumer1(q_desc, o_desc, o_ptr, stride_os, q_s, k_s, v_s, bars, Lse, Sq, Sk, bh, start_m, n_full,
                      n_tiles, qk_scale, delta, causal):
        _ws_consumer(1, q_desc, o_desc, o_ptr, stride_os, q_s, k_s, v_s, bars, Lse, Sq, Sk, bh, start_m,
                     n_full, n_tiles, qk_scale, delta, causal)

    @gluon.jit(do_not_specialize=["Sq", "Sk", "delta"])
    def _gl_attn_fwd_ws_kernel(Q, K, V, Out, Lse, Sq, Sk, H, GROUP,
                               stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                               stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
                               qk_scale, delta,
                               HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                               STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr):
        """Query rows [start_m, start_m + 128) of one (batch, head): a load warp and two compute
        warpgroups of 64 rows (the kernel's own 4 warps and a worker) sharing the K/V slots. (Three
        warpgroups of 64 rows, as FlashAttention-3 takes at D=64, measured 10-15% slower here.)"""
        gl.static_assert(BLOCK_M == 128, "two compute warpgroups of 64 rows")
        dtype: gl.constexpr = Q.dtype.element_ty
        # each compute warpgroup's 64 rows of Q (and later of O) in a slot of their own
        Q_SLOTS: gl.constexpr = BLOCK_M // 64
        q_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, HEAD_DIM], dtype)
        kv_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
        pid_m = gl.program_id(0)
        if CAUSAL:
            pid_m = gl.num_programs(0) - 1 - pid_m
        bh = gl.program_id(1)
        b = (bh // H).to(gl.int64)
        h = bh % H
        start_m = pid_m * BLOCK_M
        q_desc = tma.make_tensor_descriptor(Q + b * stride_qb + h * stride_qh, [Sq, HEAD_DIM], [stride_qs, 1],
                                            [64, HEAD_DIM], q_smem)
        k_desc = tma.make_tensor_descriptor(K + b * stride_kb + (h // GROUP) * stride_kh, [Sk, HEAD_DIM],
                                            [stride_ks, 1], [BLOCK_N, HEAD_DIM], kv_smem)
        v_desc = tma.make_tensor_descriptor(V + b * stride_vb + (h // GROUP) * stride_vh, [Sk, HEAD_DIM],
                                            [stride_vs, 1], [BLOCK_N, HEAD_DIM], kv_smem)
        o_ptr = Out + b * stride_ob + h * stride_oh
        if Out.dtype.element_ty == dtype:   # 16-bit O leaves through a query slot and TMA
            o_desc = tma.make_tensor_descriptor(o_ptr, [Sq, HEAD_DIM], [stride_os, 1], [64, HEAD_DIM], q_smem)
        else:   # float32 O by pointers (the descriptor argument is then unused)
            o_desc = q_desc
        # key tiles: [0, n_full) every row sees, [n_full, n_tiles) masked (causal diagonal, a partial
        # last tile); causal: query i sees key j iff j <= i + delta
        if CAUSAL:
            hi = gl.maximum(gl.minimum(start_m + BLOCK_M + delta, Sk), 0)
            n_full = gl.minimum(gl.maximum(start_m + delta + 1, 0) // BLOCK_N, Sk // BLOCK_N)
        else:
            hi = Sk
            n_full = Sk // BLOCK_N
        n_tiles = gl.cdiv(hi, BLOCK_N)

        q_s = gl.allocate_shared_memory(dtype, [Q_SLOTS, 64, HEAD_DIM], q_smem)
        k_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_smem)
        v_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_smem)
        # barriers (see _ws_producer): Q of each warpgroup, then per slot K ready, V ready, K free, V free
        bars = gl.allocate_shared_memory(gl.int64, [Q_SLOTS + 4 * STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(Q_SLOTS):
            mbarrier.init(bars.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(Q_SLOTS + i), count=1)
            mbarrier.init(bars.index(Q_SLOTS + STAGES + i), count=1)
            mbarrier.init(bars.index(Q_SLOTS + 2 * STAGES + i), count=Q_SLOTS)  # freed by both warpgroups
            mbarrier.init(bars.index(Q_SLOTS + 3 * STAGES + i), count=Q_SLOTS)
        fence_async_shared()
        consumer_args = (q_desc, o_desc, o_ptr, stride_os, q_s, k_s, v_s, bars, Lse, Sq, Sk, bh, start_m, n_full,
                         n_tiles, qk_scale, delta, 1 if CAUSAL else 0)
        producer_args = (k_desc, v_desc, q_s, k_s, v_s, bars, n_tiles)
        gl.warp_specialize([(_ws_consumer0, consumer_args), (_ws_consumer1, consumer_args),
                            (_ws_producer, producer_args)], [4, 1], [CONSUMER_REGS, 40])

#: The tile: query rows (64 per compute warpgroup), keys per step, K/V slots, compute registers.
BLOCK_M, BLOCK_N, STAGES, CONSUMER_REGS = 128, 128, 2, 232
HEAD_DIMS = (64, 128)
_DTYPES = (torch.float16, torch.bfloat16)


def supports(q: torch.Tensor, head_dim: int, causal: bool, q_stride: int, k_stride: int, out_dtype) -> bool:
    """Whether the kernel computes this problem (beyond a Hopper GPU and TMA-ready strides): 16-bit
    inputs, the output in their dtype or float32, head dim 64 or 128, and, if causal, unit position
    strides."""
    return (q.dtype in _DTYPES and out_dtype in (q.dtype, torch.float32) and head_dim in HEAD_DIMS
            and (not causal or (int(q_stride) == 1 and int(k_stride) == 1)))


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *,
           qk_scale: float, causal: bool, delta: int = 0, block_n: int = BLOCK_N, stages: int = STAGES,
           consumer_regs: int = CONSUMER_REGS) -> None:
    """Fill ``out`` (B, Sq, H, D; q's dtype or float32) and ``lse`` (B, H, Sq), contiguous, from q
    (B, Sq, H, D), k, v (B, Sk, H_kv, D), 16-bit with 16-byte aligned rows; ``qk_scale`` includes
    log2(e); causal: query i sees key j iff j <= i + delta. Needs a global-scratch allocator for the
    on-device descriptors (``attention_fwd.descriptor_scratch``). The sizes are for probes."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    grid = (triton.cdiv(Sq, BLOCK_M), B * H)
    _gl_attn_fwd_ws_kernel[grid](q, k, v, out, lse, Sq, Sk, H, H // Hkv,
                                 q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                                 v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                                 qk_scale, int(delta),
                                 HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=block_n, STAGES=stages, CAUSAL=bool(causal),
                                 CONSUMER_REGS=consumer_regs, num_warps=4)
