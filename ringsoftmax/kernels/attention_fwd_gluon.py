"""Attention forward in Gluon for Hopper: warp-specialized by hand, with the softmax under the matmuls.

Triton 3.6's automatic warp specialization (``attention_fwd``'s WARP_SPEC) takes a key loop with
no branch and waits for every matmul as soon as it is issued. Gluon states the schedule itself:

- a load warp brings K_j, V_j into ``STAGES`` shared-memory slots (TMA, mbarriers) and refills a
  slot once both compute warpgroups have released it;
- two compute warpgroups load 64 query rows each and walk every key tile; per tile j
  (FlashAttention-3's intra-warpgroup overlap in the source)

      issue S_j = Q K_j^T;  issue O += P_{j-1} V_{j-1};  wait for K_{j+1};  wait for S_j only;
      softmax of S_j;  wait for O;  O *= alpha_j

  ptxas (triton 3.6, sm_90a) moves the wait for O to the softmax's start: P_j's conversions reuse
  P_{j-1}'s registers. Each warpgroup's tile is then one chain (K wait, S, P V, softmax) and the
  other warpgroup's matmuls run under its softmax (``benchmarks/probes/fa_timeline.py``: at D=64 a
  key tile every ~1960 cycles per warpgroup, the tensor cores busy about half of them; keeping
  P_{j-1} alive so the softmax runs under its own P V measured 0.4-4.4% slower at D=64, session 24).
  Kept off that chain: K_{j+1}'s wait, which runs while S_j and P_{j-1} V_{j-1} are on the tensor
  cores, and the row sums' shuffles (each lane keeps its share, ``_lane_row_sums``, added once per
  query tile). Together -2.4 to +4.5% over 28 cells at D=64 and 128, 25 of them ahead, on an H200
  (session 24);

- the masked tiles (the causal diagonal, a partial last key tile) are iterations of the same loop
  with a branch, so a causal block needs one launch and no float32 hand-over;
- a persistent grid (one program per multiprocessor) walks the query tiles: the load warp runs
  ahead into the next tile's K/V and each compute warpgroup loads the next tile's Q rows into a
  second buffer while it works on this one, so a tile's start and end are hidden;
- a split grid where the query tiles fill only a few waves of it (``split_grid``; no causal mask):
  the last one to two waves' (tile, key tile) steps are shared out evenly, a tile cut between
  programs leaves float32 pieces that the last one to finish merges with the LSE rule (a counter per
  tile, no waiting), so no multiprocessor idles while others finish the last tiles: 1.1-5x the
  unsplit grid at 0.01-4 waves with 8K-32K keys (H200, session 23).

On an H200 (bf16, 16 heads, B*S = 32K) this forward ran at 551-622 TFLOP/s at D=128 and 429-477 at
D=64 for 4K-32K tokens, causal and not, against 425-553 and 373-432 for the Triton kernels
(.notes/attention.md, session 9). Triton 3.6 specifics: partitions take no constexpr arguments
(sizes come from the buffers' shapes, whether the grid is split from a pointer's dtype) and
shared-memory shapes are powers of two. D=64 blocks without a causal mask take tiles of 192 query
rows (three compute warpgroups, as FlashAttention-3 does at D=64; see ``TILES``), whose 160 registers
per thread leave ptxas less room: their row max and row sums reduce by shallow trees (``_row_max``),
which it compiles with fewer spills. A last tile's warpgroups whose rows all lie past the block only
pass the K/V slots on.

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

from .compile_options import COMPILE_OPTIONS
from .gluon_compat import (fence_async_shared, gl, gluon, mbarrier, tma, tma_load as _tma_load,
                           tma_store as _tma_store, warpgroup_mma, warpgroup_mma_wait)
from .hostmath import cdiv
from .kept_tensors import no_int32s
from .launcher import launch_kernel


if gluon is not None:
    @gluon.constexpr_function
    def _wgmma_layout(n):
        """The register layout of a warpgroup's (64, n) float32 wgmma accumulator (m64nNk16, 4 warps)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])

    @gluon.jit
    def _issue_tile(desc, coord, bar, dst):
        """Start the TMA copy of the box at ``coord`` into ``dst``; ``bar`` counts its bytes."""
        mbarrier.expect(bar, desc.block_type.nbytes)
        _tma_load(desc, coord, bar, dst)

    @gluon.jit
    def _lane_row_sums(p, TREES: gl.constexpr):
        """Each thread's share of the row sums of a wgmma accumulator tile ``p`` (ROWS, N) float32:
        (ROWS, 4), entry (r, q) the sum of columns 8 i + 2 q + {0, 1}, which lane q of row r's quad
        holds. No shuffle: the four lanes' shares are added once per query tile. ``TREES``: as
        ``_row_max``'s (the layout of the result depends on it)."""
        ROWS: gl.constexpr = p.shape[0]
        N: gl.constexpr = p.shape[1]
        if TREES:
            shares = gl.sum(gl.sum(gl.sum(gl.reshape(p, [ROWS, 4, N // 32, 4, 2]), axis=4), axis=2), axis=1)
        else:
            shares = gl.sum(gl.sum(gl.reshape(p, [ROWS, N // 8, 4, 2]), axis=3), axis=1)
        return shares

    @gluon.jit
    def _row_max(s, TREES: gl.constexpr):
        """Row maxima of a wgmma accumulator tile ``s`` (ROWS, N) float32, in SliceLayout(1, s's layout).
        ``TREES``: a thread's N / 4 entries of a row (columns 8 i + 2 q + {0, 1} in lane q of the row's
        quad) are reduced by pairs, then in 4 chains of N / 32, then across the 4, instead of Triton's
        one chain of N / 4 (``_lane_row_sums`` the same way). With three compute warpgroups at 160
        registers that left ptxas fewer spills and rematerialized indices in the key loop (589
        instructions a tile against 672-675, triton 3.6, sm_90a): +1.8 to +4.0% at D=64 on an H200; with
        two warpgroups the loop's code was the same size and ran -1.6 to +0.5% (session 26)."""
        ROWS: gl.constexpr = s.shape[0]
        N: gl.constexpr = s.shape[1]
        if TREES:
            t = gl.max(gl.max(gl.max(gl.reshape(s, [ROWS, 4, N // 32, 4, 2]), axis=4), axis=2), axis=1)
            m = gl.convert_layout(gl.max(t, axis=1), gl.SliceLayout(1, s.type.layout), assert_trivial=True)
        else:
            m = gl.max(s, axis=1)
        return m

    @gluon.jit
    def _softmax_tile(s, m_i, l_q, qk_scale, masked, lim, cols, TREES: gl.constexpr):
        """Online-softmax update with one (BLOCK_M, BLOCK_N) score tile ``s`` (float32).

        Scores in log2 units after ``qk_scale``. ``masked``: key c of the tile is visible to row r iff
        c <= lim[r]. ``l_q``: the row sums as each lane's share (``_lane_row_sums``), so that no shuffle
        stands between a tile's exponentials and the next tile's matmul (the row max is shuffled: all
        lanes of a row must subtract the same one). Returns (p, m_new, l_q_new, alpha) with alpha the
        rescale of the old state. ``TREES``: how a thread reduces its entries (``_row_max``)."""
        if masked:
            s = gl.where(cols[None, :] <= lim[:, None], s, float("-inf"))
        m_new = gl.maximum(m_i, _row_max(s, TREES) * qk_scale)
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet: p = 0
        p = gl.exp2(s * qk_scale - m_sub[:, None])
        alpha = gl.exp2(m_i - m_sub)
        share = _lane_row_sums(p, TREES)
        alpha_q = gl.convert_layout(alpha, gl.SliceLayout(1, share.type.layout), assert_trivial=True)
        l_new = l_q * alpha_q[:, None] + share
        return p, m_new, l_new, alpha

    @gluon.jit
    def _units(n_m, BH, causal):
        """Work units of the grid: a query tile of one (batch, head), or, when causal, a pair
        of them (the i-th heaviest and the i-th lightest of a head: equal work per unit)."""
        if causal != 0:
            return BH * ((n_m + 1) // 2)
        return BH * n_m

    @gluon.jit
    def _split_range(n_m, BH, n_kt):
        """Split grid: (dp, s, e, W). Every program first takes dp whole waves of units (p,
        p + grid, ...: the programs at work share K/V in L2), then its share [s, e) of the last one to
        two waves' W = (units - dp * grid) * n_kt steps (a tile and one of its n_kt key tiles,
        tile-major; s = p W // grid, int64), taken in order, so that no program idles at the end."""
        P = gl.num_programs(0)
        dp = gl.maximum(BH * n_m // P - 1, 0)
        W = (BH * n_m - dp * P).to(gl.int64) * n_kt
        p = gl.program_id(0).to(gl.int64)
        return dp, p * W // P, (p + 1) * W // P, W

    @gluon.jit
    def _owner(i, W):
        """Split grid: the program whose share (``_split_range``) holds step i (int64)."""
        return (((i + 1) * gl.num_programs(0) + W - 1) // W - 1).to(gl.int32)

    @gluon.jit
    def _item(w, n_m, BH, n_kt, causal, SPLIT: gl.constexpr):
        """The w-th query tile this program computes: (bh, m, valid, j_lo, j_hi), its key tiles
        [j_lo, j_hi) (clipped by the caller to those the tile sees). Program p takes units p, p + grid,
        ...; consecutive units share a head, so the programs that run at once read the same K/V from
        L2. Not causal: a head's tiles are taken in a rotated order, one place further per wave's
        worth of heads before it, so that the heads' partial last tiles (lighter: their warpgroups
        without rows idle) fall on different programs; unrotated, where n_m divides the grid, a few
        programs took them all (n_m = 22 on 132 programs: 6) and the rest a whole tile more. A causal
        unit is tiles n_m-1-i and i of its head (w even, odd); the odd half of the middle unit of an
        odd n_m is not a tile (valid False). ``SPLIT`` (not causal): the last waves' units
        are shared out by steps instead (``_split_range``), so every program has the same number of
        key tiles to do; a tile cut between programs is a piece of its keys in each."""
        if SPLIT:
            dp, s, e, W = _split_range(n_m, BH, n_kt)
            tail = w >= dp
            t = s // n_kt + (w - dp)   # the item's unit among the last waves' ones
            u = gl.where(tail, dp * gl.num_programs(0) + t, gl.program_id(0) + w * gl.num_programs(0))
            j_lo = gl.where(tail, gl.maximum(s - t * n_kt, 0), 0).to(gl.int32)
            j_hi = gl.where(tail, gl.minimum(e - t * n_kt, n_kt), n_kt).to(gl.int32)
            return (u // n_m).to(gl.int32), (u % n_m).to(gl.int32), u >= 0, j_lo, j_hi
        u = gl.program_id(0) + (w // 2 if causal != 0 else w) * gl.num_programs(0)
        if causal != 0:
            per_head = (n_m + 1) // 2
            i = u % per_head
            m = gl.where(w % 2 == 0, n_m - 1 - i, i)
            return u // per_head, m, (w % 2 == 0) | (m != n_m - 1 - i), 0, n_kt
        bh = u // n_m
        turn = bh // gl.maximum(gl.num_programs(0) // n_m, 1)   # heads a wave of the grid takes, before bh
        return bh, (u % n_m + turn) % n_m, u >= 0, 0, n_kt

    @gluon.jit
    def _n_items(n_m, BH, n_kt, causal, SPLIT: gl.constexpr):
        """How many w this program walks (``_item``)."""
        if SPLIT:
            dp, s, e, W = _split_range(n_m, BH, n_kt)
            return dp + gl.where(e > s, (e - 1) // n_kt - s // n_kt + 1, 0).to(gl.int32)
        n = gl.cdiv(gl.maximum(_units(n_m, BH, causal) - gl.program_id(0), 0), gl.num_programs(0))
        return gl.where(causal != 0, 2 * n, n)

    @gluon.jit
    def _settle_piece(o, m_i, l_i, t, n_kt, W, part, PartO, PartML, Counts, o_rows, o_cols, s_rows,
                      TILE_M: gl.constexpr):
        """Split grid: this warpgroup's rows of query tile t of the last waves (``_split_range``: W
        steps) after one piece of its key tiles. Publish the piece (o: O unnormalized (ROWS, D); m_i,
        l_i: the rows' max and sum, log2 units) in the program's slot of PartO / PartML, count it in
        (Counts[owner * warpgroups + part]), and if it is the last of the tile's pieces to arrive,
        merge them all (the LSE rule). Returns (o, m_i, l_i, last): the merged tile when last is 1 (its
        rows then go out from here), else the piece.

        The pieces of tile t come from programs q0..q1 (q0 holds its first key tile): slot 1 of q0 (its
        last item), slot 0 of the others (their first). o_rows, s_rows: the rows within the tile in
        O's and the scores' layouts; o_cols: O's columns."""
        HEAD_DIM: gl.constexpr = o_cols.shape[0]
        WG: gl.constexpr = TILE_M // 64
        q0 = _owner(t * n_kt, W)
        q1 = _owner((t + 1) * n_kt - 1, W)
        me = gl.program_id(0)
        piece = (me * 2 + gl.where(me == q0, 1, 0)).to(gl.int64) * TILE_M
        gl.store(PartO + (piece + o_rows)[:, None] * HEAD_DIM + o_cols[None, :], o)
        gl.store(PartML + piece * 2 + s_rows, m_i)
        gl.store(PartML + piece * 2 + TILE_M + s_rows, l_i)
        # every thread releases its own stores into the count; the one that completes it acquires them all
        lanes = gl.arange(0, 128, gl.BlockedLayout([1], [32], [4], [0]))
        arrived = gl.atomic_add(Counts + (q0 * WG + part) + lanes * 0, 1 + lanes * 0, sem="acq_rel", scope="gpu")
        last = gl.max(gl.where(arrived == 128 * (q1 - q0 + 1) - 1, 1, 0), axis=0)
        if last != 0:
            m_run = gl.full_like(m_i, float("-inf"))
            l_run = gl.zeros_like(l_i)
            o_run = gl.zeros_like(o)
            for q in range(q0, q1 + 1):
                piece = (q * 2 + gl.where(q == q0, 1, 0)).to(gl.int64) * TILE_M
                m_q = gl.load(PartML + piece * 2 + s_rows, volatile=True)
                l_q = gl.load(PartML + piece * 2 + TILE_M + s_rows, volatile=True)
                o_q = gl.load(PartO + (piece + o_rows)[:, None] * HEAD_DIM + o_cols[None, :], volatile=True)
                m_new = gl.maximum(m_run, m_q)
                m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
                a = gl.exp2(m_run - m_sub)
                b = gl.exp2(m_q - m_sub)
                l_run = l_run * a + l_q * b
                o_run = (o_run * gl.convert_layout(a, o_rows.type.layout)[:, None]
                         + o_q * gl.convert_layout(b, o_rows.type.layout)[:, None])
                m_run = m_new
            o = o_run
            m_i = m_run
            l_i = l_run
        return o, m_i, l_i, last

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
        return buf.reinterpret(buf.dtype, [1, buf.shape[0], 1, buf.shape[1]],
                               gl.NVMMASharedLayout(swizzle_byte_width=buf.type.layout.swizzle_byte_width,
                                                    element_bitwidth=buf.type.layout.element_bitwidth, rank=4))

    @gluon.jit
    def _ws_producer(q_s, k_desc, v_desc, k_s, v_s, k_ready, v_ready, k_free, v_free, PartO, Sk, H, GROUP, n_m, BH,
                     delta, causal):
        """Load warp: for each query tile of the program (``_item``), K_j and V_j into slot g % STAGES
        (g counts the program's key tiles) once both compute warpgroups freed it; it runs ahead into
        the next query tile while the compute warpgroups finish one.

        One barrier per slot in each of k_ready, v_ready (the copy landed; count 1) and k_free, v_free
        (every compute warpgroup is done with it; count 2 or 3). Each kind is an allocation of its own: Gluon
        puts a warpgroup barrier before an mbarrier operation that follows another on the same
        allocation. (Partitions take no constexpr arguments: triton 3.6 passes them as int32 values;
        sizes come from the buffers' shapes.)"""
        STAGES: gl.constexpr = k_s.shape[0]
        BLOCK_N: gl.constexpr = k_s.shape[1]
        TILE_M: gl.constexpr = q_s.shape[0] // 2 * q_s.shape[1]  # two Q buffers per warpgroup
        SPLIT: gl.constexpr = PartO.dtype.element_ty == gl.float32  # a split grid (see the kernel)
        n_kt = gl.cdiv(Sk, BLOCK_N)
        g = 0
        for w in range(_n_items(n_m, BH, n_kt, causal, SPLIT)):
            bh, m, valid, j_lo, j_hi = _item(w, n_m, BH, n_kt, causal, SPLIT)
            if valid:
                n_full, n_tiles = _key_tiles(m * TILE_M, Sk, delta, causal, TILE_M, BLOCK_N)
                b = bh // H
                hk = (bh % H) // GROUP
                if not SPLIT:
                    j_lo = 0
                    j_hi = n_tiles
                for j in range(j_lo, gl.minimum(j_hi, n_tiles)):
                    slot = g % STAGES
                    free_phase = ((g // STAGES) & 1) ^ 1  # the slot's previous use (none yet: passes at once)
                    mbarrier.wait(k_free.index(slot), free_phase, pred=g >= STAGES)
                    _issue_tile(k_desc, [b, j * BLOCK_N, hk, 0], k_ready.index(slot), _tile_view(k_s.index(slot)))
                    mbarrier.wait(v_free.index(slot), free_phase, pred=g >= STAGES)
                    _issue_tile(v_desc, [b, j * BLOCK_N, hk, 0], v_ready.index(slot), _tile_view(v_s.index(slot)))
                    g += 1

    @gluon.jit
    def _ws_consumer(part: gl.constexpr, q_desc, o_desc, o_ptr, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s,
                     q_bar, k_ready, v_ready, k_free, v_free, Lse, PartO, PartML, Counts, Sq, Sk, H, n_m, BH, qk_scale,
                     delta, causal):
        """One compute warpgroup: rows [part * 64, + 64) of each of the program's query tiles, every key
        tile. Its Q rows come through two buffers (the next tile's load is issued as this one starts);
        its O rows leave through ``o_s`` and TMA (16-bit O, ``o_desc``) or by pointers from ``o_ptr``
        (float32 O, the ring's block outputs). S_j = Q K_j^T and O += P_{j-1} V_{j-1} are in flight
        together, K_{j+1} is waited for under them, then S_j's softmax (see the module doc). In a split
        grid a tile cut between programs is settled by ``_settle_piece``."""
        ROWS: gl.constexpr = q_s.shape[1]
        TILE_M: gl.constexpr = q_s.shape[0] // 2 * q_s.shape[1]  # two Q buffers per warpgroup
        SPLIT: gl.constexpr = PartO.dtype.element_ty == gl.float32  # a split grid (see the kernel)
        HEAD_DIM: gl.constexpr = q_s.shape[2]
        STAGES: gl.constexpr = k_s.shape[0]
        BLOCK_N: gl.constexpr = k_s.shape[1]
        dtype: gl.constexpr = q_s.dtype
        TREES: gl.constexpr = TILE_M == 192  # three warpgroups at 160 registers: shallow reductions (_row_max)
        s_layout: gl.constexpr = _wgmma_layout(BLOCK_N)
        o_layout: gl.constexpr = _wgmma_layout(HEAD_DIM)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        rows = gl.arange(0, ROWS, gl.SliceLayout(1, s_layout))
        cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
        s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
        o_rows = part * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, o_layout))
        o_cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
        n_kt = gl.cdiv(Sk, BLOCK_N)
        n_items = _n_items(n_m, BH, n_kt, causal, SPLIT)
        if n_items > 0:  # the first tile's Q rows (item 0 is always a tile)
            bh0, m0, valid0, lo0, hi0 = _item(0, n_m, BH, n_kt, causal, SPLIT)
            _issue_tile(q_desc, [bh0 // H, m0 * TILE_M + part * ROWS, bh0 % H, 0], q_bar.index(2 * part),
                        _tile_view(q_s.index(2 * part)))
        g = 0  # key tiles walked so far (their slots and phases)
        c = 0  # query tiles done so far (their Q buffers and phases)
        for w in range(n_items):
            bh, m, valid, j_lo, j_hi = _item(w, n_m, BH, n_kt, causal, SPLIT)
            if valid:
                b = bh // H
                h = bh % H
                row0 = m * TILE_M + part * ROWS
                q_p = q_s.index(2 * part + c % 2)
                # start the next tile's Q rows into the other buffer (its last reader finished)
                nb, nm, nvalid, nlo, nhi = _item(w + 1, n_m, BH, n_kt, causal, SPLIT)
                step = gl.where(nvalid, 1, 2)
                nb, nm, nvalid, nlo, nhi = _item(w + step, n_m, BH, n_kt, causal, SPLIT)
                if w + step < n_items:
                    _issue_tile(q_desc, [nb // H, nm * TILE_M + part * ROWS, nb % H, 0],
                                q_bar.index(2 * part + (c + 1) % 2), _tile_view(q_s.index(2 * part + (c + 1) % 2)))
                n_full, n_tiles = _key_tiles(m * TILE_M, Sk, delta, causal, TILE_M, BLOCK_N)
                if SPLIT:
                    j_hi = gl.maximum(gl.minimum(j_hi, n_tiles), j_lo)
                else:
                    j_lo = 0
                    j_hi = n_tiles
                g -= j_lo  # key tile j's slot and phase come from g + j
                # the last key each row sees (tile 0's columns): causal i + delta, and always before Sk
                lim0 = gl.where(causal != 0, gl.minimum(row0 + rows + delta, Sk - 1), Sk - 1)
                m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
                l_q = _lane_row_sums(s_zero, TREES)  # zeros, each lane's share of the row sums
                o = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
                mbarrier.wait(q_bar.index(2 * part + c % 2), (c // 2) & 1)
                if (j_hi > j_lo) & (row0 < Sq):
                    # tile j_lo: scores, then its softmax; its P V waits for the next tile's scores to be issued
                    slot = (g + j_lo) % STAGES
                    mbarrier.wait(k_ready.index(slot), ((g + j_lo) // STAGES) & 1)
                    s_tok = warpgroup_mma(q_p, k_s.index(slot).permute((1, 0)), s_zero, use_acc=False,
                                          is_async=True)
                    if j_lo + 1 < j_hi:  # K_{j+1} is waited for while S_j is on the tensor cores
                        mbarrier.wait(k_ready.index((g + j_lo + 1) % STAGES), ((g + j_lo + 1) // STAGES) & 1)
                    s = warpgroup_mma_wait(0, deps=[s_tok])
                    mbarrier.arrive(k_free.index(slot), count=1)
                    p, m_i, l_q, alpha = _softmax_tile(s, m_i, l_q, qk_scale, j_lo >= n_full, lim0 - j_lo * BLOCK_N,
                                                       cols, TREES)
                    p_op = gl.convert_layout(p.to(dtype), p_layout)
                    for j in range(j_lo + 1, j_hi):
                        slot = (g + j) % STAGES
                        prev = (g + j - 1) % STAGES
                        # S_j and O += P_{j-1} V_{j-1} on the tensor cores; K_{j+1}'s wait, then S_j's
                        s_tok = warpgroup_mma(q_p, k_s.index(slot).permute((1, 0)), s_zero, use_acc=False,
                                              is_async=True)
                        mbarrier.wait(v_ready.index(prev), ((g + j - 1) // STAGES) & 1)
                        o_tok = warpgroup_mma(p_op, v_s.index(prev), o, is_async=True)
                        if j + 1 < j_hi:  # (under the matmuls: off the tile's chain, see the module doc)
                            mbarrier.wait(k_ready.index((g + j + 1) % STAGES), ((g + j + 1) // STAGES) & 1)
                        s = warpgroup_mma_wait(1, deps=[s_tok])
                        mbarrier.arrive(k_free.index(slot), count=1)
                        # the softmax of tile j (ptxas waits for P_{j-1} V_{j-1} at its start)
                        p, m_i, l_q, alpha = _softmax_tile(s, m_i, l_q, qk_scale, j >= n_full,
                                                           lim0 - j * BLOCK_N, cols, TREES)
                        o, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
                        mbarrier.arrive(v_free.index(prev), count=1)
                        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                        p_op = gl.convert_layout(p.to(dtype), p_layout)
                    last = (g + j_hi - 1) % STAGES
                    mbarrier.wait(v_ready.index(last), ((g + j_hi - 1) // STAGES) & 1)
                    o_tok = warpgroup_mma(p_op, v_s.index(last), o, is_async=True)
                    o = warpgroup_mma_wait(0, deps=[o_tok])
                    mbarrier.arrive(v_free.index(last), count=1)
                else:  # rows all past Sq (a last tile's spare warpgroups): only hand each slot on
                    for j in range(j_lo, j_hi):
                        slot = (g + j) % STAGES
                        # waited for first, so that the arrive counts toward this use of the slot
                        mbarrier.wait(k_ready.index(slot), ((g + j) // STAGES) & 1)
                        mbarrier.arrive(k_free.index(slot), count=1)
                        mbarrier.wait(v_ready.index(slot), ((g + j) // STAGES) & 1)
                        mbarrier.arrive(v_free.index(slot), count=1)
                g += j_hi
                c += 1
                l_i = gl.convert_layout(gl.sum(l_q, axis=1), gl.SliceLayout(1, s_layout))  # the lanes' shares added

                done = 1
                if SPLIT:
                    if (j_lo > 0) | (j_hi < n_tiles):  # a piece of a tile cut between programs
                        dp, s0, e0, W = _split_range(n_m, BH, n_kt)
                        t = (bh * n_m + m - dp * gl.num_programs(0)).to(gl.int64)
                        o, m_i, l_i, done = _settle_piece(o, m_i, l_i, t, n_kt, W, part, PartO, PartML, Counts,
                                                          o_rows, o_cols, part * ROWS + rows, TILE_M)
                if done != 0:
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
                        rows_o = m * TILE_M + o_rows
                        o_base = o_ptr + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
                        gl.store(o_base + rows_o.to(gl.int64)[:, None] * stride_os + o_cols[None, :],
                                 o.to(o_ptr.dtype.element_ty), mask=(rows_o < Sq)[:, None])
                    lse = gl.where(l_i > 0.0, (m_i + gl.log2(gl.where(l_i > 0.0, l_i, 1.0))) * 0.6931471805599453,
                                   float("-inf"))
                    offs_m = row0 + rows
                    gl.store(Lse + bh.to(gl.int64) * Sq + offs_m, lse, mask=offs_m < Sq)
        tma.store_wait(0)

    # the compute partitions, one per warpgroup (partitions take no constexpr arguments)
    @gluon.jit
    def _ws_consumer0(q_desc, o_desc, o_ptr, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s, q_bar, k_ready,
                      v_ready, k_free, v_free, Lse, PartO, PartML, Counts, Sq, Sk, H, n_m, BH, qk_scale, delta,
                      causal):
        _ws_consumer(0, q_desc, o_desc, o_ptr, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s, q_bar, k_ready,
                     v_ready, k_free, v_free, Lse, PartO, PartML, Counts, Sq, Sk, H, n_m, BH, qk_scale, delta,
                     causal)

    @gluon.jit
    def _ws_consumer1(q_desc, o_desc, o_ptr, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s, q_bar, k_ready,
                      v_ready, k_free, v_free, Lse, PartO, PartML, Counts, Sq, Sk, H, n_m, BH, qk_scale, delta,
                      causal):
        _ws_consumer(1, q_desc, o_desc, o_ptr, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s, q_bar, k_ready,
                     v_ready, k_free, v_free, Lse, PartO, PartML, Counts, Sq, Sk, H, n_m, BH, qk_scale, delta,
                     causal)

    @gluon.jit
    def _ws_consumer2(q_desc, o_desc, o_ptr, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s, q_bar, k_ready,
                      v_ready, k_free, v_free, Lse, PartO, PartML, Counts, Sq, Sk, H, n_m, BH, qk_scale, delta,
                      causal):
        _ws_consumer(2, q_desc, o_desc, o_ptr, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s, q_bar, k_ready,
                     v_ready, k_free, v_free, Lse, PartO, PartML, Counts, Sq, Sk, H, n_m, BH, qk_scale, delta,
                     causal)

    @gluon.jit(do_not_specialize=["Sq", "Sk", "delta"])
    def _gl_attn_fwd_ws_kernel(Q, K, V, Out, Lse, PartO, PartML, Counts, Sq, Sk, B, H, GROUP,
                               stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                               stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
                               qk_scale, delta,
                               HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                               STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                               PRODUCER_REGS: gl.constexpr):
        """Query tiles of BLOCK_M = 128 or 192 rows (program p: units p, p + grid, ... of ``_item``; a
        grid of one program per unit, or a persistent one): a load warp and BLOCK_M / 64 compute
        warpgroups of 64 rows (the kernel's own 4 warps and workers) sharing the K/V slots, with
        CONSUMER_REGS registers per thread (the load warp's warpgroup PRODUCER_REGS; the kernel's own
        warps get what is left of the multiprocessor's 64K).

        A split grid (not causal; see ``_item``), where PartO is a float32 pointer: the programs share
        out the last waves' (tile, key tile) steps evenly; a tile cut between programs leaves each
        piece in PartO (grid, 2, BLOCK_M, D) and PartML (grid, 2, 2, BLOCK_M) float32, counted in Counts
        (grid * BLOCK_M / 64) int32 zeros, and the last piece to arrive writes the tile
        (``_settle_piece``). Otherwise PartO, PartML and Counts are int32 pointers, never read."""
        gl.static_assert((BLOCK_M == 128) | (BLOCK_M == 192), "two or three compute warpgroups of 64 rows")
        WG: gl.constexpr = BLOCK_M // 64
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
        q_s = gl.allocate_shared_memory(dtype, [2 * WG, 64, HEAD_DIM], tile_smem)
        o_s = gl.allocate_shared_memory(dtype, [WG, 64, HEAD_DIM], tile_smem)
        kv_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
        k_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_smem)
        v_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], kv_smem)
        # barriers (see _ws_producer), each kind an allocation of its own: each Q buffer, and per slot
        # K ready, V ready, K free, V free
        bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
        q_bar = gl.allocate_shared_memory(gl.int64, [2 * WG, 1], bar_layout)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        for i in gl.static_range(2 * WG):
            mbarrier.init(q_bar.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_free.index(i), count=WG)  # freed by every compute warpgroup
            mbarrier.init(v_free.index(i), count=WG)
        fence_async_shared()
        causal = 1 if CAUSAL else 0
        consumer_args = (q_desc, o_desc, Out, stride_ob, stride_os, stride_oh, q_s, o_s, k_s, v_s, q_bar, k_ready,
                         v_ready, k_free, v_free, Lse, PartO, PartML, Counts, Sq, Sk, H, n_m, B * H, qk_scale, delta,
                         causal)
        producer_args = (q_s, k_desc, v_desc, k_s, v_s, k_ready, v_ready, k_free, v_free, PartO, Sk, H, GROUP, n_m,
                         B * H, delta, causal)
        if WG == 3:  # the kernel's own warps load (they get what the three compute warpgroups leave)
            gl.warp_specialize([(_ws_producer, producer_args), (_ws_consumer0, consumer_args),
                                (_ws_consumer1, consumer_args), (_ws_consumer2, consumer_args)], [4, 4, 4],
                               [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS])
        else:
            gl.warp_specialize([(_ws_consumer0, consumer_args), (_ws_consumer1, consumer_args),
                                (_ws_producer, producer_args)], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])

#: The tile by (head dim, causal): (query rows, 64 per compute warpgroup; keys per step; K/V slots;
#: registers per compute thread; registers per thread of the load warp's warpgroup, where there are
#: two compute warpgroups). D=64 without a causal mask takes 192 rows (three compute warpgroups at 160
#: registers, FlashAttention-3's tile): on an H200 +3 to +6% at 8K-32K keys, and at 4K -0.4 to -1.1%
#: before the rotated tile order of ``_item`` and +1.7% with it (session 25), then +1.8 to +4.0% at 2K-32K
#: from the shallow reductions of ``_row_max`` (session 26); causal blocks lose up to 13% with it
#: (sessions 23, 25).
TILES = {(64, False): (192, 128, 2, 160, 32), (64, True): (128, 128, 2, 232, 40),
         (128, False): (128, 128, 2, 232, 40), (128, True): (128, 128, 2, 232, 40)}
#: The tile of a split launch (``split_grid``), at either head dim: the split path was measured with it,
#: and at 192 rows its kernel spills (208 B of stack, triton 3.6).
SPLIT_TILE = (128, 128, 2, 232, 40)
#: One program per multiprocessor walking the query tiles (else one program per unit of work).
PERSISTENT = True
#: Without a causal mask, where the query tiles fill few waves of the persistent grid and the last
#: one partly, share out the last waves' (tile, key tile) steps evenly over the programs (``_item``):
#: no multiprocessor idles while a few finish the last tiles. Where: fewer than SPLIT_MAX_WAVES waves
#: of tiles, at least SPLIT_MIN_KEY_TILES key tiles per query tile, and at least two key tiles per
#: program. On an H200 (benchmarks/probes/fa_waves.py, one 128-row tile per head, bf16; session 23)
#: the split ran 1.08-1.44x the unsplit grid at 0.5-4.1 waves with 8K keys (D=64 and 128), 1.12-1.60x
#: with 16K, 1.11-1.67x with 32K, and 1.3-3.2x for 1-8 tiles from 16K keys; but 0.95-1.25x at 0.5-4.1
#: waves with 4K keys, 0.77-0.80x for one tile cut into a piece per key tile (D=128, 4K-8K keys), and
#: 0.95-1.03x at 7.6 and 31 waves (the launch bench's 4096 tiles), so none of those split. With this
#: rule: 1.1-5.2x at 1-540 tiles with 8K-32K keys (logs/2026-11-23-h200-s23-fa-split-final-rule.log).
SPLIT = True
SPLIT_MAX_WAVES = 5
SPLIT_MIN_KEY_TILES = 64
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


def grid_size(q: torch.Tensor, causal: bool, persistent: bool = PERSISTENT, block_m: int | None = None) -> int:
    """Programs of a launch on q (B, Sq, H, D): one per unit of work (a query tile of ``block_m``
    rows, by default the table's, or when causal a pair of them), or with ``persistent`` at most one
    per multiprocessor."""
    B, Sq, H, D = q.shape
    n_m = cdiv(Sq, block_m or TILES[(D, bool(causal))][0])
    units = B * H * ((n_m + 1) // 2 if causal else n_m)
    return min(units, _multiprocessors(q.device.index or 0)) if persistent else units


def split_grid(q: torch.Tensor, k: torch.Tensor, causal: bool, block_m: int, block_n: int,
               persistent: bool = PERSISTENT, split: bool = SPLIT) -> int:
    """Programs of a split launch (``_item``): one per multiprocessor, or one per two (tile, key tile)
    steps where there are fewer; 0 where the launch is not split (``SPLIT``): causal, not persistent,
    query tiles that fill every wave of the grid or SPLIT_MAX_WAVES waves or more, fewer than
    SPLIT_MIN_KEY_TILES key tiles per query tile."""
    B, Sq, H, _ = q.shape
    units, n_kt = B * H * cdiv(Sq, block_m), cdiv(k.shape[1], block_n)
    sms = _multiprocessors(q.device.index or 0)
    if (not split or causal or not persistent or n_kt < SPLIT_MIN_KEY_TILES or units % sms == 0
            or units >= SPLIT_MAX_WAVES * sms):
        return 0
    return min(sms, units * n_kt // 2)


def launch_tile(q: torch.Tensor, k: torch.Tensor, causal: bool, given=(None,) * 5, persistent: bool = PERSISTENT,
                split: bool = SPLIT) -> tuple[list, int]:
    """(tile, programs) of a launch on q (B, Sq, H, D), k (B, Sk, H_kv, D): a launch that splits
    (``split_grid`` with SPLIT_TILE's sizes; programs > 0) takes SPLIT_TILE, any other the (head dim,
    causal) entry of TILES (programs 0), each with the ``given`` sizes (block_m, block_n, stages,
    consumer_regs, producer_regs; None: the entry's) in place. A given block_m other than the entry's
    takes the other sizes from a table entry of that many rows (the registers go with the number of
    compute warpgroups). So a launch the table's tile would split but SPLIT_TILE's would not stays
    unsplit."""
    def fill(entry):
        if given[0] is not None and given[0] != entry[0]:
            entry = next((t for t in (SPLIT_TILE, *TILES.values()) if t[0] == given[0]), entry)
        return [size if size is not None else default for size, default in zip(given, entry)]

    tile = fill(SPLIT_TILE)
    programs = split_grid(q, k, causal, tile[0], tile[1], persistent, split)
    if not programs:
        tile = fill(TILES[(q.shape[3], bool(causal))])
    return tile, programs


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *,
           qk_scale: float, causal: bool, delta: int = 0, block_m: int | None = None, block_n: int | None = None,
           stages: int | None = None, consumer_regs: int | None = None, producer_regs: int | None = None,
           persistent: bool = PERSISTENT, split: bool = SPLIT) -> None:
    """Fill ``out`` (B, Sq, H, D; q's dtype or float32) and ``lse`` (B, H, Sq), contiguous, from q
    (B, Sq, H, D), k, v (B, Sk, H_kv, D), 16-bit, 16-byte aligned with 16-byte multiples for every
    stride but the last; ``qk_scale`` includes log2(e); causal: query i sees key j iff j <= i + delta.
    Needs a global-scratch allocator for the on-device descriptors (``attention_fwd.descriptor_scratch``).
    The sizes (None: ``launch_tile``'s), ``persistent`` and ``split`` are for probes."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    if B * H == 0 or Sq == 0:
        return
    if Sk == 0:   # no key at all (a descriptor cannot have an empty dimension): every row sees nothing
        out.zero_()
        lse.fill_(float("-inf"))
        return
    tile, programs = launch_tile(q, k, causal, (block_m, block_n, stages, consumer_regs, producer_regs),
                                 persistent, split)
    if programs:   # scratch of the pieces of tiles cut between programs (see the kernel)
        part_o = torch.empty((programs, 2, tile[0], D), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((programs, 2, 2, tile[0]), dtype=torch.float32, device=q.device)
        counts = torch.zeros(programs * tile[0] // 64, dtype=torch.int32, device=q.device)
    else:
        part_o = part_ml = counts = no_int32s(q.device)   # (not split: never read)
    grid = (programs or grid_size(q, causal, persistent, tile[0]),)
    launch_kernel(_gl_attn_fwd_ws_kernel, grid, q, k, v, out, lse, part_o, part_ml, counts, Sq, Sk, B, H, H // Hkv,
                  q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                  v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                  qk_scale, int(delta),
                  HEAD_DIM=D, BLOCK_M=tile[0], BLOCK_N=tile[1], STAGES=tile[2], CAUSAL=bool(causal),
                  CONSUMER_REGS=tile[3], PRODUCER_REGS=tile[4], num_warps=4, **COMPILE_OPTIONS)
