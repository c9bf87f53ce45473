"""Row softmax forward in Triton: ``softmax_fwd``, ``row_stats`` and ``normalize`` on (M, N) rows.

Four regimes, picked per call from the row length N (knobs below, no autotuning):

- **rows** (``N <= ROWS_MAX_N``): a program holds whole rows in registers, several rows per
  program when they are short (a tile of ``ROWS_TILE`` elements): one read of x, one write of y.
  A row takes a power-of-two tile, or a main tile and a smaller tail tile (``tail_split``).
  The knobs are dicts by element size, filled from timings on an H200 (see the comments below).
- **staged split** (longer rows, CUDA, ``softmax_staged.py``, tried first): each chunk is held in
  shared memory across the row's wait, so the input is read once. Rows longer than the GPU's
  shared memory holds can go in two parts (``softmax_held.py``: their leading columns through the
  staged kernel, the others through the two-pass path, where the held columns are a large enough
  share of the row: its ``HELD_MIN_SHARE``); they and unaligned 16-bit rows take the paths below.
- **persistent split** (longer rows, CUDA): the row is cut into chunks of ``SPLIT_CHUNK`` elements
  over the programs of a persistent grid sized to what the GPU holds at once (Q programs per row,
  G rows in flight). Each program reduces its chunk to (max, sum of exp), publishes it and counts
  itself in at a per-row counter without waiting; it then normalizes the *previous* row of its slot,
  whose partials are in by then (the wait is off the critical path), merging them with the LSE rule
  and re-reading its chunk while it is still in L2. HBM traffic: one read and one write while the
  rows in flight fit in L2. Rows longer than the grid covers give each program several chunks and
  are normalized right after their own reduction, newest chunks first (the tail still in L2).
- **two-pass split** (CPU / the interpreter, or ``PERSISTENT = False``): chunk statistics, a small
  combine kernel, then a normalize pass (two reads and one write).

The grid-wide wait needs every program of the persistent grid resident at once: the grid is the
multiprocessor count times the occupancy read off the compiled kernel's registers and shared memory.
The interpreter runs programs one after another, so there the split rows take the two-pass path
(``INTERPRETER_PERSISTENT`` runs the persistent kernel with one program per row instead, which never
waits on another program, to check its code on CPU).

Contract: x (M, N) float32/float16/bfloat16 with ``x.stride(1) == 1`` (any row stride); y is a new
contiguous (M, N) tensor in x.dtype; lse is (M,) float32, natural log. An all ``-inf`` row gives
y = 0 and lse = ``-inf``; N == 0 gives lse = ``-inf``. Offsets are 64-bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .compile_options import COMPILE_OPTIONS
from .hostmath import cdiv, next_power_of_2, prev_power_of_2
from .kept_tensors import kept
from .launcher import launch_kernel
from .plan_memo import memo

# ---- Regime knobs (module level so tests can lower them and reach the split paths at small N) ----
# Values from timings on an H200 (benchmarks/logs/2026-11-22-h200-softmax-call*.log, .notes/softmax.md).
# Dicts are keyed by element size in bytes (4: float32, 2: float16 / bfloat16).
#: Rows up to this length are handled whole by one program, in registers (bf16 at 64K: 68% of copy
#: against 59% split; fp32 at 64K spills: 65% against 72% split).
ROWS_MAX_N = {4: 32768, 2: 65536}
#: The same for rows whose tiles move an element at a time (``moves_elements``: a data pointer off 16
#: bytes, say): past it they take the split paths. The 16-bit build of 65536 columns (16 warps, 128
#: elements a thread) spills 268-284 bytes (``benchmarks/probes/sm90_builds.py``, triton 3.6); on bf16
#: rows 2 bytes off 16 (H100, session 42 calls 4-5) it ran 66-71% of copy at 34000-40000 against 50-62
#: split, but 47-55 at 43000-65536 against 53-65 split (0.93-1.01x torch.compile, against 1.03-1.23x).
ROWS_MAX_N_ELEMENTWISE = {4: 32768, 2: 40960}
#: Elements per program in the rows kernel (one row if longer). Small programs win at small N:
#: 99% of copy at N = 1K fp32 (1 row, 4 warps); bf16 1K 97-98% as one row per 1-warp program
#: against 95-97% for 4 rows per 4-warp program (session 10); 16-warp programs lose.
ROWS_TILE = {4: 1024, 2: 1024}
#: Elements per thread that set ``num_warps`` for a tile (tile / (32 * this), clamped to 1..ROWS_MAX_WARPS).
ELEMS_PER_THREAD = {4: 8, 2: 32}
#: Most warps of a rows-kernel program (a long row gets more elements per thread beyond it).
ROWS_MAX_WARPS = 16
#: Rows kernels (both directions) drop their masks where the tiles cover the rows exactly.
ROWS_EXACT = True
#: Rows kernels (both directions) hold a row in a power-of-two main tile and a tail tile of at most a
#: quarter of it where that covers the row (``tail_split``: bf16 N = 4097, 4104 columns with the
#: shift to 16 bytes, as 4096 + 8 instead of 8192); False: one tile.
ROWS_TAIL = True
#: Rows of at most this many columns, by element size, take a tail tile of half the main tile too
#: (``tail_split``): the forward's 16-bit rows (bf16 12288: 96 against 83% of copy, H200).
ROWS_WIDE_TAIL = {4: 0, 2: 32768}
#: Forward rows kernel: a tail tile that would give each thread at least one element but less than a
#: vector (its loads narrower than the main tile's) is widened to a vector a thread (``vector_tail``).
#: Otherwise Triton gives the two tiles different layouts and moves the whole main tile through shared
#: memory to the tail's and back (sm_90 TTGIR, triton 3.6: two ``convert_layout`` of the main tile).
#: H200, % of copy, widened against as before (``logs/2026-11-24-h200-s38-call4.log``): float32 N = 4608 /
#: 5120 / 8704 / 9216 (tails of 1-2 elements a thread on 16 warps) 98.5 / 97.7 / 97.2 / 97.1 against 76.2 /
#: 71.6 / 71.2 / 73.9 (one tile, ``-call3.log``: 95.4 / 98.0 / 96.9 / 98.7); bf16 17000 / 17408 / 18000 /
#: 18432 83.6 / 87.1 / 87.5 / 89.8 against 63.4 / 64.9 / 65.7 / 67.2; no loss elsewhere from 1088 to 20480.
ROWS_TAIL_VECTORS = True
#: Forward rows kernel's exponentials (``shifted_exp``): (FTZ: ex2.approx.ftz by inline asm on CUDA, FMA:
#: the exponent as one FMA). Even without either, 2^((x - shift) log2(e)) beats ``tl.exp(x - shift)``:
#: triton 3.6 lowers tl.exp to ex2.approx.f32, whose subnormal fix-up costs three instructions an
#: element, and tl.exp2 to ex2.approx.ftz. H200, % of copy (``logs/2026-11-24-h200-s38-call6.log``),
#: plain against tl.exp: bf16 N = 4097 / 10240 / 16385 / 18000 / 19999 96.9 / 93.2 / 82.4 / 92.3 / 67.1
#: against 90.6 / 91.2 / 78.4 / 87.5 / 64.4, ties elsewhere from 1000 to 20480 (sm_90: 928 -> 776
#: instructions a thread at 19999); float32 ties but 8192, 97.1 against 98.8 (98.7 / 97.1 again in
#: ``-call11.log``: 38 registers instead of 44, three 16-warp programs a multiprocessor). FTZ and FMA moved
#: nothing beyond a point, and the inline asm takes float32 4097 / 4352 from 32 registers to 34 (three
#: 16-warp programs a multiprocessor instead of four: 87 / 93% in ``-call10-bench.log``).
ROWS_EXP = (False, False)
#: Rows kernels, by direction: where 16-byte vectors would leave the rows' end vectors to an
#: element-at-a-time tile (``row_edges``), move the widest narrower vector of at least this many bytes
#: of which every row is whole instead (``whole_vector_align``; None: never). H200, % of copy, whole
#: against 16-byte vectors with end vectors apart (``logs/2026-11-24-h200-s36-call1.log``, the backward
#: on the tiles of before ``softmax_bwd.BWD_MASKED_ROWS_TILE``): bf16 N = 300 (8 bytes) forward 90.1 /
#: 68.7, backward 86.8 / 77.9; 1004 96.0 / 82.1, 100.0 / 85.1; 4100 96.2 / 87.6, 94.1 / 69.2; N = 302
#: (4 bytes) forward 77.4 / 69.2, backward 68.2 / 77.9 (on the masked tiles 96.1 / 89.9, ``-call8.log``:
#: not taken, unmeasured on longer rows).
WHOLE_VECTOR_MIN_BYTES = {"fwd": 4, "bwd": 8}
#: Forward rows kernel: entries (registers, fewest, most elements): programs of 16 warps or more whose
#: threads hold between that fewest and most elements of the main tile compile with at most that many
#: registers a thread (ptx ``.maxnreg``, ``rows_register_cap``), so that two (64) or four (32) of them share
#: a multiprocessor. Empty: no cap. H200, % of copy with and without (``logs/2026-11-24-h200-s36-call5.log``):
#: float32 N = 16385 92.2 / 77.2 (74 registers uncapped, sm_90), 20000 96.5 / 88.9, 8192 99.3 / 97.0; a cap
#: of 64 at 8 elements a thread cost (float32 4097: 81.5 / 92.6: ptxas took more than the natural 32).
#: The entry of 32 at 8 elements: float32 4097 / 4352 / 5120 took 34 registers uncapped with ``shifted_exp``
#: (sm_90, triton 3.6), none spills at 32.
ROWS_REGISTER_CAP = ((32, 8, 8), (64, 16, 32))
#: Eviction policy of the forward rows kernel's loads ("" = the default).
ROWS_LOAD_EVICT = ""
#: Tile elements (also the largest chunk) and elements per thread of the streaming kernels
#: (two-pass passes, normalize, the backward's elementwise pass). On an H200 at 16M-64M (session 18,
#: benchmarks/probes/softmax_two_pass.py --tiles, 7 rounds), against session 12's 8192 x 16 fp32
#: and 8192 x 32 16-bit: fp32 32768 x 64 (16 warps) forward +1.0 / +2.5 points of copy at 16M / 64M,
#: backward +0.2 / +0.1; bf16 16384 x 64 (8 warps) forward +1.9 / +2.9, backward +0.6 / +0.4
#: (32768 x 64, 16384 x 128 and larger: -0.8 to -10.4 forward).
STREAM_TILE = {4: 32768, 2: 16384}
STREAM_ELEMS_PER_THREAD = {4: 64, 2: 64}
#: The second pass over the inputs (normalize forward, dx backward) walks the tiles last first, so
#: that it starts on what the first pass read last, still in L2.
STREAM_SECOND_PASS_REVERSED = True
#: The two-pass forward's exponentials as one ex2.approx.ftz each (CUDA; see ``exp2_ftz``).
STREAM_EXP_FTZ = True
#: The two-pass forward's exponents as one FMA per element, x log2(e) - s2 (``shifted_exp``), instead
#: of (x - shift) * log2(e), and the streaming forward kernels without masks where the tiles cover
#: the rows exactly. The bf16 statistics pass ran at 72% of copy with 11.5 instructions per element
#: (sm_90 SASS, triton 3.6, 8192 x 32 per thread); both together take it to 10.0 (16384 x 64: 7.9),
#: but measured only -0.1 to +0.6 points of copy on the forward at 16M-64M (H200, session 18): the
#: instructions were not what held it; the larger tiles in STREAM_TILE were.
STREAM_FMA_EXP = True
STREAM_EXACT = True
#: The streaming kernels on rows that are not 16-byte aligned (``row_align``), by direction: True
#: moves aligned vectors from each row's start rounded down (``tile_masks``), False one element at a
#: time. On an H200 (session 34, M * N = 2^28): the two-pass backward (bf16) 50 / 50% of copy against
#: 33 / 26% at N = 1000003 / 4194305; the two-pass forward 43.7 / 43.6 against 41.4 / 42.0 (bf16) and
#: 61.9 / 61.7 against 54.7 / 55.1 (float32), one run, with the masks in 32 bits (with 64-bit masks
#: the bf16 forward ran 41 / 42 in the bench against 46 / 47 before: every tile pays for the masks).
STREAM_ALIGNED_VECTORS = {"fwd": True, "bwd": True}
#: Split rows, persistent kernel: (chunk elements per program, num_warps).
SPLIT_CHUNK = {4: (4096, 4), 2: (4096, 4)}
#: On CUDA, split rows use the persistent kernel (False: always the two-pass path) ...
PERSISTENT = True
#: ... for rows of at most this many bytes; longer rows take the two-pass path, which measured
#: faster there (the persistent kernel's re-reads stop hitting L2). None: no limit.
PERSISTENT_MAX_ROW_BYTES = {4: 4 << 20, 2: 1 << 20}
#: Eviction hints of the persistent kernels: (first read of a chunk, store of the output).
PERSISTENT_EVICT = ("evict_last", "evict_first")
#: Bytes of input the persistent grid reads per round at most (programs x chunk bytes): what must
#: stay in L2 until it is re-read one row later. None: as many programs as the GPU holds.
PERSISTENT_WAVE_BYTES = 12 << 20
#: On CPU, run the persistent kernel (one program per row, so it never waits on another program).
INTERPRETER_PERSISTENT = False
#: Programs per split row in the interpreter, where programs run one after another: with 1 no
#: program ever waits on another; with more, waits give up (SPIN_MAX = 0) and the fallback runs.
INTERPRETER_PROGRAMS_PER_ROW = 1
#: Override of the persistent grid size (programs resident at once); None reads it off the GPU.
RESIDENT_PROGRAMS = None
#: Polls of a row counter before a program gives up waiting, counts it (see sync_failures) and
#: recomputes the row's statistics from x itself (correct, slower).
SPIN_MAX = 1 << 20   # about a second of polling at most; normal waits last microseconds
#: Partials merged per step by a persistent program.
PARTIAL_BLOCK = 256

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------------------------
# Shared device helpers (softmax_bwd.py uses these too)
# ----------------------------------------------------------------------------------------------
@triton.jit
def row_arrive(CNT):
    """Count this program in at a row's counter, after its partial stores (release)."""
    tl.debug_barrier()
    tl.atomic_add(CNT, 1, sem="release")


