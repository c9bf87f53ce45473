"""Row softmax backward in Triton: ``row_dot`` and ``softmax_bwd`` on (M, N) rows.

``dx = y * (dy - delta)`` with ``delta = sum(y * dy)`` per row. The floor is two reads (y, dy) and
one write (dx). The regimes and knobs are those of ``softmax_fwd.py`` (its ``ROWS_TILE``,
``PERSISTENT``, ... apply here too), plus ``BWD_ROWS_MAX_N`` and ``BWD_SPLIT_CHUNK``:

- delta given: one elementwise pass (the floor).
- rows (``N <= BWD_ROWS_MAX_N``): whole rows per program, delta and dx in one kernel: y and dy
  summed in pieces and read again (from cache) for dx (``BWD_ROWS_CHUNK``), or held in registers.
- staged split (CUDA, ``softmax_staged.py``, tried first for rows of at least its
  ``STAGED_MIN_N``): chunks of y and dy held in shared memory across the row's wait; rows longer
  than shared memory holds go in two parts (``softmax_held.py``): leading columns staged, the
  others two-pass.
- persistent split (CUDA): each program of a persistent grid reduces its chunk of y and dy to a
  partial dot, publishes it at the row's counter, and writes dx once the row's partials are in,
  re-reading y and dy (from L2 when the rows in flight fit there).
- two-pass split (CPU / interpreter, or ``PERSISTENT = False``): partial dots, their sum, then the
  elementwise pass (y and dy read twice).

Contract: y, dy (M, N) float32/float16/bfloat16 with unit column stride (any row stride); dx is a
new contiguous (M, N) tensor in dy.dtype; delta is (M,) float32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import softmax_fwd as fwd
from .compile_options import COMPILE_OPTIONS
from .hostmath import cdiv
from .launcher import launch_kernel
from .plan_memo import memo
from .softmax_fwd import (chunk_edges, chunk_has_edges, chunk_ptrs, edge_tile, load_inside, load_tile, row_arrive,
                          row_offsets, row_wait, store_tile, stream_tile, tile_masks)

#: Rows up to this length are handled whole by one program: 96% (fp32) and 100% (bf16) of copy at
#: 32K with rows held in registers; at 64K they spilled (12-20%).
BWD_ROWS_MAX_N = 32768
#: Elements per program of the rows kernel (one row if longer), by element size.
BWD_ROWS_TILE = {4: 4096, 2: 4096}
#: Elements of the tile per thread (each of y and dy), by element size: sets the warps (with pieces, a
#: thread holds piece / (32 * warps) of them at a time).
BWD_ELEMS_PER_THREAD = {4: 8, 2: 8}
#: Most warps of a rows-kernel program in the backward.
BWD_ROWS_MAX_WARPS = 32
#: Backward rows kernel on rows with end vectors (EDGES, ``softmax_fwd.row_edges``) or a tail tile
#: (``softmax_fwd.tail_split``): their tile (fewer rows per program than ``BWD_ROWS_TILE``), by element
#: size, and (elements per thread, most warps) in place of ``BWD_ELEMS_PER_THREAD`` and
#: ``BWD_ROWS_MAX_WARPS`` (about half the warps) on main tiles of at most ``BWD_MASKED_MAX_BLOCK``
#: columns, by kind (rows with a tail tile alone: "tail"). H200, % of copy against the defaults
#: (``logs/2026-11-24-h200-s36-call3.log``, ``-call4.log``, ``-call5.log``): bf16 N = 300 / 302 / 600 /
#: 1001 / 4097 / 8193 / 16385 100.7 / 90.3 / 101.5 / 101.7 / 88.9 / 81.7 / 76.3 against 77.3 / 77.8 /
#: 92.7 / 84.7 / 70.7 / 71.5 / 73.5 (torch.compile at 300 / 302 / 600 / 1001: 100.5 / 100.9 / 100.4 /
#: 85.6); float32 1001 / 3001 / 4097 / 10001 / 16385 100.0 / 101.8 / 102.1 / 99.6 / 102.0 against 91.5 /
#: 89.1 / 96.3 / 71.5 / 88.9. Not on tiles of 32768 (N = 30001: bf16 48.2 against 65.0), nor on rows
#: with a tail tile alone past 1024 columns (bf16 6144: 92.5 against 99.4). The float32 tile of 1024
#: against 4096 (``-call9.log``): N = 302 100.9 / 94.1, but 300 / 600 99.9 / 100.8, 100.5 / 102.2.
BWD_MASKED_ROWS_TILE = {4: 1024, 2: 1024}
BWD_MASKED_WARPS = (16, 16)
BWD_MASKED_MAX_BLOCK = {"edges": 16384, "tail": 1024}
#: ... and rows with a tail tile of at most a quarter of the main tile on main tiles of at most this
#: many columns (tails of half the main tile, ``BWD_ROWS_WIDE_TAIL``, lost there: bf16 3072 / 6144 93.0 /
#: 94.2 against 102.4 / 99.4). H200, bf16, % of copy against 8 elements a thread
#: (``logs/2026-11-24-h200-s38-call7.log``): N = 4352 / 4608 / 5120 99.2 / 98.6 / 97.0 against 87.5 / 90.0 /
#: 93.7 (torch.compile 90.5 / 88.8 / 93.4).
BWD_MASKED_QUARTER_TAIL = 4096
#: Masked rows past ``BWD_MASKED_MAX_BLOCK``, by element size: (most warps, in place of
#: ``BWD_ROWS_MAX_WARPS``, on main tiles of at most this many columns); None: ``BWD_ROWS_MAX_WARPS``.
#: H200, % of copy, 16 warps against 32 (``logs/2026-11-24-h200-s38-call1.log``, ``-call2.log``): bf16
#: N = 8200 / 8448 / 9000 / 9216 / 10240 (8192 + a tail) 94.4 / 87.5 / 98.0 / 102.1 / 100.9 against 89.0 /
#: 77.5 / 71.3 / 75.4 / 81.5 (torch.compile 89.9 / 92.4 / 93.2 / 101.5 / 99.7); on 16384 they lost (17500 /
#: 18500 / 19500 77.9 / 78.4 / 77.6 against 82.1 / 96.5 / 97.9), float32 too (8200 / 9000 / 10240 96.5 /
#: 87.2 / 95.9 against 104.2 / 101.4 / 103.5).
BWD_MASKED_WARPS_CAP = {4: None, 2: (16, 8192)}
#: Masked rows (``masked_kind``) that try the staged kernel (``softmax_staged``) before the rows kernel,
#: by element size: (kinds, fewest main-tile columns); None: none. Kind "tail" counts rows whose starts
#: and lengths are whole 16-byte vectors (``row_align`` 1); rows of whole narrower vectors with a tail
#: tile stay on the rows kernel. H200, % of copy, staged against the rows kernel
#: (``logs/2026-11-24-h200-s37-call4.log``, ``-call6.log``):
#: - bf16, end vectors: N = 16385 / 20001 / 24577 / 30001 76.7 / 84.3 / 81.0 / 84.5 against 75.8 / 65.3 /
#:   54.1 / 64.2; a tail tile, N a multiple of 16: 16400 / 20000 91.2 / 97.8 against 80.9 / 90.3; shifted
#:   tails lost: 16500 / 17000 / 18500 / 19500 78.8 / 84.5 / 83.3 / 84.7 against 91.1 / 88.6 / 97.3 / 98.6.
#:   On main tiles of 8192 mixed (10240 97.9 against 80.4, but 8193 / 8200 62.8 / 70.7 against 82.1 / 88.8).
#: - float32, a tail tile, N a multiple of 16: 16400 / 18000 / 20000 / 20480 96.3 / 100.3 / 102.3 / 102.1
#:   against 95.3 / 91.3 / 86.4 / 89.1 (torch.compile 102.2 at 20000); shifted tails mixed (16500 / 17000 /
#:   17500 88.1 / 92.1 / 90.4 against 91.7 / 95.8 / 94.8, 19000 / 19500 98.0 / 94.8 against 90.6 / 89.8);
#:   end vectors lost (16385 83.0 against 102.0).
BWD_STAGED_MASKED = {4: (("tail",), 16384), 2: (("edges", "tail"), 16384)}
#: Rows of whole 16-byte vectors (``row_align`` 1) of at least this many columns try the staged kernel
#: before the rows kernel, by element size (None: none). H200, % of copy, staged (8192 by 4 warps) against
#: the rows kernel's one tile of 32768 (``logs/2026-11-24-h200-s38-call12.log``, ``-call13.log``): bf16 N =
#: 30720 / 32000 / 32064 / 32768 99.4 / 100.3 / 100.2 / 100.5 against 97.5 / 96.7 / 96.6 / 97.9 (torch.compile
#: 95.8 / 99.0 / 98.4 / 99.5); shorter ones lost (26624 / 28672 94.3 / 97.6 against 99.9 / 99.5), and so did
#: rows of whole narrower vectors (the shifted table's 4096 by 4: 31000 / 32008 / 32760 89.6 / 89.8 / 89.8
#: against 96.5 / 96.0 / 95.5).
BWD_STAGED_ALIGNED_MIN_N = {4: None, 2: 30720}
#: The same for rows whose tiles move an element at a time (``softmax_fwd.moves_elements``: a data
#: pointer off 16 bytes, say; 16-bit rows so are never staged, ``softmax_staged.available``). H100, float32
#: rows 4 bytes off 16 (``logs/2026-11-24-h100-s42-call7-offset.log``, ``-call8-offset.log``), % of copy,
#: staged against the rows kernel: 25600 / 26624 / 27648 / 28000 / 30720 / 32000 / 32768 90.4 / 91.4 /
#: 92.1 / 91.8 / 91.4 / 92.0 / 92.3 against 85.9 / 86.3 / 83.9 / 81.8 / 85.8 / 89.1 / 54.9 (torch.compile
#: 58.5-60.0: 32768 was 0.93x it); but 29000 87.7 against 95.5, and shorter rows lost (24576 92.3
#: against 95.7, 8192 92.4 against 102.4).
BWD_STAGED_ELEMENTWISE_MIN_N = {4: 25600, 2: None}
#: Eviction policy of the backward rows kernel's loads of y and dy ("" = the default).
BWD_ROWS_LOAD_EVICT = ""
#: Backward rows kernel, by element size: None holds whole rows in registers; a number sums the rows
#: in pieces of that many columns (at most the row) and reads them again for dx. With 4096-element
#: tiles, 8 per thread, up to 32 warps (session 10 sweep, H200): 101-103% of copy at 1K-16K, 98-100%
#: at 32K, against 97-101% and 93-97% for whole rows in 4096-element tiles of 16 per thread.
BWD_ROWS_CHUNK = {4: 16384, 2: 16384}
#: Rows with a tail tile alone (``masked_kind`` "tail") whose two tiles cover (fewest, most) columns hold y
#: and dy in registers (no ``BWD_ROWS_CHUNK`` pieces), by element size (None: none). H200, % of copy,
#: registers against pieces: float32 N = 16500 / 17000 / 17500 / 18500 / 19000 / 19500 / 20100 (tails of
#: rows in 4-element vectors; N % 16 = 0 goes staged) 99.5 / 98.0 / 98.2 / 100.1 / 100.0 / 101.0 / 101.2
#: against 91.6 / 93.6 / 92.9 / 90.7 / 89.2 / 88.3 / 86.6 (torch.compile 88.5-101.2; ``-s38-call5.log``);
#: bf16 there lost by 17-27; float32 on 8192 mixed (``-call1.log``: 9000 102.8 / 101.4, 8200 87.3 / 104.2).
#: bf16 (``-call8.log``, with ``BWD_MASKED_QUARTER_TAIL``) 1088 / 1152 / 1280 / 1536 / 2080 / 2176 / 2304 /
#: 2560 101.1 / 101.4 / 100.7 / 101.1 / 100.5 / 101.6 / 101.5 / 101.0 against 94.4 / 94.2 / 91.8 / 88.6 / 98.0 /
#: 97.4 / 96.7 / 95.0 (torch.compile 80.5-95.9), but 3072 (2048 + 1024) 96.5 against 101.8, and 4352 76.9
#: against 87.5 (``-call7.log``).
BWD_TAIL_REGISTERS = {4: (16385, 20480), 2: (1025, 2560)}
#: ``softmax_fwd.ROWS_WIDE_TAIL`` of the backward rows kernel: 16-bit rows up to 8192 columns (bf16
#: 3072 / 6144: 1.05 / 1.12x against one tile, but 12288 0.91x; float32 0.90-1.00x; H200, session 35).
BWD_ROWS_WIDE_TAIL = {4: 0, 2: 8192}
#: Rows with a tail tile alone (``masked_kind`` "tail") whose main tile has (fewest, most) columns take
#: one tile instead, by element size (None: none). H200, % of copy, one tile against the tail tile
#: (``logs/2026-11-24-h200-s38-call4.log``): float32 N = 1040 / 1088 / 1152 / 1280 / 2304 / 2560 / 4608 /
#: 5120 103.3 / 103.9 / 103.7 / 103.5 / 103.7 / 103.4 / 103.0 / 103.8 against 95.5 / 86.0 / 83.4 / 81.9 /
#: 98.0 / 95.3 / 101.4 / 100.3 (torch.compile 103-104); ties on 8192 (8320-10240, ``-call3.log``); 600
#: (512 + 128) 98.0 against 100.7. bf16 lost nearly everywhere (``-call3.log``: 4160-5120 by 14-22).
BWD_ONE_TILE = {4: (1024, 4096), 2: None}
#: Split rows of at most this many bytes (y and dy) take the persistent kernel, longer ones the
#: two-pass path (measured faster there), by the larger element size. None: no limit.
BWD_PERSISTENT_MAX_ROW_BYTES = {4: 8 << 20, 2: 8 << 20}
#: Split rows in the backward: (chunk elements per program, num_warps) by the larger element size
#: of y and dy.
BWD_SPLIT_CHUNK = {4: (2048, 4), 2: (4096, 8)}


@triton.jit
def _load0(P, row, start, N, stride, offs, EVICT: tl.constexpr):
    ptrs, ok = chunk_ptrs(P, row, start, N, stride, offs)
    return tl.load(ptrs, mask=ok, other=0.0, eviction_policy=EVICT).to(tl.float32)


@triton.jit
def _dx(y, dy, delta):
    """dx = y (dy - delta) of float32 (rows x cols) blocks, ``delta`` (rows,): one formula for the
    tiles and the rows' end vectors."""
    return y * (dy - delta[:, None])


