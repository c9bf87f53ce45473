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
  with a branch, so a causal block needs one launch and no float32 hand-over;
- a persistent grid (one program per multiprocessor) walks the query tiles: the load warp runs
  ahead into the next tile's K/V and each compute warpgroup loads the next tile's Q rows into a
  second buffer while it works on this one, so a tile's start and end are hidden.

On an H200 (bf16, 16 heads, B*S = 32K) this forward ran at 551-622 TFLOP/s at D=128 and 429-477 at
D=64 for 4K-32K tokens, causal and not, against 425-553 and 373-432 for the Triton kernels
(.notes/attention.md, session 9). Triton 3.6 specifics: partitions take no constexpr arguments
(sizes come from the buffers' shapes) and shared-memory shapes are powers of two.

Layouts: q (B, Sq, H, D), k/v (B, Sk, H_kv, D), unit last stride, 16-byte aligned with 16-byte
multiples for the other strides (TMA descriptors over the whole tensors), bfloat16 / float16, D = 64
or 128; out (B, Sq, H, D) in q's dtype or float32 (the ring's block outputs) and lse (B, H, Sq)
float32 (natural log), both contiguous; causal: query i sees key j iff j <= i + delta. Rows with no
visible key get out = 0, lse = -inf. Query tiles are taken head by head (heaviest first when
causal, paired with the lightest).
"""
from __future__ import annotations

import functools

import torch
import triton

from .hostmath import cdiv

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
    TILE_M = gl.constexpr(128)  # query rows per tile: two compute warpgroups of 64

    @gluon.jit
    def _issue_tile(desc, coord, bar, dst):
        """Start the TMA copy of the box at ``coord`` into ``dst``; ``bar`` counts its bytes."""
        mbarrier.expect(bar, desc.block_type.nbytes)
        _tma_load(desc, coord, bar, dst)

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
    def _units(n_m, BH, causal):
        """Work units of the grid: a 128-row query tile of one (batch, head), or, when causal, a pair
        of them (the i-th heaviest and the i-th lightest of a head: equal work per unit)."""
        if causal != 0:
            return BH * ((n_m + 1) // 2)
        return BH * n_m

    @gluon.jit
    def _item(w, n_m, causal):
        """The w-th query tile this program computes: (bh, m, valid). Program p takes units
        p, p + grid, ...; consecutive units share a head, so the programs that run at once read the
        same K/V from L2. A causal unit is tiles n_m-1-i and i of its head (w even, odd); the odd
        half of the middle unit of an odd n_m is not a tile (valid False)."""
        u = gl.program_id(0) + (w // 2 if causal != 0 else w) * gl.num_programs(0)
        if causal != 0:
            per_head = (n_m + 1) // 2
            i = u % per_head
            m = gl.where(w % 2 == 0, n_m - 1 - i, i)
            return u // per_head, m, (w % 2 == 0) | (m != n_m - 1 - i)
        return u // n_m, u % n_m, u >= 0

    @gluon.jit
    def _n_items(n_m, BH, causal):
        """How many w this program walks (``_item``)."""
        n = gl.cdiv(gl.maximum(_units(n_m, BH, causal) - gl.program_id(0), 0), gl.num_programs(0))
        return gl.where(causal != 0, 2 * n, n)

    @gluon.jit
    def _key_tiles(start_m, Sk, delta, causal, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """Key tiles of query rows [start_m, start_m + BLOCK_M): [0, n_full) every row sees, [n_full,
        n_tiles) masked (causal diagonal, a partial last tile); causal: query i sees key j iff
        j <= i + delta."""
        if causal != 0:
            hi = gl.maximum(gl.minimum(start_m + BLOCK_M + delta, Sk), 0)
            n_full = gl.minimum(gl.maximum(start_m + delta + 1, 0) // BLOCK_N, Sk // BLOCK_N)
        else:
            hi = Sk
            n_full = Sk // BLOCK_N
        return n_full, gl.cdiv(hi, BLOCK_N)

    @gluon.jit
    def _tile_view(buf):
        """A (rows, D) shared-memory tile seen as the (1, rows, 1, D) box of a (B, S, H, D) descriptor."""
        return buf._reinterpret(buf.dtype, [1, buf.shape[0], 1, buf.shape[1]],
                                gl.NVMMASharedLayout(swizzle_byte_width=buf.type.layout.swizzle_byte_width,
                                                     element_bitwidth=buf.type.layout.element_bitwidth, rank=4))

    @gluon.jit
    def _ws_producer(k_desc, v_desc, k_s, v_s, k_ready, v_ready, k_free, v_free, Sk, H, GROUP, n_m, BH, delta,
                     causal):
        """Load warp: for each query tile of the program (``_item``), K_j and V_j into slot g % STAGES
        (g counts the program's key tiles) once both compute warpgroups freed it; it runs ahead into
        the next query tile while the compute warpgroups finish one.

        One barrier per slot in each of k_ready, v_ready (the copy landed; count 1) and k_free, v_free
        (both warpgroups are done with it; count 2). Each kind is an allocation of its own: Gluon
        puts a warpgroup barrier before an mbarrier operation that follows another on the same
        allocation. (Partitions take no constexpr arguments: triton 3.6 passes them as int32 values;
        sizes come from the buffers' shapes.)"""
        STAGES: gl.constexpr = k_s.shape[0]
        BLOCK_N: gl.constexpr = k_s.shape[1]
        g = 0
        for w in range(_n_items(n_m, BH, causal)):
            bh, m, valid = _item(w, n_m, causal)
            if valid:
                n_full, n_tiles = _key_tiles(m * TILE_M, Sk, delta, causal, TILE_M, BLOCK_N)
                b = bh // H
                hk = (bh % H) // GROUP
                for j in range(n_tiles):
                    slot = g % STAGES
                    free_phase = ((g // STAGES) & 1) ^ 1  # the slot's previous use (none yet: passes at once)
                    mbarrier.wait(k_free.index(slot), free_phase, pred=g >= STAGES)
                    _issue_tile(k_desc, [b, j * BLOCK_N, hk, 0], k_ready.index(slot), _tile_view(k_s.index(slot)))
                    mbarrier.wait(v_free.index(slot), free_phase, pred=g >= STAGES)
                    _issue_tile(v_desc, [b, j * BLOCK_N, hk, 0], v_ready.index(slot), _tile_view(v_s.index(slot)))
                    g += 1

    @gluon.jit
    def _ws_consumer(part: gl.constexpr, q_desc, o_desc, o_ptr, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s,
                     q_bar, k_ready, v_ready, k_free, v_free, Lse, Sq, Sk, H, n_m, BH, qk_scale, delta, causal):
        """One compute warpgroup: rows [part * 64, + 64) of each of the program's query tiles, every key
        tile. Its Q rows come through two buffers (the next tile's load is issued as this one starts);
        its O rows leave through ``o_s`` and TMA (16-bit O, ``o_desc``) or by pointers from ``o_ptr``
        (float32 O, the ring's block outputs). S_j = Q K_j^T and O += P_{j-1} V_{j-1} are in flight
        together and the softmax of S_j runs under the second (see the module doc)."""
        ROWS: gl.constexpr = q_s.shape[1]
        HEAD_DIM: gl.constexpr = q_s.shape[2]
        STAGES: gl.constexpr = k_s.shape[0]
        BLOCK_N: gl.constexpr = k_s.shape[1]
        dtype: gl.constexpr = q_s.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        rows = gl.arange(0, ROWS, gl.SliceLayout(1, s_layout))
        cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
        s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
        n_items = _n_items(n_m, BH, causal)
        if n_items > 0:  # the first tile's Q rows (item 0 is always a tile)
            bh0, m0, valid0 = _item(0, n_m, causal)
            _issue_tile(q_desc, [bh0 // H, m0 * TILE_M + part * ROWS, bh0 % H, 0], q_bar.index(2 * part),
                        _tile_view(q_s.index(2 * part)))
        g = 0  # key tiles walked so far (their slots and phases)
        c = 0  # query tiles done so far (their Q buffers and phases)
        for w in range(n_items):
            bh, m, valid = _item(w, n_m, causal)
            if valid:
                b = bh // H
                h = bh % H
                row0 = m * TILE_M + part * ROWS
                q_p = q_s.index(2 * part + c % 2)
                # start the next tile's Q rows into the other buffer (its last reader finished)
                nb, nm, nvalid = _item(w + 1, n_m, causal)
                step = gl.where(nvalid, 1, 2)
                nb, nm, nvalid = _item(w + step, n_m, causal)
                if w + step < n_items:
                    _issue_tile(q_desc, [nb // H, nm * TILE_M + part * ROWS, nb % H, 0],
                                q_bar.index(2 * part + (c + 1) % 2), _tile_view(q_s.index(2 * part + (c + 1) % 2)))
                n_full, n_tiles = _key_tiles(m * TILE_M, Sk, delta, causal, TILE_M, BLOCK_N)
                # the last key each row sees (tile 0's columns): causal i + delta, and always before Sk
                lim0 = gl.where(causal != 0, gl.minimum(row0 + rows + delta, Sk - 1), Sk - 1)
                m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
                l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
                o = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
                mbarrier.wait(q_bar.index(2 * part + c % 2), (c // 2) & 1)
                if n_tiles > 0:
                    # tile 0: scores, then its softmax; its P V waits for the next tile's scores to be issued
                    slot = g % STAGES
                    mbarrier.wait(k_ready.index(slot), (g // STAGES) & 1)
                    s_tok = warpgroup_mma(q_p, k_s.index(slot).permute((1, 0)), s_zero, use_acc=False,
                                          is_async=True)
                    s = warpgroup_mma_wait(0, deps=[s_tok])
                    mbarrier.arrive(k_free.index(slot), count=1)
                    p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, n_full == 0, lim0, cols)
                    p_op = gl.convert_layout(p.to(dtype), p_layout)
                    for j in range(1, n_tiles):
                        slot = (g + j) % STAGES
                        prev = (g + j - 1) % STAGES
                        # S_j and O += P_{j-1} V_{j-1} on the tensor cores; wait for S_j only
                        mbarrier.wait(k_ready.index(slot), ((g + j) // STAGES) & 1)
                        s_tok = warpgroup_mma(q_p, k_s.index(slot).permute((1, 0)), s_zero, use_acc=False,
                                              is_async=True)
                        mbarrier.wait(v_ready.index(prev), ((g + j - 1) // STAGES) & 1)
                        o_tok = warpgroup_mma(p_op, v_s.index(prev), o, is_async=True)
                        s = warpgroup_mma_wait(1, deps=[s_tok])
                        mbarrier.arrive(k_free.index(slot), count=1)
                        # the softmax of tile j runs while P_{j-1} V_{j-1} is in flight
                        p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, j >= n_full,
                                                           lim0 - j * BLOCK_N, cols)
                        o, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
                        mbarrier.arrive(v_free.index(prev), count=1)
                        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                        p_op = gl.convert_layout(p.to(dtype), p_layout)
                    last = (g + n_tiles - 1) % STAGES
                    mbarrier.wait(v_ready.index(last), ((g + n_tiles - 1) // STAGES) & 1)
                    o_tok = warpgroup_mma(p_op, v_s.index(last), o, is_async=True)
                    o = warpgroup_mma_wait(0, deps=[o_tok])
                    mbarrier.arrive(v_free.index(last), count=1)
                g += n_tiles
                c += 1

                # epilogue: normalize, store these rows (TMA from o_s, or pointers), lse
                l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
                o = o / gl.where(l_o > 0.0, l_o, 1.0)[:, None]
                if o_ptr.dtype.element_ty == dtype:
                    o_p = o_s.index(part)
                    tma.store_wait(0)  # the previous tile's rows have left o_s
                    o_p.store(o.to(dtype))
                    fence_async_shared()
                    _tma_store(o_desc, [b, row0, h, 0], _tile_view(o_p))
                else:
                    rows_o = row0 + gl.arange(0, ROWS, gl.SliceLayout(1, o_layout))
                    cols_o = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
                    o_base = o_ptr + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
                    gl.store(o_base + rows_o.to(gl.int64)[:, None] * stride_os + cols_o[None, :],
                             o.to(o_ptr.dtype.element_ty), mask=(rows_o < Sq)[:, None])
                lse = gl.where(l_i > 0.0, (m_i + gl.log2(gl.where(l_i > 0.0, l_i, 1.0))) * 0.6931471805599453,
                               float("-inf"))
                offs_m = row0 + rows
                gl.store(Lse + bh.to(gl.int64) * Sq + offs_m, lse, mask=offs_m < Sq)
        tma.store_wait(0)

    # the compute partitions, one per warpgroup (partitions take no constexpr arguments)
    @gluon.jit
    def _ws_consumer0(q_desc, o_desc, o_ptr, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s, q_bar, k_ready,
                      v_ready, k_free, v_free, Lse, Sq, Sk, H, n_m, BH, qk_scale, delta, causal):
        _ws_consumer(0, q_desc, o_desc, o_ptr, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s, q_bar, k_ready,
                     v_ready, k_free, v_free, Lse, Sq, Sk, H, n_m, BH, qk_scale, delta, causal)

    @gluon.jit
    def _ws_consumer1(q_desc, o_desc, o_ptr, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s, q_bar, k_ready,
                      v_ready, k_free, v_free, Lse, Sq, Sk, H, n_m, BH, qk_scale, delta, causal):
        _ws_consumer(1, q_desc, o_desc, o_ptr, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s, q_bar, k_ready,
                     v_ready, k_free, v_free, Lse, Sq, Sk, H, n_m, BH, qk_scale, delta, causal)

    @gluon.jit(do_not_specialize=["Sq", "Sk", "delta"])
    def _gl_attn_fwd_ws_kernel(Q, K, V, Out, Lse, Sq, Sk, B, H, GROUP,
                               stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                               stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
                               qk_scale, delta,
                               HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                               STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr):
        """Query tiles of 128 rows (program p: units p, p + grid, ... of ``_item``; a grid of one
        program per unit, or a persistent one): a load warp and two compute warpgroups of 64 rows
        (the kernel's own 4 warps and a worker) sharing the K/V slots. (Three warpgroups of 64 rows,
        as FlashAttention-3 takes at D=64, measured 10-15% slower here.)"""
        gl.static_assert(BLOCK_M == TILE_M, "two compute warpgroups of 64 rows")
        dtype: gl.constexpr = Q.dtype.element_ty
        tile_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, HEAD_DIM], dtype)
        box: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=tile_smem.swizzle_byte_width,
                                                 element_bitwidth=tile_smem.element_bitwidth, rank=4)
        n_m = gl.cdiv(Sq, BLOCK_M)
        # descriptors over the whole (B, S, H, D) tensors: boxes of (1, rows, 1, D)
        q_desc = tma.make_tensor_descriptor(Q, [B, Sq, H, HEAD_DIM], [stride_qb, stride_qs, stride_qh, 1],
                                            [1, 64, 1, HEAD_DIM], box)
        k_desc = tma.make_tensor_descriptor(K, [B, Sk, H // GROUP, HEAD_DIM], [stride_kb, stride_ks, stride_kh, 1],
                                            [1, BLOCK_N, 1, HEAD_DIM], box)
        v_desc = tma.make_tensor_descriptor(V, [B, Sk, H // GROUP, HEAD_DIM], [stride_vb, stride_vs, stride_vh, 1],
                                            [1, BLOCK_N, 1, HEAD_DIM], box)
        if Out.dtype.element_ty == dtype:   # 16-bit O leaves through o_s and TMA
            o_desc = tma.make_tensor_descriptor(Out, [B, Sq, H, HEAD_DIM], [stride_ob, stride_os, stride_oh, 1],
                                                [1, 64, 1, HEAD_DIM], box)
        else:   # float32 O by pointers (the descriptor argument is then unused)
            o_desc = q_desc

        # per compute warpgroup: two Q buffers and one O buffer; K/V slots shared
        q_s = gl.allocate_shared_memory(dtype, [4, 64, HEAD_DIM], tile_smem)
        o_s = gl.allocate_shared_memory(dtype, [2, 64, HEAD_DIM], tile_smem)
        kv_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
        k_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_smem)
        v_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_smem)
        # barriers (see _ws_producer), each kind an allocation of its own: each Q buffer, and per slot
        # K ready, V ready, K free, V free
        bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
        q_bar = gl.allocate_shared_memory(gl.int64, [4, 1], bar_layout)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        for i in gl.static_range(4):
            mbarrier.init(q_bar.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_free.index(i), count=2)  # freed by both compute warpgroups
            mbarrier.init(v_free.index(i), count=2)
        fence_async_shared()
        causal = 1 if CAUSAL else 0
        consumer_args = (q_desc, o_desc, Out, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s, q_bar, k_ready,
                         v_ready, k_free, v_free, Lse, Sq, Sk, H, n_m, B * H, qk_scale, delta, causal)
        producer_args = (k_desc, v_desc, k_s, v_s, k_ready, v_ready, k_free, v_free, Sk, H, GROUP, n_m, B * H, delta,
                         causal)
        gl.warp_specialize([(_ws_consumer0, consumer_args), (_ws_consumer1, consumer_args),
                            (_ws_producer, producer_args)], [4, 1], [CONSUMER_REGS, 40])

#: The tile: query rows (64 per compute warpgroup), keys per step, K/V slots, compute registers.
BLOCK_M, BLOCK_N, STAGES, CONSUMER_REGS = 128, 128, 2, 232
#: One program per multiprocessor walking the query tiles (else one program per unit of work).
PERSISTENT = True
HEAD_DIMS = (64, 128)
_DTYPES = (torch.float16, torch.bfloat16)


def supports(q: torch.Tensor, head_dim: int, causal: bool, q_stride: int, k_stride: int, out_dtype) -> bool:
    """Whether the kernel computes this problem (beyond a Hopper GPU and TMA-ready strides): 16-bit
    inputs, the output in their dtype or float32, head dim 64 or 128, and, if causal, unit position
    strides."""
    return (q.dtype in _DTYPES and out_dtype in (q.dtype, torch.float32) and head_dim in HEAD_DIMS
            and (not causal or (int(q_stride) == 1 and int(k_stride) == 1)))


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def grid_size(q: torch.Tensor, causal: bool, persistent: bool = PERSISTENT) -> int:
    """Programs of a launch on q (B, Sq, H, D): one per unit of work (a 128-row query tile, or when
    causal a pair of them), or with ``persistent`` at most one per multiprocessor."""
    B, Sq, H, _ = q.shape
    n_m = cdiv(Sq, BLOCK_M)
    units = B * H * ((n_m + 1) // 2 if causal else n_m)
    return min(units, _multiprocessors(q.device.index or 0)) if persistent else units


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *,
           qk_scale: float, causal: bool, delta: int = 0, block_n: int = BLOCK_N, stages: int = STAGES,
           consumer_regs: int = CONSUMER_REGS, persistent: bool = PERSISTENT) -> None:
    """Fill ``out`` (B, Sq, H, D; q's dtype or float32) and ``lse`` (B, H, Sq), contiguous, from q
    (B, Sq, H, D), k, v (B, Sk, H_kv, D), 16-bit, 16-byte aligned with 16-byte multiples for every
    stride but the last; ``qk_scale`` includes log2(e); causal: query i sees key j iff j <= i + delta.
    Needs a global-scratch allocator for the on-device descriptors (``attention_fwd.descriptor_scratch``).
    The sizes and ``persistent`` are for probes."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    if B * H == 0 or Sq == 0:
        return
    if Sk == 0:   # no key at all (a descriptor cannot have an empty dimension): every row sees nothing
        out.zero_()
        lse.fill_(float("-inf"))
        return
    grid = (grid_size(q, causal, persistent),)
    _gl_attn_fwd_ws_kernel[grid](q, k, v, out, lse, Sq, Sk, B, H, H // Hkv,
                                 q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                                 v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                                 qk_scale, int(delta),
                                 HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=block_n, STAGES=stages, CAUSAL=bool(causal),
                                 CONSUMER_REGS=consumer_regs, num_warps=4)