@triton.jit
def row_wait(CNT, expected, spin_max, ERR):
    """Wait until ``expected`` programs have arrived at ``CNT`` (acquire); then their partials are visible.

    Returns whether they all arrived. After ``spin_max`` polls it gives up (adding 1 to ``ERR``)
    rather than hang the GPU; the caller then recomputes what it needs from the input itself, so
    the result stays right, only slower (``sync_failures`` counts these).
    """
    seen = tl.atomic_add(CNT, 0, sem="acquire")
    spins = 0
    while (seen < expected) & (spins < spin_max):
        seen = tl.atomic_add(CNT, 0, sem="acquire")
        spins += 1
    tl.atomic_add(ERR, 1, mask=seen < expected)
    tl.debug_barrier()
    return seen >= expected


LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def exp2_ftz(x, FTZ: tl.constexpr):
    """2^x of a float32 block; ``FTZ`` (CUDA only): one ex2.approx.ftz, which flushes results below
    2^-126 to 0. Plain exp2 (ex2.approx.f32) spends three more instructions per element on subnormal
    results, which holds 16-bit streaming kernels under memory speed. (Gluon kernels cannot call
    Triton functions: ``softmax_staged._exp2_ftz`` is its Gluon twin.)"""
    if FTZ:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def shifted_exp(x, shift, FTZ: tl.constexpr, FMA: tl.constexpr):
    """(e, c) with exp(x - shift) = e * c for a float32 block x and its rows' shifts (``shift``:
    (BLOCK_M,), broadcast over the columns; finite, or +inf where every x is -inf: e = 0, c = 1).

    ``FMA``: e = 2^(x log2(e) - s2) with s2 = shift log2(e) rounded to float32, one FMA per element
    that rounds the exponent once, and c = 2^-r per row, r = shift log2(e) - s2 exactly (an FMA gives
    the rounding of a product), so nothing of shift's magnitude is lost (|x| ~ 1e4 included).
    Else e = 2^((x - shift) log2(e)), c = 1: a subtraction and a multiply per element."""
    if FMA:
        s2 = shift * LOG2E
        r = tl.where(tl.abs(s2) < float("inf"), tl.fma(shift, LOG2E, -s2), 0.0)  # (inf - inf: NaN)
        return exp2_ftz(tl.fma(x, LOG2E, -s2[:, None]), FTZ), tl.exp2(-r)
    else:
        return exp2_ftz((x - shift[:, None]) * LOG2E, FTZ), tl.full(shift.shape, 1.0, tl.float32)


@triton.jit
def stream_tile(M, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, REVERSED: tl.constexpr):
    """This program's tile of the streaming kernels: BLOCK_M rows x chunk k (of K) of BLOCK_N columns;
    ``REVERSED``: program 0 takes the last tile (a second pass starting where the first ended).

    Returns (rows as int64, cols (1, BLOCK_N), k, row mask); ``tile_masks`` gives the element masks.
    """
    pid = tl.program_id(0)
    if REVERSED:
        pid = tl.num_programs(0) - 1 - pid
    rb = pid // K
    k = pid - rb * K
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = k * BLOCK_N + tl.arange(0, BLOCK_N)
    return rows.to(tl.int64), cols[None, :], k, rows < M