@triton.jit
def _load_pair(Y, DY, rows_o, cols, mask, stride_ym, stride_dym, EVICT: tl.constexpr, ALIGN: tl.constexpr):
    """y and dy on a (rows x cols) tile, as float32, 0 where not ``mask`` (a body or ``edge_tile``'s mask;
    ALIGN: ``softmax_fwd.row_offsets``)."""
    return (load_tile(Y, row_offsets(rows_o, stride_ym, ALIGN), cols, mask, 0.0, False, EVICT),
            load_tile(DY, row_offsets(rows_o, stride_dym, ALIGN), cols, mask, 0.0, False, EVICT))


@triton.jit
def _pair_tile(Y, DY, rows_o, row_ok, cols, N, stride_ym, stride_dym, EVEN: tl.constexpr, EVICT: tl.constexpr,
               ALIGN: tl.constexpr, EDGES: tl.constexpr):
    """(y, dy, body) on the (rows x cols) tile ``cols`` ((1, n) int32): all of the rows' elements
    there, as float32 (0 elsewhere; ``softmax_fwd.tile_masks``, ``load_inside``), and the body mask
    for dx."""
    load, inside, body = tile_masks(rows_o, row_ok, cols, N, stride_ym, ALIGN, EDGES)
    y = load_inside(Y, row_offsets(rows_o, stride_ym, ALIGN), cols, load, inside, 0.0, EVEN, EVICT, EDGES)
    dy = load_inside(DY, row_offsets(rows_o, stride_dym, ALIGN), cols, load, inside, 0.0, EVEN, EVICT, EDGES)
    return y, dy, body


@triton.jit
def _store_dx(DX, rows_o, cols, mask, y, dy, delta, stride_dxm, EVEN: tl.constexpr, ALIGN: tl.constexpr):
    """Store dx = y (dy - delta) on a (rows x cols) tile where ``mask`` (``store_tile``)."""
    store_tile(DX, row_offsets(rows_o, stride_dxm, ALIGN), cols, mask, _dx(y, dy, delta), EVEN)


@triton.jit
def _dx_edges(Y, DY, DX, rows_o, cols, edge, stride_ym, stride_dym, stride_dxm, delta, ALIGN: tl.constexpr):
    """dx on the rows' end vectors (``edge_tile``'s cols and mask), an element at a time, from y and dy
    read there (again, in the rows kernel: cache hits)."""
    y, dy = _load_pair(Y, DY, rows_o, cols, edge, stride_ym, stride_dym, "", ALIGN)
    _store_dx(DX, rows_o, cols, edge, y, dy, delta, stride_dxm, False, ALIGN)


@triton.jit
def _bwd_rows_kernel(Y, DY, DX, DELTA, M, N, stride_ym, stride_dym, stride_dxm,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STORE_DX: tl.constexpr,
                     EVEN: tl.constexpr, OFFS64: tl.constexpr, LOAD_EVICT: tl.constexpr, ALIGN: tl.constexpr,
                     EDGES: tl.constexpr, RELOAD: tl.constexpr, CHUNK: tl.constexpr, TAIL_N: tl.constexpr):
    """BLOCK_M whole rows per program: delta = sum(y * dy), dx = y * (dy - delta). EVEN, OFFS64,
    LOAD_EVICT, ALIGN, EDGES, TAIL_N: ``softmax_fwd.rows_tile_args``.

    Without RELOAD the rows stay in registers between the sum and dx: columns [0, BLOCK_N) in the
    main tile (a power of two) and [BLOCK_N, BLOCK_N + TAIL_N) in a tail tile (TAIL_N > 0,
    ``softmax_fwd.rows_config``). With RELOAD the sum walks the rows' columns [0, BLOCK_N) in
    CHUNK-column pieces (BLOCK_N: a multiple of CHUNK, ``_rows``), then a tail piece of TAIL_N < CHUNK
    columns, and dx reads them again (from cache: the program just read them), so registers hold one
    piece at a time (torch.compile's backward does this).

    The tiles hold all of the rows' elements for the sum (``load_inside``) and write dx on their
    aligned vectors; with EDGES the rows' end vectors then get dx an element at a time, from y and dy
    read again there (``edge_tile``). (Summing the end vectors on the edge tile instead, as the
    forward's rows kernel does, measured slower here: bf16 N = 4097, H200: 57 against 72% of copy;
    that tile then takes the tiles' layout, 8 elements a thread, as many as the tiles have.)"""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows_o = rows.to(tl.int64) if OFFS64 else rows
    if not RELOAD:
        # the rows in registers (main tile, then tail tile): delta, then dx on their aligned vectors
        cols = tl.arange(0, BLOCK_N)[None, :]
        y, dy, body = _pair_tile(Y, DY, rows_o, row_ok, cols, N, stride_ym, stride_dym, EVEN, LOAD_EVICT, ALIGN,
                                 EDGES)
        delta = tl.sum(y * dy, axis=1)
        if TAIL_N > 0:
            cols_t = BLOCK_N + tl.arange(0, TAIL_N)[None, :]
            y_t, dy_t, body_t = _pair_tile(Y, DY, rows_o, row_ok, cols_t, N, stride_ym, stride_dym, EVEN, LOAD_EVICT,
                                           ALIGN, EDGES)
            delta += tl.sum(y_t * dy_t, axis=1)
        if STORE_DX:
            _store_dx(DX, rows_o, cols, body, y, dy, delta, stride_dxm, EVEN, ALIGN)
            if TAIL_N > 0:
                _store_dx(DX, rows_o, cols_t, body_t, y_t, dy_t, delta, stride_dxm, EVEN, ALIGN)
    else:
        # the sum, piece by piece, then the tail piece (kept in L2 for the second read)
        acc = tl.zeros([BLOCK_M, CHUNK], tl.float32)
        for c0 in tl.range(0, BLOCK_N, CHUNK):
            cols = c0 + tl.arange(0, CHUNK)[None, :]
            y, dy, _ = _pair_tile(Y, DY, rows_o, row_ok, cols, N, stride_ym, stride_dym, EVEN, "evict_last", ALIGN,
                                  EDGES)
            acc += y * dy
        delta = tl.sum(acc, axis=1)
        if TAIL_N > 0:
            cols_t = BLOCK_N + tl.arange(0, TAIL_N)[None, :]
            y_t, dy_t, _ = _pair_tile(Y, DY, rows_o, row_ok, cols_t, N, stride_ym, stride_dym, EVEN, "evict_last",
                                      ALIGN, EDGES)
            delta += tl.sum(y_t * dy_t, axis=1)
        if STORE_DX:
            # dx on the aligned vectors, reading the pieces again
            for c0 in tl.range(0, BLOCK_N, CHUNK):
                cols = c0 + tl.arange(0, CHUNK)[None, :]
                y, dy, body = _pair_tile(Y, DY, rows_o, row_ok, cols, N, stride_ym, stride_dym, EVEN, "evict_first",
                                         ALIGN, EDGES)
                _store_dx(DX, rows_o, cols, body, y, dy, delta, stride_dxm, EVEN, ALIGN)
            if TAIL_N > 0:
                y_t, dy_t, body_t = _pair_tile(Y, DY, rows_o, row_ok, cols_t, N, stride_ym, stride_dym, EVEN,
                                               "evict_first", ALIGN, EDGES)
                _store_dx(DX, rows_o, cols_t, body_t, y_t, dy_t, delta, stride_dxm, EVEN, ALIGN)
    if STORE_DX:
        # dx on the rows' end vectors
        if EDGES:
            cols_e, edge = edge_tile(rows_o, row_ok, N, stride_ym, ALIGN)
            _dx_edges(Y, DY, DX, rows_o, cols_e, edge, stride_ym, stride_dym, stride_dxm, delta, ALIGN)
    else:
        tl.store(DELTA + rows, delta, mask=row_ok)