@triton.jit
def row_offsets(rows_o, stride, ALIGN: tl.constexpr):
    """Element offsets at which the tiles of rows ``rows_o`` (row stride ``stride``) start: the rows'
    starts, or with ALIGN > 1 those rounded down to a multiple of ALIGN elements (16 bytes), in a
    form the compiler knows to be aligned (see ``tile_masks``)."""
    o = rows_o * stride
    if ALIGN > 1:
        o = (o // ALIGN) * ALIGN
    return o


@triton.jit
def row_span(rows_o, N, stride, ALIGN: tl.constexpr):
    """(h, end), each (rows,) int32: the columns [h, end) of the shifted tiles (``row_offsets``) that
    hold rows ``rows_o`` of N elements, h = the row's start modulo ALIGN (``tile_masks``, EDGES)."""
    start = rows_o * stride
    h = (start - (start // ALIGN) * ALIGN).to(tl.int32)  # (32-bit masks: int64 ones cost ~2x the instructions)
    return h, h + N


@triton.jit
def span_masks(c, h, end, row_ok, ALIGN: tl.constexpr):
    """(inside, body) masks of the columns ``c`` ((1 or rows, n) int32) of rows spanning columns
    [h, end) (``row_span``): the row's elements, and the aligned vectors of ALIGN elements wholly
    inside the row."""
    inside = row_ok[:, None] & (c >= h[:, None]) & (c < end[:, None])
    body = (row_ok[:, None] & (c >= ((h + ALIGN - 1) // ALIGN * ALIGN)[:, None])
            & (c < (end // ALIGN * ALIGN)[:, None]))
    return inside, body


@triton.jit
def tile_masks(rows_o, row_ok, cols, N, stride, ALIGN: tl.constexpr, EDGES: tl.constexpr):
    """(load, inside, body) masks of a (rows x cols) tile of rows of N elements, row stride ``stride``
    (``cols``: (1, n) int32, the tile's columns).

    ALIGN = 1: column c is the row's element c, and all three masks are the row's elements. ALIGN > 1
    (rows whose starts or lengths are not multiples of 16 bytes, ``row_align``): the tile starts at
    the row's start rounded down to ALIGN elements (``row_offsets``), h elements before it, so column
    c is element c - h and loads and stores move whole aligned vectors. ``load`` covers the vectors
    that hold an element of the row (the first and last may also hold a neighbour's, in the same 16
    bytes: read, then dropped by ``inside``, ``load_inside``), ``inside`` the row's elements, ``body``
    the vectors wholly inside the row. Tiles store ``body``, and the rows' two end vectors go an
    element at a time on a small tile of their own (``edge_tile``); the forward kernels that write
    also load ``body`` alone (the end vectors' elements come in on the edge tile), the others all of
    the row (``load_inside``). Every tensor of a kernel must have the same h (``row_align`` checks
    that their row strides agree modulo ALIGN). EDGES False (``row_edges``): every row is whole
    vectors (h = 0, N a multiple of ALIGN), all three masks are the row's vectors and there are no
    end vectors to write apart."""
    if EDGES:
        h, end = row_span(rows_o, N, stride, ALIGN)
        load = row_ok[:, None] & (cols < ((end + ALIGN - 1) // ALIGN * ALIGN)[:, None])
        inside, body = span_masks(cols, h, end, row_ok, ALIGN)
    else:
        load = row_ok[:, None] & (cols < (N // ALIGN * ALIGN if ALIGN > 1 else N))  # (N // ALIGN * ALIGN = N)
        inside = load
        body = load
    return load, inside, body


@triton.jit
def edge_tile(rows_o, row_ok, N, stride, ALIGN: tl.constexpr):
    """(cols, mask) of the rows' two end vectors (EDGES, ``tile_masks``), a (rows x 2 ALIGN) tile:
    ``cols`` (rows, 2 ALIGN) int32, columns of the shifted tiles: [0, ALIGN) (the head vector) and
    [t, t + ALIGN), t = end rounded down to ALIGN (the tail vector); ``mask`` their elements of the row
    that ``body`` leaves out (inside and not body), each once: a row within the head vector (t = 0)
    has none in the tail half (the kernels sum over this tile)."""
    h, end = row_span(rows_o, N, stride, ALIGN)
    j = tl.arange(0, 2 * ALIGN)[None, :]
    head = j < ALIGN
    cols = tl.where(head, j, (end // ALIGN * ALIGN)[:, None] + (j - ALIGN))
    inside, body = span_masks(cols, h, end, row_ok, ALIGN)
    return cols, (inside ^ body) & (head | (cols >= ALIGN))  # (body lies inside)


@triton.jit
def chunk_has_edges(k, N, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr):
    """Whether chunk k (columns [k BLOCK_N, (k + 1) BLOCK_N)) of a streaming kernel can hold an element
    of a row's end vectors (``edge_tile``; rows of N elements): the head vector lies in chunk 0, and
    the tail vector [t, t + ALIGN) in a chunk that reaches past column N (chunks and t are multiples
    of ALIGN, and t + ALIGN > h + N >= N where the vector holds an element of the row). A scalar: the
    other chunks skip the end vectors' work."""
    return (k == 0) | ((k + 1) * BLOCK_N > N)


@triton.jit
def chunk_edges(rows64, row_ok, k, N, stride, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr):
    """``edge_tile`` of the streaming kernels: (cols, mask) with the mask restricted to chunk k's
    columns, so that only the program holding an end vector reads and writes it."""
    cols, edge = edge_tile(rows64, row_ok, N, stride, ALIGN)
    return cols, edge & (cols >= k * BLOCK_N) & (cols < (k + 1) * BLOCK_N)


@triton.jit
def load_tile(P, offs, cols, mask, other, EVEN: tl.constexpr, EVICT: tl.constexpr):
    """A (rows x cols) tile of P (its rows' tiles starting at ``offs``, ``row_offsets``; ``cols``:
    (1 or rows, n) int32), as float32: ``other`` where not ``mask`` (``tile_masks``' body, or
    ``edge_tile``'s mask), or no mask at all with EVEN (the rows kernels' exact tiles,
    ``rows_tile_args``)."""
    ptrs = P + offs[:, None] + cols
    if EVEN:
        t = tl.load(ptrs, eviction_policy=EVICT)
    else:
        t = tl.load(ptrs, mask=mask, other=other, eviction_policy=EVICT)
    return t.to(tl.float32)


@triton.jit
def load_inside(P, offs, cols, load, inside, other, EVEN: tl.constexpr, EVICT: tl.constexpr, EDGES: tl.constexpr):
    """``load_tile`` of the whole vectors ``load`` (``tile_masks``), with ``other`` in place of a
    neighbour's elements in the rows' end vectors (EDGES): all of the rows on one tile, for the
    kernels that sum over the rows before they write (the backward's rows kernel) or do not write."""
    t = load_tile(P, offs, cols, load, other, EVEN, EVICT)
    if EDGES:
        t = tl.where(inside, t, other)
    return t


@triton.jit
def store_tile(P, offs, cols, mask, v, EVEN: tl.constexpr):
    """Store a (rows x cols) tile ``v`` into P in P's dtype where ``mask``, or everywhere with EVEN
    (as ``load_tile``)."""
    ptrs = P + offs[:, None] + cols
    v = v.to(P.dtype.element_ty)
    if EVEN:
        tl.store(ptrs, v)
    else:
        tl.store(ptrs, v, mask=mask)


@triton.jit
def chunk_ptrs(X, row, start, N, stride, offs):
    """Pointers and mask of the chunk ``[start, start + len(offs))`` of row ``row`` (64-bit offsets)."""
    base = X + tl.cast(row, tl.int64) * stride + start
    return base + offs, offs < (N - start).to(tl.int32)


@triton.jit
def _fold_chunk(xc, m_run, s_run):
    """Fold a float32 chunk (padding -inf) into a running (max, sum of exp(x - max))."""
    m_new = tl.maximum(m_run, tl.max(xc, axis=0))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    s_new = s_run * tl.exp(m_run - shift) + tl.sum(tl.exp(xc - shift), axis=0)
    return m_new, s_new


@triton.jit
def _load_x(X, row, start, N, stride, offs, EVICT: tl.constexpr):
    ptrs, ok = chunk_ptrs(X, row, start, N, stride, offs)
    return tl.load(ptrs, mask=ok, other=float("-inf"), eviction_policy=EVICT).to(tl.float32)


@triton.jit
def _row_stats_from_x(X, row, N, stride, offs, chunks, CHUNK: tl.constexpr):
    """(max, sum of exp(x - max)) of a whole row read from x: the fallback when partials did not arrive."""
    m = float("-inf")
    s = 0.0
    for c in range(0, chunks):
        xr = _load_x(X, row, tl.cast(c, tl.int64) * CHUNK, N, stride, offs, "evict_first")
        m, s = _fold_chunk(xr, m, s)
    return m, s


@triton.jit
def _merge_partials(PM, PS, Q, PB: tl.constexpr):
    """Merge Q partial (max, sum) pairs (read past L1) into the row's (max, sum)."""
    m = float("-inf")
    s = 0.0
    for j in range(0, Q, PB):
        idx = j + tl.arange(0, PB)
        ok = idx < Q
        pm = tl.load(PM + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
        ps = tl.load(PS + idx, mask=ok, other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m, tl.max(pm, axis=0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(ps * tl.exp(pm - shift), axis=0)
        m = m_new
    return m, s


# ----------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _x_tile(X, offs, rows_o, row_ok, cols, N, stride, EVEN: tl.constexpr, EVICT: tl.constexpr, ALIGN: tl.constexpr,
            EDGES: tl.constexpr):
    """(x, body): the aligned vectors wholly inside the rows (``tile_masks``' body: all of the rows
    without EDGES) of a (rows x cols) tile of X, as float32 (-inf elsewhere), and that mask."""
    body = tile_masks(rows_o, row_ok, cols, N, stride, ALIGN, EDGES)[2]
    return load_tile(X, offs, cols, body, float("-inf"), EVEN, EVICT), body


@triton.jit
def _softmax_rows_kernel(X, Y, LSE, MX, SX, M, N, stride_xm, stride_ym,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STORE_Y: tl.constexpr, STORE_LSE: tl.constexpr,
                         EVEN: tl.constexpr, OFFS64: tl.constexpr, LOAD_EVICT: tl.constexpr, ALIGN: tl.constexpr,
                         EDGES: tl.constexpr, TAIL_N: tl.constexpr, FTZ: tl.constexpr, FMA: tl.constexpr):
    """BLOCK_M whole rows per program, held in registers: one read of x, one write of y.

    With STORE_Y, writes y and (with STORE_LSE) lse; without, only the row statistics (max -> MX, sum of
    exp(x - max) -> SX). ``rows_tile_args`` gives the specializations: EVEN (the tiles cover the
    rows exactly: no masks), OFFS64 (64-bit offsets), LOAD_EVICT (x's eviction policy), ALIGN and
    EDGES (``tile_masks``: rows not 16-byte aligned: the tiles move the aligned vectors wholly inside
    the rows, and with EDGES the rows' two end vectors go an element at a time on a tile of their own,
    ``edge_tile``, which takes part in the row's max and sum) and TAIL_N (``rows_config``: a row's
    columns [0, BLOCK_N) in the main tile, [BLOCK_N, BLOCK_N + TAIL_N) in a tail tile; 0: no tail
    tile). FTZ, FMA: the exponentials (``shifted_exp``, ``ROWS_EXP``). (Tiles that load all of the rows
    (``load_inside``), with the end vectors read again only for y, measured slower: bf16 N = 4097, H200:
    69 against 91% of copy; a mask per element.)"""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)[None, :]
    row_ok = rows < M
    rows_o = rows.to(tl.int64) if OFFS64 else rows
    offs_x = row_offsets(rows_o, stride_xm, ALIGN)
    # load the rows: their end vectors (EDGES), the main tile, the tail tile; padding is -inf, which
    # adds nothing to a sum of exponentials
    if EDGES:
        cols_e, edge = edge_tile(rows_o, row_ok, N, stride_xm, ALIGN)
        x_e = load_tile(X, offs_x, cols_e, edge, float("-inf"), False, LOAD_EVICT)
    x, body = _x_tile(X, offs_x, rows_o, row_ok, cols, N, stride_xm, EVEN, LOAD_EVICT, ALIGN, EDGES)
    if TAIL_N > 0:
        cols_t = BLOCK_N + tl.arange(0, TAIL_N)[None, :]
        x_t, body_t = _x_tile(X, offs_x, rows_o, row_ok, cols_t, N, stride_xm, EVEN, LOAD_EVICT, ALIGN, EDGES)
    # the row max, then the sum of exp(x - max) = c * sum(e) (``shifted_exp``; shift 0 for an all -inf
    # row: e = 0, s = 0)
    m = tl.max(x, axis=1)
    if TAIL_N > 0:
        m = tl.maximum(m, tl.max(x_t, axis=1))
    if EDGES:
        m = tl.maximum(m, tl.max(x_e, axis=1))
    shift = tl.where(m == float("-inf"), 0.0, m)
    e, c = shifted_exp(x, shift, FTZ, FMA)
    s = tl.sum(e, axis=1)
    if TAIL_N > 0:
        e_t = shifted_exp(x_t, shift, FTZ, FMA)[0]
        s += tl.sum(e_t, axis=1)
    if EDGES:
        e_e = shifted_exp(x_e, shift, FTZ, FMA)[0]
        s += tl.sum(e_e, axis=1)
    s *= c
    if not STORE_Y:
        tl.store(MX + rows, m, mask=row_ok)
        tl.store(SX + rows, s, mask=row_ok)
    # normalize and write (the tiles' aligned vectors, then the end vectors an element at a time)
    if STORE_Y:
        if STORE_LSE:
            tl.store(LSE + rows, m + tl.log(s), mask=row_ok)
        inv = tl.where(s > 0, c / s, 0.0)
        offs_y = row_offsets(rows_o, stride_ym, ALIGN)
        store_tile(Y, offs_y, cols, body, e * inv[:, None], EVEN)
        if TAIL_N > 0:
            store_tile(Y, offs_y, cols_t, body_t, e_t * inv[:, None], EVEN)
        if EDGES:
            store_tile(Y, offs_y, cols_e, edge, e_e * inv[:, None], False)


@triton.jit
def _normalize_row(X, Y, LSE, PM, PS, CNT, ERR, row, q, N, stride_xm, stride_ym, Q, R, spin_max, offs,
                   CHUNK: tl.constexpr, PB: tl.constexpr, STORE_EVICT: tl.constexpr):
    """Persistent path, pass 2 of one row: wait for its Q partials, then write y for chunks q + r Q."""
    # the row's max and sum, from the partials with the LSE rule (or from x, if they did not arrive)
    if row_wait(CNT + row, Q, spin_max, ERR):
        m, s = _merge_partials(PM + tl.cast(row, tl.int64) * Q, PS + tl.cast(row, tl.int64) * Q, Q, PB)
    else:
        m, s = _row_stats_from_x(X, row, N, stride_xm, offs, Q * R, CHUNK)
    shift = tl.where(m == float("-inf"), 0.0, m)
    inv = tl.where(s > 0, 1.0 / s, 0.0)
    tl.store(LSE + row, m + tl.log(s), mask=q == 0)
    # re-read x (newest first: most likely still in L2) and write y
    for i in range(0, R):
        start = (q + (R - 1 - i) * Q).to(tl.int64) * CHUNK
        xr = _load_x(X, row, start, N, stride_xm, offs, "evict_first")
        ptrs, ok = chunk_ptrs(Y, row, start, N, stride_ym, offs)
        tl.store(ptrs, (tl.exp(xr - shift) * inv).to(Y.dtype.element_ty), mask=ok, eviction_policy=STORE_EVICT)


@triton.jit(do_not_specialize=["M", "Q", "G", "R", "LAG", "spin_max"])
def _softmax_persistent_kernel(X, Y, LSE, PM, PS, CNT, ERR, M, N, stride_xm, stride_ym,
                               Q, G, R, LAG, spin_max,
                               CHUNK: tl.constexpr, PB: tl.constexpr,
                               LOAD_EVICT: tl.constexpr, STORE_EVICT: tl.constexpr):
    """Split rows on a persistent grid of G * Q programs: Q programs per row, G rows at a time.

    Program (slot, q) takes rows slot, slot + G, ... For each row it reduces chunks
    q, q + Q, ..., q + (R - 1) Q to one partial (max, sum), publishes it to PM / PS (M, Q) and
    counts itself in at CNT[row] (M,) int32 zeros. It normalizes a row after the row's Q partials
    are in, re-reading x: with LAG = 1 it first reduces the next row, so the wait is already over
    and x comes back from L2; with LAG = 0 (rows longer than L2 holds) it normalizes the row it just
    reduced, newest chunks first. ERR counts waits that gave up.
    """
    pid = tl.program_id(0)
    slot = pid // Q
    q = pid - slot * Q
    offs = tl.arange(0, CHUNK)
    for row in range(slot, M, G):
        # pass 1: this program's partial (max, sum) of the row
        m_run = float("-inf")
        s_run = 0.0
        for r in range(0, R):
            xr = _load_x(X, row, (q + r * Q).to(tl.int64) * CHUNK, N, stride_xm, offs, LOAD_EVICT)
            m_run, s_run = _fold_chunk(xr, m_run, s_run)
        # publish it and count in (no wait here)
        wbase = tl.cast(row, tl.int64) * Q
        tl.store(PM + wbase + q, m_run)
        tl.store(PS + wbase + q, s_run)
        row_arrive(CNT + row)
        # pass 2 of the previous row of this slot (LAG = 1) or of this row (LAG = 0)
        prev = row - LAG * G
        if prev >= slot:
            _normalize_row(X, Y, LSE, PM, PS, CNT, ERR, prev, q, N, stride_xm, stride_ym, Q, R, spin_max,
                           offs, CHUNK, PB, STORE_EVICT)
    # with LAG = 1 the slot's last row is still to normalize
    if LAG > 0:
        if slot < M:
            last_row = slot + ((M - 1 - slot) // G) * G
            _normalize_row(X, Y, LSE, PM, PS, CNT, ERR, last_row, q, N, stride_xm, stride_ym, Q, R, spin_max,
                           offs, CHUNK, PB, STORE_EVICT)


@triton.jit
def _chunk_stats_kernel(X, PM, PS, M, N, K, stride_xm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        EVEN: tl.constexpr, FTZ: tl.constexpr, FMA: tl.constexpr, ALIGN: tl.constexpr,
                        EDGES: tl.constexpr):
    """Two-pass, pass 1: (max, sum of exp(x - max)) of chunk k of BLOCK_M rows -> PM, PS (M, K)
    (EVEN: the tiles cover the rows exactly, no masks; FTZ, FMA: see ``shifted_exp``; ALIGN, EDGES:
    see ``tile_masks``)."""
    rows64, cols, k, row_ok = stream_tile(M, K, BLOCK_M, BLOCK_N, False)
    load, inside, _ = tile_masks(rows64, row_ok, cols, N, stride_xm, ALIGN, EDGES)
    x = load_inside(X, row_offsets(rows64, stride_xm, ALIGN), cols, load, inside, float("-inf"), EVEN, "", EDGES)
    m = tl.max(x, axis=1)
    e, c = shifted_exp(x, tl.where(m == float("-inf"), 0.0, m), FTZ, FMA)
    s = tl.sum(e, axis=1) * c
    tl.store(PM + rows64 * K + k, m, mask=row_ok)
    tl.store(PS + rows64 * K + k, s, mask=row_ok)


@triton.jit
def _combine_stats_kernel(PM, PS, LSE, SHIFT, SCALE, M, K,
                          BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Two-pass, combine: K partials per row -> lse, and the row's max and 1 / sum for normalize."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    for j in range(0, K, BLOCK_K):
        ks = j + tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (ks[None, :] < K)
        pm = tl.load(PM + rows64[:, None] * K + ks[None, :], mask=mask, other=float("-inf"))
        ps = tl.load(PS + rows64[:, None] * K + ks[None, :], mask=mask, other=0.0)
        m_new = tl.maximum(m, tl.max(pm, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(ps * tl.exp(pm - shift[:, None]), axis=1)
        m = m_new
    tl.store(LSE + rows, m + tl.log(s), mask=row_ok)
    tl.store(SHIFT + rows, m, mask=row_ok)
    tl.store(SCALE + rows, s, mask=row_ok)


@triton.jit
def _normalize_kernel(X, Y, SHIFT, SUM, M, N, K, stride_xm, stride_ym, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, REVERSED: tl.constexpr, EVEN: tl.constexpr, FTZ: tl.constexpr,
                      FMA: tl.constexpr, ALIGN: tl.constexpr, EDGES: tl.constexpr):
    """y = exp(x - shift[row]) / sum[row]; a row with sum 0 (empty, shift -inf) gives y = 0.
    (EVEN, FTZ, FMA: see ``_chunk_stats_kernel``; ALIGN, EDGES: ``tile_masks``, ``chunk_edges``.)"""
    rows64, cols, k, row_ok = stream_tile(M, K, BLOCK_M, BLOCK_N, REVERSED)
    shift = tl.load(SHIFT + rows64, mask=row_ok, other=0.0)
    # exp(x - inf) = 0 for every x <= +large: an empty row gives 0, not exp(-inf + inf) = NaN
    shift = tl.where(shift == float("-inf"), float("inf"), shift)
    s = tl.load(SUM + rows64, mask=row_ok, other=0.0)
    # the tile's aligned vectors wholly inside the rows (all of the rows without EDGES)
    body = tile_masks(rows64, row_ok, cols, N, stride_xm, ALIGN, EDGES)[2]
    offs_x = row_offsets(rows64, stride_xm, ALIGN)
    offs_y = row_offsets(rows64, stride_ym, ALIGN)
    e, c = shifted_exp(load_tile(X, offs_x, cols, body, float("-inf"), EVEN, ""), shift, FTZ, FMA)
    scale = tl.where(s > 0, c / s, 0.0)
    store_tile(Y, offs_y, cols, body, e * scale[:, None], EVEN)
    # the rows' end vectors in this chunk (if any), an element at a time
    if EDGES:
        if chunk_has_edges(k, N, BLOCK_N, ALIGN):
            cols_e, edge = chunk_edges(rows64, row_ok, k, N, stride_xm, BLOCK_N, ALIGN)
            e_e = shifted_exp(load_tile(X, offs_x, cols_e, edge, float("-inf"), False, ""), shift, FTZ, FMA)[0]
            store_tile(Y, offs_y, cols_e, edge, e_e * scale[:, None], False)


# ----------------------------------------------------------------------------------------------
# Configuration (host side)
# ----------------------------------------------------------------------------------------------
def num_warps_for(elems: int, per_thread: int, max_warps: int = 16) -> int:
    """Warps for a tile of ``elems`` elements, ``per_thread`` each: 1..max_warps warps."""
    return max(1, min(max_warps, elems // (32 * per_thread)))


def _program_shape(m: int, width: int, elem: int, per_thread: dict | None, tile: dict | None,
                   max_warps: int | None):
    """(BLOCK_M, num_warps) of a program of rows whose tiles hold ``width`` columns (a power of two,
    or a main tile's and a smaller tail tile's, ``tail_split``): as many rows as fit
    ``(tile or ROWS_TILE)[elem]`` elements (a power of two, at least 1, at most m rounded up), and
    warps for ``(per_thread or ELEMS_PER_THREAD)[elem]`` elements per thread of the main tiles (a
    tail tile adds fewer than that), at most ``max_warps`` (default ``ROWS_MAX_WARPS``)."""
    block_m = max(1, min(prev_power_of_2((tile or ROWS_TILE)[elem] // width), next_power_of_2(max(m, 1))))
    return block_m, num_warps_for(block_m * prev_power_of_2(width), (per_thread or ELEMS_PER_THREAD)[elem],
                                  max_warps or ROWS_MAX_WARPS)


def tile_config(m: int, n: int, elem: int, max_block_n: int | None = None, per_thread: dict | None = None,
                tile: dict | None = None, max_warps: int | None = None):
    """(BLOCK_M, BLOCK_N, K, num_warps) of a (rows x chunk) tile for an (m, n) problem.

    ``elem``: element size in bytes; the tile has ``(tile or ROWS_TILE)[elem]`` elements (or one
    row, if longer), and ``(per_thread or ELEMS_PER_THREAD)[elem]`` elements per thread, with at
    most ``max_warps`` (default ``ROWS_MAX_WARPS``) warps.
    """
    block_n = next_power_of_2(max(n, 1))
    if max_block_n is not None:
        block_n = min(block_n, max_block_n)
    block_m, warps = _program_shape(m, block_n, elem, per_thread, tile, max_warps)
    return block_m, block_n, cdiv(max(n, 1), block_n), warps


def tail_split(cols: int, wide_up_to: int = 0) -> tuple[int, int]:
    """(BLOCK_N, TAIL_N) of the rows kernels for rows of ``cols`` columns: a main tile of the largest
    power of two <= cols and a tail tile of the next power of two >= the rest, where the tail is at
    most a quarter of the main tile (e.g. 4104 -> 4096 + 8, not 8192), or half of it in rows of at
    most ``wide_up_to`` columns (``ROWS_WIDE_TAIL``); else one tile (TAIL_N = 0; always without
    ``ROWS_TAIL``). Session 35, H200, % of copy with the tail tile against one tile
    (``logs/2026-11-23-h200-s35-rows-tail.log``): 1.05-1.92x at N = 300 (256 + 64), 4097 (4096 + 4 /
    + 8) and 16385, both directions and dtypes; tails of half the main tile: float32 forward 1.02 /
    0.99 / 0.99 / 0.83x at 3072 / 6144 / 12288 / 24576, backward 0.90 / 0.94 / 1.00 / 0.98x; bf16
    forward 1.00 / 1.01 / 1.16 / 1.00x, backward 1.05 / 1.12 / 0.91 / 1.01x."""
    whole = next_power_of_2(max(cols, 1))
    main = prev_power_of_2(cols)
    tail = next_power_of_2(cols - main)
    if ROWS_TAIL and cols > main and main + tail < whole and (4 * tail <= main or cols <= wide_up_to):
        return main, tail
    return whole, 0


def rows_config(m: int, cols: int, elem: int, per_thread: dict | None = None, tile: dict | None = None,
                max_warps: int | None = None, tiles: tuple[int, int] | None = None, vector: int = 0):
    """(BLOCK_M, BLOCK_N, TAIL_N, num_warps) of a rows kernel (both directions) on m rows of ``cols``
    columns (N, plus ALIGN - 1 for shifted tiles): the (main, tail) ``tiles`` the caller gives, or
    ``tail_split``'s (tails of half the main tile up to ``ROWS_WIDE_TAIL[elem]`` columns), and rows per
    program and warps as ``tile_config`` gives them (its arguments), the tail tile's columns counted in
    the rows per program. ``vector`` (elements the loads move at once; 0: leave the tail as it is): the
    tail tile widened by ``vector_tail``."""
    block_n, tail_n = tiles or tail_split(cols, ROWS_WIDE_TAIL[elem])
    block_m, warps = _program_shape(m, block_n + tail_n, elem, per_thread, tile, max_warps)
    if vector:
        block_n, tail_n = vector_tail(block_m, block_n, tail_n, 32 * warps, vector)
    return block_m, block_n, tail_n, warps


def vector_tail(block_m: int, block_n: int, tail_n: int, threads: int, vector: int) -> tuple[int, int]:
    """(BLOCK_N, TAIL_N) with a tail tile of block_m x tail_n elements that gives each of ``threads``
    at least one but fewer than ``vector`` widened to ``vector`` a thread (``ROWS_TAIL_VECTORS``), or
    one tile of twice the main tile where that tail would be as wide as the main tile."""
    if not tail_n or not threads <= block_m * tail_n < vector * threads:
        return block_n, tail_n
    tail_n = vector * threads // block_m
    return (block_n, tail_n) if tail_n < block_n else (2 * block_n, 0)


def stream_config(m: int, n: int, elem: int, align: int = 1):
    """tile_config of the streaming kernels: chunks of at most STREAM_TILE elements (rows of n
    elements, their tiles shifted by up to ``align`` - 1 elements, ``row_align``)."""
    return tile_config(m, n + align - 1, elem, STREAM_TILE[elem], per_thread=STREAM_ELEMS_PER_THREAD,
                       tile=STREAM_TILE)


def stream_args(x: torch.Tensor, block_m: int, block_n: int, align: int, *outputs: torch.Tensor) -> dict:
    """Specializations of the forward streaming kernels on (m, n) rows x (and ``outputs``) in
    (block_m, block_n) tiles: EVEN (no masks) where the tiles cover the rows exactly, the
    exponentials (see ``shifted_exp``), ALIGN (``row_align``) and EDGES (``row_edges``)."""
    m, n = x.shape
    return dict(EVEN=bool(STREAM_EXACT and align == 1 and n % block_n == 0 and m % block_m == 0),
                FTZ=STREAM_EXP_FTZ and not is_interpreter(x), FMA=STREAM_FMA_EXP, ALIGN=align,
                EDGES=row_edges(align, x, *outputs))


def stream_knobs() -> tuple:
    """The knobs (as they are now) that the streaming kernels' plans read (``stats_plan``, ``normalize_plan``,
    ``softmax_bwd``'s ``dot_plan`` and ``elementwise_plan``): the ``knobs`` of their ``plan_memo.memo``."""
    return (STREAM_TILE, STREAM_ELEMS_PER_THREAD, ROWS_MAX_WARPS, STREAM_EXACT, STREAM_EXP_FTZ, STREAM_FMA_EXP,
            STREAM_ALIGNED_VECTORS, STREAM_SECOND_PASS_REVERSED, ROWS_TILE, ELEMS_PER_THREAD)


def row_align(*tensors: torch.Tensor) -> int:
    """ALIGN of the tile kernels (``tile_masks``) on (M, N) rows ``tensors`` (inputs and outputs):
    1 where Triton's specializations already let them move 16-byte vectors (N and every row stride
    multiples of 16 elements) or where shifting the tiles cannot (a data pointer off 16 bytes, or row
    strides that differ modulo the vector, so that a row starts at different offsets within 16 bytes
    in different tensors: those rows move an element at a time); else 16 bytes in elements of the
    narrowest dtype."""
    if whole_vectors(*tensors):
        return 1
    m = tensors[0].shape[0]
    strides = [t.stride(0) if m > 1 else 0 for t in tensors]
    align = 16 // min(t.element_size() for t in tensors)
    if any(t.data_ptr() % 16 for t in tensors) or len({s % align for s in strides}) > 1:
        return 1
    return align


def whole_vectors(*tensors: torch.Tensor) -> bool:
    """Whether N and every row stride of (M, N) rows ``tensors`` are multiples of 16 elements (Triton's
    specializations then give the tiles 16-byte vectors, where the data pointers are 16-byte aligned)."""
    m, n = tensors[0].shape
    return n % 16 == 0 and all(t.stride(0) % 16 == 0 for t in tensors if m > 1)


def row_edges(align: int, *tensors: torch.Tensor) -> bool:
    """EDGES of the tile kernels (``tile_masks``) on (M, N) rows ``tensors`` with ALIGN = ``align``:
    whether a row may start or end inside a 16-byte vector (N or a row stride not a multiple of
    align), so that the kernels write its end vectors an element at a time (``edge_tile``). False
    where every row is whole vectors (e.g. bf16 rows of N = 1000): the tiles' masks are then the same
    for each element of a vector."""
    m, n = tensors[0].shape
    return align > 1 and (n % align != 0 or any(t.stride(0) % align for t in tensors if m > 1))


def whole_vector_align(align: int, min_bytes: int | None, *tensors: torch.Tensor) -> int:
    """The widest ALIGN below ``align`` (``row_align``'s 16-byte vectors), of at least two elements and
    ``min_bytes`` bytes of the narrowest dtype, under which every row of ``tensors`` is whole vectors
    (``row_edges`` False: N and the row strides multiples of it; the data pointers are 16-byte aligned
    where ``align`` > 1); ``align`` itself where there is none (odd N), it needs no end vectors, or
    ``min_bytes`` is None."""
    if min_bytes is None:
        return align
    least = max(2, min_bytes // min(t.element_size() for t in tensors))
    narrower = align
    while row_edges(narrower, *tensors) and narrower // 2 >= least:
        narrower //= 2
    return align if row_edges(narrower, *tensors) else narrower


def row_layout(*tensors: torch.Tensor, direction: str = "fwd") -> tuple[int, bool, int]:
    """(ALIGN, EDGES, columns) of the ``direction`` rows kernel on (M, N) rows ``tensors`` (inputs and
    outputs): ``row_align``, or the narrower whole vectors ``WHOLE_VECTOR_MIN_BYTES`` lets it take
    (``whole_vector_align``), ``row_edges``, and the columns a row's tiles cover: N, plus the up to
    ALIGN - 1 columns before it where rows start inside a vector."""
    align = whole_vector_align(row_align(*tensors), WHOLE_VECTOR_MIN_BYTES[direction], *tensors)
    edges = row_edges(align, *tensors)
    return align, edges, tensors[0].shape[1] + (align - 1 if edges else 0)


def rows_fit(limit: int, *tensors: torch.Tensor, direction: str = "fwd",
             elementwise_limit: int | None = None) -> tuple[int, bool, int] | None:
    """The ``row_layout`` of (M, N) rows ``tensors`` (inputs and outputs) where they fit the
    ``direction`` rows kernel of at most ``limit`` columns (the columns its tiles cover; at most
    ``elementwise_limit``, where given, on rows that ``moves_elements``), else None.
    The callers hand it on to the kernel's launch (``_rows``' ``layout``)."""
    layout = row_layout(*tensors, direction=direction)
    if elementwise_limit is not None and layout[2] > elementwise_limit and moves_elements(layout, *tensors):
        limit = min(limit, elementwise_limit)
    return layout if layout[2] <= limit else None


def moves_elements(layout: tuple[int, bool, int], *tensors: torch.Tensor) -> bool:
    """Whether the rows kernel's tiles move (M, N) rows ``tensors`` an element at a time under their
    ``row_layout``: ALIGN 1 (no shifted vectors) where Triton's specializations do not give 16-byte
    vectors either (N, a row stride or a data pointer not a multiple of 16 elements / bytes)."""
    return layout[0] == 1 and not (whole_vectors(*tensors) and all(t.data_ptr() % 16 == 0 for t in tensors))


def split_chunk(elem: int, table=None):
    """(chunk, num_warps) of a split row's per-program piece for an element size."""
    return (table or SPLIT_CHUNK)[elem]


def is_interpreter(t: torch.Tensor) -> bool:
    """True where kernels run in Triton's interpreter (CPU tensors)."""
    return t.device.type == "cpu"


def interpreter_plan(k: int, m: int, programs: int):
    """(Q programs per row, G rows in flight, R chunks per program) of the persistent grid in the interpreter."""
    q = max(1, min(INTERPRETER_PROGRAMS_PER_ROW, k))
    return q, max(1, min(programs // q, m)), cdiv(k, q)


def use_persistent(t: torch.Tensor, row_bytes: int, max_row_bytes, elem: int) -> bool:
    """Whether split rows of ``row_bytes`` (all inputs) on ``t``'s device take the persistent kernel.

    ``max_row_bytes``: None (no limit) or a dict by element size ``elem`` (a value of None: no limit).
    """
    if not PERSISTENT or (is_interpreter(t) and not INTERPRETER_PERSISTENT):
        return False
    limit = None if max_row_bytes is None else max_row_bytes[elem]
    return limit is None or row_bytes <= limit


_OCCUPANCY = {}  # build key -> (resident programs, local bytes a thread): ``_build_stats``


def error_counter(device) -> torch.Tensor:
    """The device's int32 counter of persistent-grid waits that timed out (should stay 0)."""
    return kept("error_counter", device, lambda d: torch.zeros(1, dtype=torch.int32, device=d))


def sync_failures(device) -> int:
    """How many persistent-kernel waits on ``device`` gave up (0 unless the grid was not resident)."""
    return int(error_counter(device).item())


def resident_programs(kernel, args, constexprs: dict, num_warps: int, key) -> int:
    """Programs of ``kernel`` (this config) that the GPU holds at once: SMs x occupancy.

    ``args`` are real launch arguments (the kernel must not specialize on the values that the grid
    size changes). Occupancy comes from the compiled kernel's registers (per-warp allocation rounded
    up to 256) and shared memory, and a multiprocessor's 64-warp / 32-block limits. Cached by ``key``.
    """
    if RESIDENT_PROGRAMS is not None:
        return RESIDENT_PROGRAMS
    return _build_stats(kernel, args, constexprs, num_warps, key)[0]


def local_bytes(kernel, args, constexprs: dict, num_warps: int, key) -> int:
    """Local memory a thread of ``kernel``'s build (this config) takes: its register spills, as the
    triton installed here and its ptxas build it (0 in the interpreter). Cached by ``key``."""
    return _build_stats(kernel, args, constexprs, num_warps, key)[1]


def _build_stats(kernel, args, constexprs: dict, num_warps: int, key) -> tuple[int, int]:
    """(resident programs, local bytes a thread) of a build: see ``resident_programs``, ``local_bytes``."""
    if is_interpreter(args[0]):
        return 4, 0
    device = args[0].device
    key = (key, str(device), tuple(sorted(constexprs.items())), num_warps)
    if key not in _OCCUPANCY:
        compiled = kernel.warmup(*args, **constexprs, num_warps=num_warps, grid=(1,), **COMPILE_OPTIONS)
        if hasattr(compiled, "_init_handles"):
            compiled._init_handles()
        props = triton.runtime.driver.active.utils.get_device_properties(device.index)
        per_sm = (getattr(torch.cuda.get_device_properties(device), "shared_memory_per_multiprocessor", 0)
                  or props["max_shared_mem"] + RESERVED_SHARED_PER_BLOCK)
        # (a warp-specialized build has more warps than it was asked for: its partitions')
        warps = getattr(compiled.metadata, "num_warps", num_warps)
        occ = occupancy(compiled.n_regs, compiled.metadata.shared, warps, props["max_num_regs"], per_sm)
        # (triton's n_spills is the driver's local memory size a thread, in 4-byte words)
        _OCCUPANCY[key] = (props["multiprocessor_count"] * occ, 4 * int(getattr(compiled, "n_spills", 0) or 0))
    return _OCCUPANCY[key]


#: Shared memory CUDA keeps for itself in every block on top of the kernel's own
#: (cudaDevAttrReservedSharedMemoryPerBlock: 1 KB on sm_80 to sm_90).
RESERVED_SHARED_PER_BLOCK = 1024


def occupancy(n_regs: int, shared: int, num_warps: int, regs_per_sm: int, shared_per_sm: int) -> int:
    """Blocks of a kernel one multiprocessor holds at once: by registers (``n_regs`` per thread,
    allocated per warp in units of 256), by shared memory (``shared`` bytes per block plus the
    reserved ``RESERVED_SHARED_PER_BLOCK``), and the 64-warp / 32-block limits; at least 1.

    (Without the reserved kilobyte, four blocks of 57.9 KB counted as fitting 228 KB; three ran,
    and the persistent kernels' waits for the fourth gave up: H200, session 15.)"""
    regs_per_warp = -(-n_regs * 32 // 256) * 256
    occ = regs_per_sm // max(1, regs_per_warp * num_warps)
    occ = min(occ, shared_per_sm // (shared + RESERVED_SHARED_PER_BLOCK))
    return max(1, min(occ, 64 // num_warps, 32))


def element_size(*tensors: torch.Tensor) -> int:
    """The widest element of these tensors, in bytes: the key of the tables by element size (a
    backward's y and dy may differ)."""
    return max(t.element_size() for t in tensors)


def spec_key(*tensors) -> tuple:
    """What Triton specializes a persistent kernel on: dtypes and 16-alignment of pointers, strides."""
    return tuple((t.dtype, t.data_ptr() % 16 == 0, tuple(s % 16 == 0 for s in t.stride())) for t in tensors)


def split_plan(k: int, m: int, programs: int, chunk_bytes: int = 0):
    """(Q, G, R) for rows of k chunks on ``programs`` resident programs.

    Q programs per row with R chunks each (R = ceil(k / programs), Q = ceil(k / R), so every program
    of a row has R chunks but the last few), G = rows in flight = programs // Q (at most m). Rows of
    at most PERSISTENT_WAVE_BYTES // chunk_bytes chunks get only that many programs, so that the rows
    in flight stay in L2 until they are re-read.
    """
    if PERSISTENT_WAVE_BYTES and chunk_bytes:
        wave = max(1, PERSISTENT_WAVE_BYTES // chunk_bytes)
        if k <= wave:
            programs = min(programs, wave)
    r = cdiv(k, programs)
    q = cdiv(k, r)
    g = max(1, min(programs // q, m))
    return q, g, r


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def check_rows(x: torch.Tensor, name: str, fn: str) -> None:
    """Raise unless ``x`` is an (M, N) float16/bfloat16/float32 tensor with unit column stride."""
    if x.dim() != 2:
        raise ValueError(f"{fn}: {name} must be (M, N), got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{fn}: {name} must be float32, float16 or bfloat16, got {x.dtype}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"{fn}: {name} must have stride 1 along its rows, got strides {x.stride()}")


def _row_vector(v: torch.Tensor, m: int, x: torch.Tensor, name: str, fn: str) -> torch.Tensor:
    """A per-row float32 vector, contiguous, checked against the rows."""
    if v.dim() != 1 or v.shape[0] != m:
        raise ValueError(f"{fn}: {name} must be ({m},), got shape {tuple(v.shape)}")
    if v.device != x.device:
        raise ValueError(f"{fn}: {name} is on {v.device}, x on {x.device}")
    return v.to(torch.float32).contiguous()


def rows_tile_args(m: int, n: int, block_m: int, block_n: int, row_strides, load_evict: str = "",
                   align: int = 1, tail_n: int = 0, edges: bool = False) -> dict:
    """Specializations of a rows kernel on (m, n) rows in tiles of block_m rows x (block_n + tail_n)
    columns (the tensors' row strides given): EVEN when the tiles cover the rows exactly (no masks;
    ``ROWS_EXACT``), OFFS64 unless every offset, padding rows included, fits in 32 bits, x's (y's)
    eviction policy for the loads, ALIGN and EDGES (``row_align``, ``row_edges``: with EDGES the
    tiles cover n + align - 1 columns) and TAIL_N (``rows_config``)."""
    width = block_n + tail_n
    last = (cdiv(m, block_m) * block_m - 1) * max([abs(int(s)) for s in row_strides] + [n]) + width - 1
    return dict(EVEN=bool(ROWS_EXACT and align == 1 and n == width and m % block_m == 0),
                OFFS64=last > 2**31 - 1, LOAD_EVICT=load_evict, ALIGN=align, EDGES=edges, TAIL_N=tail_n)


def rows_register_cap(block_m: int, block_n: int, warps: int, caps=None) -> dict:
    """The launch option ``maxnreg`` of a rows kernel of ``warps`` warps on main tiles of block_m rows x
    block_n columns, where an entry of ``caps`` (registers, fewest and most elements of the main tile a
    thread holds; default ``ROWS_REGISTER_CAP``) applies to it: programs of at least 16 warps; else no
    option (``{}``)."""
    per_thread = block_m * block_n // (32 * warps)
    for regs, fewest, most in (ROWS_REGISTER_CAP if caps is None else caps) or ():
        if warps >= 16 and fewest <= per_thread <= most:
            return {"maxnreg": regs}
    return {}


def rows_plan(x, y, store_lse: bool, layout=None) -> tuple:
    """(grid, keyword arguments) of the rows kernel on (M, N) rows x writing y and, with ``store_lse``,
    lse (y None: the row statistics instead); ``layout``: the tensors' ``row_layout``, where the caller
    has it from ``rows_fit``. Depends on the layouts only (``plan_memo``)."""
    m, n = x.shape
    align, edges, cols = layout or row_layout(*((x,) if y is None else (x, y)))
    vector = (align if align > 1 else 16 // x.element_size()) if ROWS_TAIL_VECTORS else 0
    block_m, block_n, tail_n, warps = rows_config(m, cols, x.element_size(), vector=vector)
    strides = (x.stride(0), 0 if y is None else y.stride(0))
    return (cdiv(m, block_m),), dict(
        BLOCK_M=block_m, BLOCK_N=block_n, STORE_Y=y is not None, STORE_LSE=store_lse, num_warps=warps,
        **rows_register_cap(block_m, block_n, warps), **COMPILE_OPTIONS, FTZ=ROWS_EXP[0] and not is_interpreter(x),
        FMA=ROWS_EXP[1], **rows_tile_args(m, n, block_m, block_n, strides, ROWS_LOAD_EVICT, align, tail_n, edges))


def _rows(plan, x, y, lse, mx, sx) -> None:
    """The rows kernel by ``rows_plan``'s ``plan``: y and lse, or (y None) the row statistics into mx, sx
    (the pointers a plan does not write take any tensor)."""
    grid, kwargs = plan
    m, n = x.shape
    launch_kernel(_softmax_rows_kernel, grid, x, x if y is None else y, lse, mx, sx, m, n, x.stride(0),
                  0 if y is None else y.stride(0), **kwargs)


def stats_plan(x) -> tuple:
    """What ``_two_pass_stats`` launches on (M, N) rows x, which depends on x's layout only (shape, row
    stride, 16-byte alignment) and the stream knobs: (K, chunk-statistics grid and keyword arguments,
    combine grid and keyword arguments). The held path keeps it in its memoized plan."""
    m, n = x.shape
    elem, align = x.element_size(), row_align(x) if STREAM_ALIGNED_VECTORS["fwd"] else 1
    block_m, block_n, k, warps = stream_config(m, n, elem, align)
    return (k, (cdiv(m, block_m) * k,), dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, **COMPILE_OPTIONS,
                                             **stream_args(x, block_m, block_n, align)), *partials_plan(m, k))


def partials_plan(m: int, k: int) -> tuple:
    """(grid, keyword arguments) of the kernels that reduce (M, K) float32 partials to rows (the two-pass
    paths' combine, forward and backward): tiles of at most 4096 partials, K in blocks of up to 256."""
    block_k = min(next_power_of_2(k), 256)
    cm = max(1, min(4096 // block_k, next_power_of_2(m)))
    return (cdiv(m, cm),), dict(BLOCK_M=cm, BLOCK_K=block_k, num_warps=4, **COMPILE_OPTIONS)


def _two_pass_stats(x, out=None, plan=None):
    """Chunk statistics + combine: (lse, row max, row sum of exp(x - max)), each (M,) float32 (the
    rows of ``out``, a (3, M) float32 tensor, where given). ``plan``: ``stats_plan(x)``, where the
    caller keeps it."""
    m, n = x.shape
    k, grid, kwargs, combine_grid, combine_kwargs = plan or memo("stats", (x,), None, lambda: stats_plan(x),
                                                                  stream_knobs())
    pm = torch.empty((m, k), dtype=torch.float32, device=x.device)
    ps = torch.empty_like(pm)
    launch_kernel(_chunk_stats_kernel, grid, x, pm, ps, m, n, k, x.stride(0), **kwargs)
    lse, shift, total = (torch.empty(m, dtype=torch.float32, device=x.device) for _ in range(3)) if out is None else out
    launch_kernel(_combine_stats_kernel, combine_grid, pm, ps, lse, shift, total, m, k, **combine_kwargs)
    return lse, shift, total


def normalize_plan(x, y) -> tuple:
    """What ``_normalize_into`` launches on (M, N) rows x into y (layouts only, as ``stats_plan``):
    (grid, keyword arguments, K)."""
    m, n = x.shape
    elem, align = x.element_size(), row_align(x, y) if STREAM_ALIGNED_VECTORS["fwd"] else 1
    block_m, block_n, k, warps = stream_config(m, n, elem, align)
    return ((cdiv(m, block_m) * k,), dict(BLOCK_M=block_m, BLOCK_N=block_n, REVERSED=STREAM_SECOND_PASS_REVERSED,
                                          num_warps=warps, **COMPILE_OPTIONS,
                                          **stream_args(x, block_m, block_n, align, y)), k)


def _normalize_into(x, y, shift, total, plan=None) -> None:
    """y = exp(x - shift) / total per row, (M, N) rows; ``plan``: ``normalize_plan(x, y)``."""
    m, n = x.shape
    grid, kwargs, k = plan or memo("normalize", (x, y), None, lambda: normalize_plan(x, y), stream_knobs())
    launch_kernel(_normalize_kernel, grid, x, y, shift, total, m, n, k, x.stride(0), y.stride(0), **kwargs)


def _persistent(x, y, lse) -> None:
    """The persistent split path (see _softmax_persistent_kernel)."""
    m, n = x.shape
    chunk, warps = split_chunk(x.element_size())
    k = cdiv(n, chunk)
    err = error_counter(x.device)
    cnt = torch.zeros(m, dtype=torch.int32, device=x.device)
    consts = dict(CHUNK=chunk, PB=PARTIAL_BLOCK, LOAD_EVICT=PERSISTENT_EVICT[0], STORE_EVICT=PERSISTENT_EVICT[1])
    # the grid size depends on the compiled kernel's occupancy: compile it first (lse stands in for
    # the partials, whose size depends on the grid; the kernel does not specialize on Q, G, R, LAG)
    args = [x, y, lse, lse, lse, cnt, err, m, n, x.stride(0), y.stride(0), 2, 2, 2, 2, SPIN_MAX]
    programs = resident_programs(_softmax_persistent_kernel, args, consts, warps,
                                 ("softmax_fwd", n % 16 == 0) + spec_key(x, y))
    if is_interpreter(x):
        q, g, r = interpreter_plan(k, m, programs)
    else:
        q, g, r = split_plan(k, m, programs, chunk * x.element_size())
    lag = 1 if r == 1 else 0
    pm = torch.empty((m, q), dtype=torch.float32, device=x.device)
    ps = torch.empty_like(pm)
    args[3:5] = [pm, ps]
    args[11:15] = [q, g, r, lag]
    launch_kernel(_softmax_persistent_kernel, (g * q,), *args, **consts, num_warps=warps, **COMPILE_OPTIONS)


def staged_fits(direction: str, a, b, out, any_length: bool = False) -> bool:
    """Whether (M, N) rows a, b (output out) may try ``softmax_staged`` (chunks held in shared
    memory): the row length (at least ``STAGED_MIN_N``, or any with ``any_length``, where the caller
    wants the staged kernel first: e.g. rows the rows kernel cannot hold, just short of its limit but
    past it once shifted to 16 bytes), the device and the alignment allow it (its launch
    may still refuse rows too long). H200, % of copy, staged against the paths such rows took before
    (``logs/2026-11-24-h200-s37-call3.log``): N = 32767 bf16 backward 82.3 against 40.3 (0.73x
    torch.compile), float32 forward 87.1 against 61.5, backward 87.4 against 73.6."""
    from . import softmax_staged as S  # that module imports this one: resolved at call time
    key = (direction, element_size(a, b))
    return (any_length or a.shape[1] >= S.STAGED_MIN_N[key]) and S.available(a, b, out)


def staged_launch(direction: str, a, b, out, lse=None) -> bool:
    """Split rows through ``softmax_staged`` where its launch accepts them (the caller has checked
    ``staged_fits``); False where it does not (the caller takes another path).

    Forward ``("fwd", x, x, y, lse)``; backward ``("bwd", y, dy, dx)``.
    """
    from . import softmax_staged as S
    return S.launch(direction, a, b, out, out if lse is None else lse)


def held_split(direction: str, a, b, out, lse=None) -> bool:
    """Rows longer than the staged kernel holds: leading columns held, the others read twice
    (``softmax_held``); False where it does not apply. Arguments as for ``staged_launch``."""
    from . import softmax_held  # imports this module: resolved at call time
    return softmax_held.held_split(direction, a, b, out, lse)


def _empty_rows(x, m):
    return torch.full((m,), NEG_INF, dtype=torch.float32, device=x.device)


def softmax_fwd(x: torch.Tensor, with_lse: bool = True):
    """Softmax of each row and its log-sum-exp.

    Args:
        x: (M, N) float32 / float16 / bfloat16, ``x.stride(1) == 1`` (any row stride).
        with_lse: False when the caller drops lse: the rows kernel then does not write it (the
            split paths compute it anyway) and None comes back in its place.
    Returns:
        (y, lse): y (M, N) contiguous in x.dtype; lse (M,) float32, natural log (or None). All
        ``-inf`` rows give y = 0, lse = ``-inf``.
    """
    check_rows(x, "x", "softmax_fwd")
    m, n = x.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y, _empty_rows(x, m) if with_lse else None
    staged, rows = memo("softmax_fwd", (x, y), with_lse, lambda: _fwd_route(x, y, with_lse), rows_knobs())
    # lse (M,) float32, not allocated where only the rows kernel runs and the caller drops it
    lse = torch.empty(m, dtype=torch.float32, device=x.device) if with_lse or staged or not rows else None
    if staged and staged_launch("fwd", x, x, y, lse):
        pass
    elif rows:
        spare = y if lse is None else lse  # (the rows kernel's unused pointers)
        _rows(rows, x, y, spare, spare, spare)
    elif held_split("fwd", x, x, y, lse):
        pass
    elif use_persistent(x, n * x.element_size(), PERSISTENT_MAX_ROW_BYTES, x.element_size()):
        _persistent(x, y, lse)
    else:
        lse, shift, total = _two_pass_stats(x)
        _normalize_into(x, y, shift, total)
    return y, lse if with_lse else None


def _fwd_route(x, y, with_lse: bool) -> tuple:
    """(staged, rows) of ``softmax_fwd`` on (M, N) rows x into y: whether the staged kernel is tried
    first (``staged_fits``), and the rows kernel's plan (``rows_plan``) where the rows fit it, else None
    (the split paths). Memoized by layout (``plan_memo``)."""
    elem = x.element_size()
    short = rows_fit(ROWS_MAX_N[elem], x, y, elementwise_limit=ROWS_MAX_N_ELEMENTWISE[elem])
    staged = staged_fits("fwd", x, x, y, any_length=short is None)
    return staged, rows_plan(x, y, with_lse, short) if short else None


def rows_knobs() -> tuple:
    """The knobs (module tables and switches, as they are now) that the rows kernel's plans and the
    short rows' routes read (``_fwd_route``, ``row_stats``' plan; ``softmax_bwd`` adds its own): the
    ``knobs`` of their ``plan_memo.memo``."""
    from . import softmax_staged as S
    return (ROWS_MAX_N, ROWS_MAX_N_ELEMENTWISE, ROWS_TILE, ELEMS_PER_THREAD, ROWS_MAX_WARPS, ROWS_EXACT, ROWS_TAIL,
            ROWS_WIDE_TAIL, ROWS_TAIL_VECTORS, ROWS_EXP, WHOLE_VECTOR_MIN_BYTES, ROWS_REGISTER_CAP, ROWS_LOAD_EVICT,
            S.STAGED, S.STAGED_MIN_N)


def row_stats(x: torch.Tensor):
    """(M, N) -> (m, s), each (M,) float32: the row max and sum(exp(x - m)) (one read of x).

    A row with no finite entry (all -inf, or N == 0) gives (-inf, 0). Rows are normalized from
    (m, s) rather than from a rounded lse, which would cost float32 digits at |x| ~ 1e4.
    """
    check_rows(x, "x", "row_stats")
    m, n = x.shape
    if m == 0 or n == 0:
        return _empty_rows(x, m), torch.zeros(m, dtype=torch.float32, device=x.device)
    if plan := memo("row_stats", (x,), None, lambda: _stats_route(x), rows_knobs()):
        mx = torch.empty(m, dtype=torch.float32, device=x.device)
        sx = torch.empty_like(mx)
        _rows(plan, x, None, mx, mx, sx)
        return mx, sx
    _, mx, sx = _two_pass_stats(x)
    return mx, sx


def _stats_route(x):
    """The rows kernel's plan of ``row_stats`` on (M, N) rows x where they fit it, else None."""
    elem = x.element_size()
    layout = rows_fit(ROWS_MAX_N[elem], x, elementwise_limit=ROWS_MAX_N_ELEMENTWISE[elem])
    return rows_plan(x, None, False, layout) if layout else None


def normalize(x: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """y = exp(x - m[:, None]) / s[:, None] in x.dtype, math in float32; rows with s = 0 give 0.

    Args:
        x: (M, N) float32 / float16 / bfloat16, ``x.stride(1) == 1``.
        m, s: (M,) float32 row statistics (e.g. ``row_stats`` merged over blocks or ranks).
    """
    check_rows(x, "x", "normalize")
    rows, n = x.shape
    m = _row_vector(m, rows, x, "m", "normalize")
    s = _row_vector(s, rows, x, "s", "normalize")
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows and n:
        _normalize_into(x, y, m, s)
    return y