@triton.jit
def _bwd_elementwise_kernel(Y, DY, DX, DELTA, M, N, K, stride_ym, stride_dym, stride_dxm,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, REVERSED: tl.constexpr,
                            ALIGN: tl.constexpr, EDGES: tl.constexpr):
    """dx = y * (dy - delta[row]) on a (BLOCK_M rows x BLOCK_N) tile; program = (row block, chunk),
    ``REVERSED``: last tile first (see ``STREAM_SECOND_PASS_REVERSED``; ALIGN, EDGES:
    ``softmax_fwd.tile_masks``, ``chunk_edges``)."""
    rows64, cols, k, row_ok = stream_tile(M, K, BLOCK_M, BLOCK_N, REVERSED)
    delta = tl.load(DELTA + rows64, mask=row_ok, other=0.0)
    # the tile's aligned vectors wholly inside the rows (all of the rows without EDGES)
    body = tile_masks(rows64, row_ok, cols, N, stride_ym, ALIGN, EDGES)[2]
    y, dy = _load_pair(Y, DY, rows64, cols, body, stride_ym, stride_dym, "", ALIGN)
    _store_dx(DX, rows64, cols, body, y, dy, delta, stride_dxm, False, ALIGN)
    # the rows' end vectors in this chunk (if any), an element at a time
    if EDGES:
        if chunk_has_edges(k, N, BLOCK_N, ALIGN):
            cols_e, edge = chunk_edges(rows64, row_ok, k, N, stride_ym, BLOCK_N, ALIGN)
            _dx_edges(Y, DY, DX, rows64, cols_e, edge, stride_ym, stride_dym, stride_dxm, delta, ALIGN)


@triton.jit
def _partial_dot_kernel(Y, DY, PD, M, N, K, stride_ym, stride_dym,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr, EDGES: tl.constexpr):
    """Two-pass, pass 1: sum(y * dy) over chunk k of BLOCK_M rows -> PD (M, K) (ALIGN, EDGES:
    ``softmax_fwd.tile_masks``)."""
    rows64, cols, k, row_ok = stream_tile(M, K, BLOCK_M, BLOCK_N, False)
    y, dy, _ = _pair_tile(Y, DY, rows64, row_ok, cols, N, stride_ym, stride_dym, False, "", ALIGN, EDGES)
    tl.store(PD + rows64 * K + k, tl.sum(y * dy, axis=1), mask=row_ok)


@triton.jit
def _sum_partials_kernel(PD, DELTA, M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Two-pass, combine: delta[row] = sum of the row's K partial dots."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows64 = rows.to(tl.int64)
    acc = tl.zeros([BLOCK_M], tl.float32)
    for j in range(0, K, BLOCK_K):
        ks = j + tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (ks[None, :] < K)
        acc += tl.sum(tl.load(PD + rows64[:, None] * K + ks[None, :], mask=mask, other=0.0), axis=1)
    tl.store(DELTA + rows, acc, mask=row_ok)


@triton.jit
def _dx_row(Y, DY, DX, PD, CNT, ERR, row, q, N, stride_ym, stride_dym, stride_dxm, Q, R, spin_max, offs,
            CHUNK: tl.constexpr, PB: tl.constexpr, STORE_EVICT: tl.constexpr):
    """Persistent path, pass 2 of one row: wait for its Q partial dots, then write dx for chunks q + r Q."""
    # delta = sum of the partials (read past L1), or of the whole row if they did not arrive
    delta = 0.0
    if row_wait(CNT + row, Q, spin_max, ERR):
        wbase = tl.cast(row, tl.int64) * Q
        for j in range(0, Q, PB):
            idx = j + tl.arange(0, PB)
            delta += tl.sum(tl.load(PD + wbase + idx, mask=idx < Q, other=0.0, cache_modifier=".cg"), axis=0)
    else:
        for c in range(0, Q * R):
            start = tl.cast(c, tl.int64) * CHUNK
            delta += tl.sum(_load0(Y, row, start, N, stride_ym, offs, "evict_first") *
                            _load0(DY, row, start, N, stride_dym, offs, "evict_first"), axis=0)
    # re-read y and dy (newest first: most likely still in L2) and write dx
    for i in range(0, R):
        start = (q + (R - 1 - i) * Q).to(tl.int64) * CHUNK
        yr = _load0(Y, row, start, N, stride_ym, offs, "evict_first")
        dyr = _load0(DY, row, start, N, stride_dym, offs, "evict_first")
        ptrs, ok = chunk_ptrs(DX, row, start, N, stride_dxm, offs)
        tl.store(ptrs, (yr * (dyr - delta)).to(DX.dtype.element_ty), mask=ok, eviction_policy=STORE_EVICT)


@triton.jit(do_not_specialize=["M", "Q", "G", "R", "LAG", "spin_max"])
def _bwd_persistent_kernel(Y, DY, DX, PD, CNT, ERR, M, N, stride_ym, stride_dym, stride_dxm,
                           Q, G, R, LAG, spin_max,
                           CHUNK: tl.constexpr, PB: tl.constexpr,
                           LOAD_EVICT: tl.constexpr, STORE_EVICT: tl.constexpr):
    """Split rows on a persistent grid (the schedule of softmax_fwd's persistent kernel).

    Program (slot, q) takes rows slot, slot + G, ...; of each row it reduces chunks q + r Q of y and
    dy to a partial dot, publishes it to PD (M, Q) and counts in at CNT[row]; it writes dx of a row
    once the row's Q partials are in (LAG = 1: after reducing the next row; LAG = 0: right away).
    """
    pid = tl.program_id(0)
    slot = pid // Q
    q = pid - slot * Q
    offs = tl.arange(0, CHUNK)
    for row in range(slot, M, G):
        # pass 1: this program's partial dot of the row
        d_run = 0.0
        for r in range(0, R):
            start = (q + r * Q).to(tl.int64) * CHUNK
            yr = _load0(Y, row, start, N, stride_ym, offs, LOAD_EVICT)
            dyr = _load0(DY, row, start, N, stride_dym, offs, LOAD_EVICT)
            d_run += tl.sum(yr * dyr, axis=0)
        tl.store(PD + tl.cast(row, tl.int64) * Q + q, d_run)
        row_arrive(CNT + row)
        # pass 2 of the previous row of this slot (LAG = 1) or of this row (LAG = 0)
        prev = row - LAG * G
        if prev >= slot:
            _dx_row(Y, DY, DX, PD, CNT, ERR, prev, q, N, stride_ym, stride_dym, stride_dxm, Q, R, spin_max,
                    offs, CHUNK, PB, STORE_EVICT)
    if LAG > 0:
        if slot < M:
            last_row = slot + ((M - 1 - slot) // G) * G
            _dx_row(Y, DY, DX, PD, CNT, ERR, last_row, q, N, stride_ym, stride_dym, stride_dxm, Q, R, spin_max,
                    offs, CHUNK, PB, STORE_EVICT)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------
def _check_pair(y: torch.Tensor, dy: torch.Tensor, fn: str) -> None:
    fwd.check_rows(y, "y", fn)
    fwd.check_rows(dy, "dy", fn)
    if y.shape != dy.shape:
        raise ValueError(f"{fn}: y {tuple(y.shape)} and dy {tuple(dy.shape)} must have one shape")
    if y.device != dy.device:
        raise ValueError(f"{fn}: y is on {y.device}, dy on {dy.device}")


def masked_kind(cols: int, elem: int, edges: bool) -> tuple[int, int, str | None]:
    """(main tile columns, tail tile columns, kind) of the backward rows kernel on rows of ``cols``
    columns (``softmax_fwd.tail_split``, one tile where ``BWD_ONE_TILE`` says): kind "edges" for rows
    with end vectors (``edges``), "tail" for rows with a tail tile alone, None for rows in one tile
    without end vectors."""
    block_n, tail_n = fwd.tail_split(cols, BWD_ROWS_WIDE_TAIL[elem])
    if tail_n and not edges and (one := BWD_ONE_TILE.get(elem)) and one[0] <= block_n <= one[1]:
        block_n, tail_n = 2 * block_n, 0  # (tail_split's main tile is the largest power of two <= cols)
    return block_n, tail_n, "edges" if edges else "tail" if tail_n else None


def staged_first(layout, elem: int, *tensors: torch.Tensor) -> bool:
    """Whether rows of ``softmax_fwd.rows_fit``'s ``layout`` (None: too long for the rows kernel) try
    the staged kernel before the rows kernel: rows past the rows kernel, aligned rows of at least
    ``BWD_STAGED_ALIGNED_MIN_N`` columns, rows ``tensors`` (where given) whose tiles move an element at a
    time (``softmax_fwd.moves_elements``) of at least ``BWD_STAGED_ELEMENTWISE_MIN_N``, and masked rows
    (``masked_kind``) that ``BWD_STAGED_MASKED`` sends there."""
    if layout is None:
        return True
    least = BWD_STAGED_ELEMENTWISE_MIN_N.get(elem)
    if tensors and least and layout[2] >= least and fwd.moves_elements(layout, *tensors):
        return True
    if layout[0] == 1 and (least := BWD_STAGED_ALIGNED_MIN_N.get(elem)) and layout[2] >= least:
        return True
    kinds, shortest = BWD_STAGED_MASKED.get(elem) or ((), 0)
    block_n, _, kind = masked_kind(layout[2], elem, layout[1])
    # (tails of rows in narrower vectors, ALIGN > 1, stay on the rows kernel)
    return kind in kinds and block_n >= shortest and (kind != "tail" or layout[0] == 1)


def rows_config(m: int, cols: int, elem: int, edges: bool):
    """``softmax_fwd.rows_config`` of the backward rows kernel on m rows of ``cols`` columns: rows
    with end vectors (``edges``) or a tail tile take ``BWD_MASKED_ROWS_TILE`` and, on main tiles of at
    most ``BWD_MASKED_MAX_BLOCK`` columns, ``BWD_MASKED_WARPS``; the others ``BWD_ROWS_TILE``,
    ``BWD_ELEMS_PER_THREAD`` and ``BWD_ROWS_MAX_WARPS``."""
    block_n, tail_n, kind = masked_kind(cols, elem, edges)
    tile, per_thread, max_warps = BWD_ROWS_TILE, BWD_ELEMS_PER_THREAD, BWD_ROWS_MAX_WARPS
    if kind is not None:
        tile, cap = BWD_MASKED_ROWS_TILE, BWD_MASKED_WARPS_CAP[elem]
        narrow = kind == "tail" and 4 * tail_n <= block_n and block_n <= BWD_MASKED_QUARTER_TAIL
        if BWD_MASKED_WARPS and (block_n <= BWD_MASKED_MAX_BLOCK[kind] or narrow):
            per_thread, max_warps = dict.fromkeys(BWD_ELEMS_PER_THREAD, BWD_MASKED_WARPS[0]), BWD_MASKED_WARPS[1]
        elif cap and block_n <= cap[1]:
            max_warps = cap[0]
    return fwd.rows_config(m, cols, elem, per_thread=per_thread, tile=tile, max_warps=max_warps,
                           tiles=(block_n, tail_n))


def rows_in_registers(elem: int, block_n: int, tail_n: int, edges: bool) -> bool:
    """Whether the backward rows kernel holds y and dy in registers between the sum and dx (no RELOAD)
    on tiles of ``rows_config``: everywhere where ``BWD_ROWS_CHUNK`` is None, and on rows with a tail
    tile alone whose tiles cover as many columns as ``BWD_TAIL_REGISTERS`` says."""
    held = BWD_TAIL_REGISTERS[elem]
    return BWD_ROWS_CHUNK[elem] is None or bool(held and tail_n and not edges and
                                                 held[0] <= block_n + tail_n <= held[1])


def rows_plan(y, dy, dx, layout=None) -> tuple:
    """(grid, keyword arguments) of the rows kernel on (M, N) rows y, dy writing dx (None: the row sums of
    y * dy instead); ``layout``: the tensors' ``row_layout`` where the caller has it from
    ``softmax_fwd.rows_fit``. Depends on the layouts only (``plan_memo``)."""
    (m, n), elem = y.shape, fwd.element_size(y, dy)
    tensors = (y, dy) if dx is None else (y, dy, dx)
    align, edges, cols = layout or fwd.row_layout(*tensors, direction="bwd")
    block_m, block_n, tail_n, warps = rows_config(m, cols, elem, edges)
    reload = not rows_in_registers(elem, block_n, tail_n, edges)
    chunk = min(block_n, BWD_ROWS_CHUNK[elem] or block_n)
    if reload and tail_n >= chunk:  # (a tail of whole pieces: the pieces' loop takes it)
        block_n, tail_n = block_n + tail_n, 0
    strides = (y.stride(0), dy.stride(0), 0 if dx is None else dx.stride(0))
    return (cdiv(m, block_m),), dict(
        BLOCK_M=block_m, BLOCK_N=block_n, STORE_DX=dx is not None, num_warps=warps, RELOAD=reload, CHUNK=chunk,
        **COMPILE_OPTIONS, **fwd.rows_tile_args(m, n, block_m, block_n, strides, BWD_ROWS_LOAD_EVICT, align, tail_n,
                                                edges))


def _rows(plan, y, dy, dx, delta) -> None:
    """The rows kernel by ``rows_plan``'s ``plan``: dx, or (dx None) the row sums of y * dy into ``delta``."""
    grid, kwargs = plan
    m, n = y.shape
    launch_kernel(_bwd_rows_kernel, grid, y, dy, y if dx is None else dx, y if delta is None else delta, m, n,
                  y.stride(0), dy.stride(0), 0 if dx is None else dx.stride(0), **kwargs)


def dot_plan(y, dy) -> tuple:
    """What ``_two_pass_dot`` launches on (M, N) rows y, dy (their layouts only, as
    ``softmax_fwd.stats_plan``): (K, partial-dot grid and keyword arguments, sum grid and keyword
    arguments)."""
    m, n = y.shape
    elem, align = fwd.element_size(y, dy), fwd.row_align(y, dy) if fwd.STREAM_ALIGNED_VECTORS["bwd"] else 1
    block_m, block_n, k, warps = fwd.stream_config(m, n, elem, align)
    return (k, (cdiv(m, block_m) * k,), dict(BLOCK_M=block_m, BLOCK_N=block_n, ALIGN=align,
                                             EDGES=fwd.row_edges(align, y, dy), num_warps=warps, **COMPILE_OPTIONS),
            *fwd.partials_plan(m, k))


def _two_pass_dot(y, dy, out=None, plan=None) -> torch.Tensor:
    """(M,) float32 row sums of y * dy by partial sums (into ``out`` where given); ``plan``:
    ``dot_plan(y, dy)``, where the caller keeps it."""
    m, n = y.shape
    k, grid, kwargs, sum_grid, sum_kwargs = plan or memo("dot", (y, dy), None, lambda: dot_plan(y, dy),
                                                         fwd.stream_knobs())
    pd = torch.empty((m, k), dtype=torch.float32, device=y.device)
    launch_kernel(_partial_dot_kernel, grid, y, dy, pd, m, n, k, y.stride(0), dy.stride(0), **kwargs)
    delta = torch.empty(m, dtype=torch.float32, device=y.device) if out is None else out
    launch_kernel(_sum_partials_kernel, sum_grid, pd, delta, m, k, **sum_kwargs)
    return delta


def elementwise_plan(y, dy, dx) -> tuple:
    """What ``_elementwise`` launches on (M, N) rows (layouts only): (grid, keyword arguments, K)."""
    m, n = y.shape
    elem, align = fwd.element_size(y, dy), fwd.row_align(y, dy, dx) if fwd.STREAM_ALIGNED_VECTORS["bwd"] else 1
    block_m, block_n, k, warps = fwd.stream_config(m, n, elem, align)
    return ((cdiv(m, block_m) * k,), dict(BLOCK_M=block_m, BLOCK_N=block_n, REVERSED=fwd.STREAM_SECOND_PASS_REVERSED,
                                          ALIGN=align, EDGES=fwd.row_edges(align, y, dy, dx), num_warps=warps,
                                          **COMPILE_OPTIONS), k)


def _elementwise(y, dy, dx, delta, plan=None) -> None:
    """dx = y * (dy - delta) per row, (M, N) rows; ``plan``: ``elementwise_plan(y, dy, dx)``."""
    m, n = y.shape
    grid, kwargs, k = plan or memo("elementwise", (y, dy, dx), None, lambda: elementwise_plan(y, dy, dx),
                                   fwd.stream_knobs())
    launch_kernel(_bwd_elementwise_kernel, grid, y, dy, dx, delta, m, n, k, y.stride(0), dy.stride(0), dx.stride(0),
                  **kwargs)


def _persistent(y, dy, dx) -> None:
    m, n = y.shape
    chunk, warps = BWD_SPLIT_CHUNK[fwd.element_size(y, dy)]
    k = cdiv(n, chunk)
    err = fwd.error_counter(y.device)
    cnt = torch.zeros(m, dtype=torch.int32, device=y.device)
    consts = dict(CHUNK=chunk, PB=fwd.PARTIAL_BLOCK, LOAD_EVICT=fwd.PERSISTENT_EVICT[0],
                  STORE_EVICT=fwd.PERSISTENT_EVICT[1])
    stand_in = torch.empty(1, dtype=torch.float32, device=y.device)
    args = [y, dy, dx, stand_in, cnt, err, m, n, y.stride(0), dy.stride(0), dx.stride(0), 2, 2, 2, 2, fwd.SPIN_MAX]
    programs = fwd.resident_programs(_bwd_persistent_kernel, args, consts, warps,
                                     ("softmax_bwd", n % 16 == 0) + fwd.spec_key(y, dy, dx))
    if fwd.is_interpreter(y):
        q, g, r = fwd.interpreter_plan(k, m, programs)
    else:
        q, g, r = fwd.split_plan(k, m, programs, chunk * (y.element_size() + dy.element_size()))
    args[3] = torch.empty((m, q), dtype=torch.float32, device=y.device)
    args[11:15] = [q, g, r, 1 if r == 1 else 0]
    launch_kernel(_bwd_persistent_kernel, (g * q,), *args, **consts, num_warps=warps, **COMPILE_OPTIONS)


def row_dot(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """(M, N), (M, N) -> (M,) float32 ``sum(y * dy)`` per row (one read of each)."""
    _check_pair(y, dy, "row_dot")
    m, n = y.shape
    delta = torch.zeros(m, dtype=torch.float32, device=y.device)
    if m == 0 or n == 0:
        return delta
    if plan := memo("row_dot", (y, dy), None, lambda: _dot_route(y, dy), bwd_knobs()):
        _rows(plan, y, dy, None, delta)
        return delta
    return _two_pass_dot(y, dy)


def softmax_bwd(y: torch.Tensor, dy: torch.Tensor, delta: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax backward: dx = y * (dy - delta), delta = rowsum(y * dy) unless given.

    Args:
        y: (M, N) softmax output; dy: (M, N) its gradient; float32 / float16 / bfloat16, unit
            column stride, any row stride.
        delta: optional (M,) per-row value to subtract (e.g. ``row_dot(y, dy) - dlse``).
    Returns:
        dx: (M, N) contiguous, dy.dtype.
    """
    _check_pair(y, dy, "softmax_bwd")
    m, n = y.shape
    dx = torch.empty((m, n), dtype=dy.dtype, device=dy.device)
    if m == 0 or n == 0:
        return dx
    if delta is not None:
        _elementwise(y, dy, dx, fwd._row_vector(delta, m, y, "delta", "softmax_bwd"))
        return dx
    staged, rows = memo("softmax_bwd", (y, dy, dx), None, lambda: _bwd_route(y, dy, dx), bwd_knobs())
    if staged and fwd.staged_launch("bwd", y, dy, dx):
        pass
    elif rows:
        _rows(rows, y, dy, dx, None)
    elif fwd.held_split("bwd", y, dy, dx):
        pass
    elif fwd.use_persistent(y, n * (y.element_size() + dy.element_size()), BWD_PERSISTENT_MAX_ROW_BYTES,
                            fwd.element_size(y, dy)):
        _persistent(y, dy, dx)
    else:
        _elementwise(y, dy, dx, _two_pass_dot(y, dy))
    return dx


def _bwd_route(y, dy, dx) -> tuple:
    """(staged, rows) of ``softmax_bwd`` on (M, N) rows y, dy into dx: whether the staged kernel is tried
    first (``softmax_fwd.staged_fits``, from ``staged_first``), and the rows kernel's plan where the rows
    fit it, else None (the split paths). Memoized by layout (``plan_memo``)."""
    # (rows past BWD_ROWS_MAX_N never fit the rows kernel: no layout to work out for them)
    layout = fwd.rows_fit(BWD_ROWS_MAX_N, y, dy, dx, direction="bwd") if y.shape[1] <= BWD_ROWS_MAX_N else None
    staged = fwd.staged_fits("bwd", y, dy, dx, any_length=staged_first(layout, fwd.element_size(y, dy), y, dy, dx))
    return staged, rows_plan(y, dy, dx, layout) if layout else None


def _dot_route(y, dy):
    """The rows kernel's plan of ``row_dot`` on (M, N) rows y, dy where they fit it, else None."""
    layout = fwd.rows_fit(BWD_ROWS_MAX_N, y, dy, direction="bwd")
    return rows_plan(y, dy, None, layout) if layout else None


def bwd_knobs() -> tuple:
    """``softmax_fwd.rows_knobs`` and this module's knobs, as they are now: the ``knobs`` of the backward
    routes' ``plan_memo.memo``."""
    return fwd.rows_knobs() + (
        BWD_ROWS_MAX_N, BWD_ROWS_TILE, BWD_ELEMS_PER_THREAD, BWD_ROWS_MAX_WARPS, BWD_MASKED_ROWS_TILE, BWD_MASKED_WARPS,
        BWD_MASKED_MAX_BLOCK, BWD_MASKED_QUARTER_TAIL, BWD_MASKED_WARPS_CAP, BWD_STAGED_MASKED,
        BWD_STAGED_ALIGNED_MIN_N, BWD_STAGED_ELEMENTWISE_MIN_N, BWD_ROWS_LOAD_EVICT, BWD_ROWS_CHUNK,
        BWD_TAIL_REGISTERS, BWD_ROWS_WIDE_TAIL, BWD_ONE_TILE)
