"""The Triton softmax kernels (forward and backward) against float64 torch, in every regime.

CPU tests run the kernels in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py without
CUDA) at small sizes, with the regime knobs lowered so the split-row paths run too. GPU tests
(``-m gpu``) run every regime at real sizes, bfloat16 included, and 64-bit offsets.

Every output is poisoned: ``torch.empty`` / ``empty_like`` return NaN-filled tensors while a kernel
launcher runs, so an element the kernel does not write shows up as NaN.
"""
import os

import pytest
import torch
import triton
import triton.language as tl

from helpers import check_softmax_grad, rel_err, softmax64
from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F
from ringsoftmax.kernels import softmax_held as H
from ringsoftmax.kernels import softmax_staged as S
from ringsoftmax.kernels.hostmath import cdiv, next_power_of_2

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERP, reason="interpreter tests: TRITON_INTERPRET=1 (set without CUDA)")
TOL = {torch.float32: 1e-5, torch.float16: 1.5e-3, torch.bfloat16: 8e-3}


@pytest.fixture
def poisoned(monkeypatch):
    """Make torch.empty / empty_like return NaN (floats) or -7 (ints) while the test runs."""
    empty, empty_like = torch.empty, torch.empty_like

    def fill(t):
        return t.fill_(float("nan") if t.is_floating_point() else -7)

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(empty_like(*a, **k)))


@pytest.fixture
def small_regimes(monkeypatch):
    """Lower the regime thresholds so the split paths run at interpreter sizes."""
    monkeypatch.setattr(F, "ROWS_MAX_N", {4: 64, 2: 64})
    monkeypatch.setattr(F, "ROWS_TILE", {4: 256, 2: 256})
    monkeypatch.setattr(F, "STREAM_TILE", {4: 256, 2: 256})
    monkeypatch.setattr(B, "BWD_ROWS_TILE", {4: 256, 2: 256})
    monkeypatch.setattr(F, "SPLIT_CHUNK", {4: (32, 1), 2: (64, 1)})
    monkeypatch.setattr(B, "BWD_ROWS_MAX_N", 64)
    monkeypatch.setattr(B, "BWD_SPLIT_CHUNK", {4: (32, 1), 2: (64, 1)})


def make_x(m, n, dtype, device, scale=1e4, gen=None):
    """Scores with magnitudes up to ~scale, some -inf entries, an all -inf row (row 1 if m > 1)."""
    x = torch.randn(m, n, generator=gen, dtype=torch.float32, device=device) * scale
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    if n > 2:
        x[:, ::7] = float("-inf")
    if m > 1:
        x[1] = float("-inf")
    return x.to(dtype)


def check_fwd(x, y, lse, tol):
    want_y, want_lse = softmax64(x, -1)
    assert y.dtype == x.dtype and y.shape == x.shape and y.is_contiguous()
    assert lse.dtype == torch.float32 and lse.shape == (x.shape[0],)
    assert rel_err(y, want_y) <= tol, f"y: {rel_err(y, want_y):.2e}"
    assert rel_err(lse, want_lse) <= 1e-6, f"lse: {rel_err(lse, want_lse):.2e}"
    empty = torch.isneginf(want_lse)
    assert torch.isneginf(lse[empty]).all() and (y[empty] == 0).all()


def off_16_bytes(t):
    """A copy of contiguous ``t`` whose data pointer is one element past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = flat[1:].view(t.shape)
    out.copy_(t)
    return out


def softmax_pair(m, n, dtype, device, scale=3.0):
    """A real softmax output y (rows summing to 1, one all-zero row) and a random dy."""
    x = torch.randn(m, n, device=device) * scale
    if m > 1:
        x[1] = float("-inf")
    y = softmax64(x, -1)[0].to(dtype)
    return y, torch.randn(m, n, device=device).to(dtype)


# ---------------------------------------------------------------------------------------------
# CPU (interpreter)
# ---------------------------------------------------------------------------------------------
@cpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [1, 2, 127, 1000, 4097])
def test_fwd_rows_cpu(n, dtype, poisoned):
    x = make_x(5, n, dtype, "cpu")
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[dtype])
    check_stats(x, *F.row_stats(x))


@cpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [128, 80])
def test_rows_exact_tiles_cpu(n, dtype, poisoned, monkeypatch):
    """Rows the tiles cover exactly run without masks (EVEN): 8 rows of 128 (one tile) or 80 (a tile
    of 64 and a tail tile of 16), -inf entries, an all -inf row; the backward with rows in registers,
    in pieces with a tail piece (64 + 16), and in pieces of 16 that take the tail in their loop."""
    x = make_x(8, n, dtype, "cpu")
    block_m, block_n, tail_n, _ = F.rows_config(8, n, x.element_size())
    assert (block_n, tail_n) == ((128, 0) if n == 128 else (64, 16))
    assert F.rows_tile_args(8, n, block_m, block_n, (n, n), tail_n=tail_n)["EVEN"]
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[dtype])
    check_stats(x, *F.row_stats(x))
    y_only, none = F.softmax_fwd(x, with_lse=False)   # the rows kernel without its lse store
    assert none is None and torch.equal(y_only, y)
    yb, dy = softmax_pair(8, n, dtype, "cpu")
    for chunk in (None, 16384, 16):
        monkeypatch.setattr(B, "BWD_ROWS_CHUNK", {4: chunk, 2: chunk})
        check_softmax_grad(yb, dy, B.softmax_bwd(yb, dy), TOL[dtype])


def test_host_integer_helpers_match_triton():
    """The launchers' cdiv / next_power_of_2 (plain Python, ~100x cheaper per call on the host than
    triton's constexpr functions) give triton's values."""
    values = list(range(1, 300)) + [2**k + d for k in range(8, 41) for d in (-1, 0, 1)]
    for n in values:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for b in (1, 2, 3, 16, 127, 4096):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)
    assert cdiv(0, 7) == 0 and next_power_of_2(0) == 1


def test_rows_tile_args():
    """Masks only where tiles overhang the rows; 64-bit offsets once any offset (padding rows too) needs them."""
    assert F.rows_tile_args(8, 128, 8, 128, (128,))["EVEN"]
    assert F.rows_tile_args(8, 96, 8, 64, (96,), tail_n=32)["EVEN"]  # a main tile and a tail tile
    assert not F.rows_tile_args(8, 95, 8, 64, (95,), tail_n=32)["EVEN"]
    stride = 2**31 - 2**29                                            # the tail tile's offsets count
    assert not F.rows_tile_args(2, 2**29, 1, 2**29, (stride,))["OFFS64"]
    assert F.rows_tile_args(2, 2**29 + 8, 1, 2**29, (stride,), tail_n=8)["OFFS64"]
    assert not F.rows_tile_args(5, 128, 8, 128, (128,))["EVEN"]      # rows overhang
    assert not F.rows_tile_args(8, 100, 8, 128, (100,))["EVEN"]      # columns overhang
    assert not F.rows_tile_args(8, 128, 8, 128, (128,))["OFFS64"]
    assert F.rows_tile_args(2**21 + 1, 1024, 1, 1024, (1024,))["OFFS64"]
    assert F.rows_tile_args(3, 16, 4, 16, (2**30,))["OFFS64"]         # a large row stride, padding row included
    assert not F.rows_tile_args(2**21 - 1, 1024, 1, 1024, (1024,))["OFFS64"]


def test_row_edges():
    """End vectors apart (EDGES) wherever a row may start or end inside 16 bytes: N or a row stride (of
    any tensor, rows past the first) not a multiple of ALIGN; only those rows' tiles take ALIGN - 1
    columns more."""
    x = torch.empty(4, 1000, dtype=torch.bfloat16)
    assert F.row_align(x) == 8 and not F.row_edges(8, x)
    assert F.row_edges(8, x[:, :999]) and F.row_edges(8, x[:, 4:], x[:, :996])
    assert not F.row_edges(8, x[:, 8:], x[:, :992])
    assert not F.row_edges(1, x[:, :999]) and not F.row_edges(8, x[:1, 3:995])  # (one row: no stride)
    # the columns a row's tiles cover (row_layout), and so what fits a rows kernel (rows_fit)
    assert F.row_layout(x) == (8, False, 1000) and F.row_layout(x[:, :999]) == (8, True, 1006)
    assert F.rows_fit(1000, x) and not F.rows_fit(1005, x[:, :999]) and F.rows_fit(1006, x[:, :999])


def test_whole_vector_align(monkeypatch):
    """Rows kernels take the widest narrower vector of which every row is whole where 16 bytes would
    leave end vectors apart: at least 4 bytes forward, 8 backward (``WHOLE_VECTOR_MIN_BYTES``); none for
    odd N, and none where a row stride breaks it or the data pointer is off 16 bytes (``row_align``)."""
    bf = torch.empty(4, 304, dtype=torch.bfloat16)
    assert F.row_layout(bf[:, :300]) == (4, False, 300)                        # 8-byte vectors, both ways
    assert F.row_layout(bf[:, :300], bf[:, :300], direction="bwd") == (4, False, 300)
    assert F.row_layout(bf[:, :302]) == (2, False, 302)                        # 4 bytes: forward only
    assert F.row_layout(bf[:, :302], direction="bwd") == (8, True, 309)
    assert F.row_layout(bf[:, :301]) == (8, True, 308)                         # odd: no whole vectors
    assert F.row_layout(bf[:, 2:302]) == (1, False, 300)                       # data pointer off 16 bytes
    assert F.row_layout(torch.empty(4, 302)[:, :298]) == (2, False, 298)       # float32: 8-byte vectors
    odd_stride = torch.empty(4, 306, dtype=torch.bfloat16)[:, :300]                 # rows start 4 bytes apart
    assert F.row_layout(odd_stride) == (2, False, 300)
    assert F.row_layout(odd_stride, odd_stride, direction="bwd") == (8, True, 307)
    assert F.whole_vector_align(8, None, bf[:, :300]) == 8 and F.whole_vector_align(1, 4, bf[:, :256]) == 1
    monkeypatch.setitem(F.WHOLE_VECTOR_MIN_BYTES, "fwd", None)
    assert F.row_layout(bf[:, :300]) == (8, True, 307)
    assert F.rows_fit(300, bf[:, :300], direction="bwd") and not F.rows_fit(300, bf[:, :300])


def test_rows_that_move_elements(monkeypatch):
    """Rows whose tiles move an element at a time (a data pointer off 16 bytes, a row stride that breaks
    the vectors) take the forward rows kernel up to ``ROWS_MAX_N_ELEMENTWISE`` columns, the others up to
    ``ROWS_MAX_N``; longer ones take the split paths, which still compute the softmax."""
    bf = torch.empty(3, 50001, dtype=torch.bfloat16)
    off = off_16_bytes(torch.empty(3, 50000, dtype=torch.bfloat16))   # 2 bytes past 16
    aligned = torch.empty(3, 50000, dtype=torch.bfloat16)
    assert F.moves_elements(F.row_layout(off), off) and not F.moves_elements(F.row_layout(aligned), aligned)
    assert not F.moves_elements(F.row_layout(bf[:, :301]), bf[:, :301])  # shifted vectors (ALIGN 8)
    stride = torch.empty(4, 306, dtype=torch.bfloat16)[:, :300]
    assert not F.moves_elements(F.row_layout(stride), stride)           # 4-byte vectors (ALIGN 2)
    assert F.moves_elements((1, False, 300), stride)
    limit = F.ROWS_MAX_N_ELEMENTWISE[2]
    assert limit < F.ROWS_MAX_N[2]
    assert F.rows_fit(F.ROWS_MAX_N[2], off) and not F.rows_fit(F.ROWS_MAX_N[2], off, elementwise_limit=limit)
    assert F.rows_fit(F.ROWS_MAX_N[2], aligned, elementwise_limit=limit)
    # the backward: float32 rows that move elements try the staged kernel first
    f32 = off_16_bytes(torch.empty(3, 30000))
    layout = F.row_layout(f32, f32, f32, direction="bwd")
    assert layout == (1, False, 30000)
    assert B.staged_first(layout, 4, f32, f32, f32) and not B.staged_first(layout, 4)
    f32 = f32[:, :8192]
    assert not B.staged_first(F.row_layout(f32, f32, f32, direction="bwd"), 4, f32, f32, f32)
    # end to end (interpreter sizes): an element-at-a-time row past the limit takes the two-pass path
    monkeypatch.setattr(F, "ROWS_MAX_N_ELEMENTWISE", {4: 32, 2: 32})
    rows, run_rows = [], F._rows
    monkeypatch.setattr(F, "_rows", lambda *a, **k: rows.append(1) or run_rows(*a, **k))
    x_off = off_16_bytes(make_x(4, 101, torch.bfloat16, "cpu"))
    y, lse = F.softmax_fwd(x_off)
    check_fwd(x_off, y, lse, TOL[torch.bfloat16])
    assert not rows
    y, lse = F.softmax_fwd(x_off[:, :30])
    check_fwd(x_off[:, :30], y, lse, TOL[torch.bfloat16])
    assert rows


def test_rows_register_cap_and_backward_tiles(monkeypatch):
    """The forward rows kernel's register caps: programs of 16 warps or more whose threads hold 8
    elements (32 registers) or 16 to 32 (64) of the main tile (``ROWS_REGISTER_CAP``). The backward rows
    kernel: rows with end vectors or a tail tile take smaller programs (``BWD_MASKED_ROWS_TILE``), and
    about half the warps on main tiles of at most 16384 columns (end vectors), 1024 (a tail tile alone)
    or 4096 (a tail of at most a quarter of it; ``BWD_MASKED_WARPS``)."""
    assert F.rows_register_cap(1, 16384, 16) == {"maxnreg": 64} == F.rows_register_cap(1, 8192, 16)
    assert F.rows_register_cap(1, 32768, 16) == {} == F.rows_register_cap(1, 2048, 16)
    assert F.rows_register_cap(1, 4096, 16) == {"maxnreg": 32}
    assert F.rows_register_cap(2, 4096, 8) == {} == F.rows_register_cap(1, 16384, 16, caps=())
    bwd = lambda n, e, elem=2: B.rows_config(1 << 16, n, elem, e)  # noqa: E731
    assert bwd(4104, True) == (1, 4096, 8, 8) and bwd(4104, False) == (1, 4096, 8, 8)  # (a quarter tail)
    assert bwd(4104, False, 4) == (1, 8192, 0, 32)  # (float32: one tile, BWD_ONE_TILE)
    assert bwd(16392, True) == (1, 16384, 8, 16) and bwd(30008, True) == (1, 32768, 0, 32)
    assert bwd(1008, True) == (1, 1024, 0, 2) and bwd(1024, False) == (4, 1024, 0, 16)
    assert bwd(300, False) == (2, 256, 64, 1) and bwd(300, False, 4) == (2, 256, 64, 1)
    assert bwd(6144, False) == (1, 4096, 2048, 16)
    monkeypatch.setattr(B, "BWD_MASKED_WARPS", None)
    assert bwd(4104, True) == (1, 4096, 8, 16) and bwd(1008, True) == (1, 1024, 0, 4)


@cpu_only
@pytest.mark.parametrize("align", [4, 8])
def test_edge_tile_masks_cpu(align):
    """Every element of every row is written once: by the tiles' body or by the edge tile (each
    element of it once, the head and tail vectors of short rows included), and nothing outside the
    rows; in chunks of a streaming kernel, by the one chunk holding it (``chunk_edges``), which
    ``chunk_has_edges`` lets through."""
    rows, width, block_n = 2 * align, 64, 16
    h = torch.arange(rows) % align  # (row r starts at element r)
    c = torch.arange(width)[None, :]
    for n in (1, 2, align - 1, align, align + 1, 2 * align + 3, 3 * align, 4 * align + 1, 40):
        count = torch.zeros(rows, width, dtype=torch.int32)
        _count_writes_kernel[(1,)](count, n, width // block_n, ROWS=rows, WIDTH=width, BLOCK_N=block_n, ALIGN=align)
        want = ((c >= h[:, None]) & (c < (h + n)[:, None])).to(torch.int32)
        assert torch.equal(count, 2 * want), (n, align)


@triton.jit
def _count_writes_kernel(COUNT, N, K, ROWS: tl.constexpr, WIDTH: tl.constexpr, BLOCK_N: tl.constexpr,
                         ALIGN: tl.constexpr):
    """COUNT (ROWS, WIDTH) int32 zeros: + 1 for each element that the body masks of a whole-row tile
    and the edge tile write, + 1 for each that K chunks of BLOCK_N columns write (``chunk_edges``);
    row r starts at element r (stride 1: h = r mod ALIGN)."""
    rows = tl.arange(0, ROWS)
    row_ok = rows < ROWS
    cols = tl.arange(0, WIDTH)[None, :]
    out = COUNT + rows[:, None] * WIDTH
    body = F.tile_masks(rows, row_ok, cols, N, 1, ALIGN, True)[2]
    tl.atomic_add(out + cols, body.to(tl.int32))
    cols_e, edge = F.edge_tile(rows, row_ok, N, 1, ALIGN)
    tl.atomic_add(out + cols_e, edge.to(tl.int32), mask=edge)
    for k in range(0, K):
        chunk = k * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tl.atomic_add(out + chunk, F.tile_masks(rows, row_ok, chunk, N, 1, ALIGN, True)[2].to(tl.int32))
        if F.chunk_has_edges(k, N, BLOCK_N, ALIGN):
            cols_k, edge_k = F.chunk_edges(rows, row_ok, k, N, 1, BLOCK_N, ALIGN)
            tl.atomic_add(out + cols_k, edge_k.to(tl.int32), mask=edge_k)


def test_tail_split_and_rows_config(monkeypatch):
    """The rows kernels' tiles: a power-of-two main tile and a tail tile of at most a quarter of it
    (half of it in the 16-bit rows ``ROWS_WIDE_TAIL`` names) where the two cover the row, rows per
    program counting both (a power of two) and warps from the main tile; ``ROWS_TAIL = False``: one
    tile."""
    assert F.tail_split(4104) == (4096, 8)            # bf16 N = 4097, shifted to 16 bytes
    assert F.tail_split(300) == (256, 64)
    for cols, want in [(1007, (1024, 0)), (6144, (8192, 0)), (6145, (8192, 0)), (4096, (4096, 0)), (1, (1, 0)),
                       (3, (4, 0)), (5, (4, 1))]:
        assert F.tail_split(cols) == want, cols
    assert F.rows_config(64, 4104, 2) == (1, 4096, 8, 4)
    assert F.rows_config(64, 4104, 2, per_thread=B.BWD_ELEMS_PER_THREAD, tile=B.BWD_ROWS_TILE,
                         max_warps=B.BWD_ROWS_MAX_WARPS) == (1, 4096, 8, 16)
    assert F.rows_config(64, 40, 4) == (16, 32, 8, 2)  # 1024 // 40 = 25 rows -> 16
    # tails of half the main tile: the 16-bit forward to 32768 columns, the 16-bit backward to 8192
    assert F.tail_split(12288, 32768) == (8192, 4096) and F.tail_split(12288, 8192) == (16384, 0)
    assert F.rows_config(8, 12288, 2)[1:3] == (8192, 4096) and F.rows_config(8, 12288, 4)[1:3] == (16384, 0)
    assert B.rows_config(8, 6144, 2, False)[1:3] == (4096, 2048)
    assert B.rows_config(8, 12288, 2, False)[1:3] == (16384, 0)
    assert F.rows_config(3, 40, 4) == (4, 32, 8, 1)
    for cols in range(1, 3000, 7):
        block_m, block_n, tail_n, _ = F.rows_config(1000, cols, 4)
        assert block_n + tail_n >= cols and block_m & (block_m - 1) == 0
        assert block_m == 1 or block_m * (block_n + tail_n) <= F.ROWS_TILE[4]
    monkeypatch.setattr(F, "ROWS_TAIL", False)
    assert F.tail_split(4104) == (8192, 0)


def test_rows_tiles_by_length():
    """Tiles of the rows kernels chosen by row length (session 38): the forward widens a tail tile that
    gives each thread at least one element but less than a vector to a vector a thread
    (``vector_tail``), or takes one tile where that tail would be as wide as the main tile; the
    float32 backward takes one tile for rows with a tail tile alone on main tiles of 1024-4096 columns
    (``BWD_ONE_TILE``) and holds rows with a tail on 16384-column main tiles in registers
    (``rows_in_registers``); the 16-bit backward's masked rows on 8192-column main tiles take 16 warps
    (``BWD_MASKED_WARPS_CAP``), its rows with a quarter tail on 4096 ``BWD_MASKED_WARPS``
    (``BWD_MASKED_QUARTER_TAIL``), and its rows with a tail of 1025-2560 columns stay in registers."""
    m = 1 << 16
    assert F.rows_config(m, 4608, 4, vector=4) == (1, 4096, 2048, 16)       # 512 on 512 threads -> 2048
    assert F.rows_config(m, 4608, 4) == (1, 4096, 512, 16)                  # (vector 0: as before)
    assert F.rows_config(m, 4352, 4, vector=4) == (1, 4096, 256, 16)        # half the threads: kept
    assert F.rows_config(m, 10240, 4, vector=4) == (1, 8192, 2048, 16)      # a vector a thread already
    assert F.rows_config(m, 18000, 2, vector=8) == (1, 16384, 4096, 16)
    assert F.rows_config(m, 17500, 2, vector=4) == (1, 16384, 2048, 16)     # 4-element vectors: kept
    assert F.vector_tail(1, 64, 32, 32, 4) == (128, 0)                      # as wide as the main tile
    assert F.vector_tail(4, 64, 16, 32, 4) == (64, 32)                      # four rows of the tail
    assert B.masked_kind(1280, 4, False) == (2048, 0, None) and B.masked_kind(1280, 2, False) == (1024, 256, "tail")
    assert B.masked_kind(600, 4, False) == (512, 128, "tail") and B.masked_kind(8320, 4, False) == (8192, 128, "tail")
    assert B.masked_kind(4100, 4, True) == (4096, 4, "edges")
    assert B.rows_config(m, 10240, 2, False) == (1, 8192, 2048, 16) and B.rows_config(m, 10240, 4, False)[3] == 32
    assert B.rows_config(m, 18500, 2, False)[3] == 32
    assert B.rows_in_registers(4, 16384, 4096, False) and not B.rows_in_registers(4, 16384, 4096, True)
    assert not B.rows_in_registers(2, 16384, 4096, False) and not B.rows_in_registers(4, 8192, 2048, False)
    assert B.rows_in_registers(2, 1024, 256, False) and not B.rows_in_registers(2, 4096, 256, False)
    assert B.rows_in_registers(2, 2048, 512, False) and not B.rows_in_registers(2, 2048, 1024, False)
    # 16-bit tails of at most a quarter of the main tile on 4096: 16 elements a thread (8 warps)
    assert B.rows_config(m, 5120, 2, False) == (1, 4096, 1024, 8) and B.rows_config(m, 6144, 2, False)[3] == 16


@cpu_only
@pytest.mark.parametrize("dtype, n, direction", [
    (torch.float32, 1152, "fwd"), (torch.float16, 2176, "fwd"), (torch.float32, 1280, "bwd"),
    (torch.float32, 16500, "bwd"), (torch.float16, 8320, "bwd"), (torch.float16, 2304, "bwd")])
def test_rows_tiles_by_length_cpu(dtype, n, direction, poisoned):
    """The tiles of ``test_rows_tiles_by_length`` against float64: forward tails widened to a vector a
    thread (float32 1152: 1024 + 512 on 4 warps; float16 2176: 2048 + 512 on 2 warps), the float32
    backward in one tile (1280) and with rows in registers (16500, in 4-element vectors), the 16-bit
    backward on 16 warps (8320) and in registers (2304: 2048 + 256)."""
    check_rows_by_length(3, n, dtype, direction, "cpu")


def check_rows_by_length(m, n, dtype, direction, device):
    """The forward (y, lse) or the backward (dx, and the row sums of y * dy) of m rows of n against
    float64."""
    if direction == "fwd":
        x = make_x(m, n, dtype, device)
        y, lse = F.softmax_fwd(x)
        check_fwd(x, y, lse, TOL[dtype])
    else:
        y, dy = softmax_pair(m, n, dtype, device)
        check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[dtype])
        assert rel_err(B.row_dot(y, dy), (y.double() * dy.double()).sum(-1)) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, n, direction", [
    (torch.float32, 4608, "fwd"), (torch.float32, 5120, "fwd"), (torch.float32, 17408, "fwd"),
    (torch.bfloat16, 8704, "fwd"), (torch.bfloat16, 18000, "fwd"), (torch.float32, 1280, "bwd"),
    (torch.float32, 2560, "bwd"), (torch.float32, 16500, "bwd"), (torch.float32, 19500, "bwd"),
    (torch.bfloat16, 9216, "bwd"), (torch.bfloat16, 10240, "bwd"), (torch.bfloat16, 1536, "bwd"),
    (torch.bfloat16, 2304, "bwd"), (torch.bfloat16, 4352, "bwd"), (torch.bfloat16, 19999, "fwd")])
def test_rows_tiles_by_length_gpu(dtype, n, direction, poisoned):
    """``test_rows_tiles_by_length_cpu`` at the lengths its rules were measured on (H200, session 38),
    115 rows (an odd count: a partial last program where programs hold several rows)."""
    check_rows_by_length(115, n, dtype, direction, "cuda")


@cpu_only
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [127, 1000, 4097])
def test_fwd_split_cpu(n, dtype, persistent, poisoned, small_regimes, monkeypatch):
    if persistent:
        # one program per row in the interpreter; chunks of 256 keep the loops short
        monkeypatch.setattr(F, "INTERPRETER_PERSISTENT", True)
        monkeypatch.setattr(F, "SPLIT_CHUNK", {4: (256, 1), 2: (256, 1)})
    x = make_x(6, n, dtype, "cpu")  # 6 rows on 4 programs: the row loop and its prefetch run
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[dtype])
    check_stats(x, *F.row_stats(x))
    assert F.sync_failures("cpu") == 0


@cpu_only
@pytest.mark.parametrize("m, n, chunk", [(1, 100, 256), (9, 200, 256), (3, 600, 128), (7, 129, 64)])
def test_persistent_schedules_cpu(m, n, chunk, poisoned, small_regimes, monkeypatch):
    """One row or many per program; rows of one chunk (normalized one row late) or several (at once)."""
    monkeypatch.setattr(F, "INTERPRETER_PERSISTENT", True)
    monkeypatch.setattr(F, "SPLIT_CHUNK", {4: (chunk, 1), 2: (chunk, 1)})
    monkeypatch.setattr(B, "BWD_SPLIT_CHUNK", {4: (chunk, 1), 2: (chunk, 1)})
    x = make_x(m, n, torch.float32, "cpu", scale=50.0)
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[torch.float32])
    dy = torch.randn(m, n)
    check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[torch.float32])
    assert F.sync_failures("cpu") == 0


@cpu_only
@pytest.mark.parametrize("split", [False, True])
def test_fwd_strided_rows_cpu(split, poisoned, small_regimes, monkeypatch):
    if not split:
        monkeypatch.setattr(F, "ROWS_MAX_N", {4: 16384, 2: 16384})
        monkeypatch.setattr(B, "BWD_ROWS_MAX_N", 16384)
    big = make_x(8, 1100, torch.float32, "cpu")
    x = big[1::2, 37:37 + 1000]  # row stride 2200, offset start: no copy
    assert x.stride() == (2200, 1)
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[torch.float32])


def check_stats(x, m, s):
    """(m, s) against float64: m is the row max exactly, s = sum(exp(x - m)); empty rows (-inf, 0)."""
    x64 = x.double()
    want_m = x64.amax(-1) if x.shape[-1] else torch.full(x.shape[:1], float("-inf"), dtype=torch.float64)
    assert m.dtype == s.dtype == torch.float32
    assert torch.equal(m.double().cpu(), want_m.cpu())
    want_s = torch.exp(x64 - torch.where(torch.isneginf(want_m), 0, want_m)[:, None]).sum(-1)
    assert rel_err(s, want_s) <= 1e-6


def normalize64(x, m, s):
    """exp(x - m) / s in float64; rows with s = 0 give 0."""
    m64, s64 = m.double(), s.double()
    want = torch.exp(x.double() - torch.where(torch.isneginf(m64), 0, m64)[:, None]) / s64[:, None]
    want[s64 == 0] = 0
    return want


@cpu_only
@pytest.mark.parametrize("n", [1, 127, 1000])
def test_normalize_cpu(n, poisoned, small_regimes):
    x = make_x(4, n, torch.float32, "cpu", scale=30.0)
    m = x.amax(-1) + torch.randn(4)                   # any statistics near the row's
    s = torch.rand(4) * n + 0.5
    m[2], s[2] = float("-inf"), 0.0
    y = F.normalize(x, m, s)
    assert rel_err(y, normalize64(x, m, s)) <= 1e-5 and (y[2] == 0).all()


@cpu_only
def test_normalize_large_magnitude_cpu(poisoned):
    """Normalizing from (m, s) keeps float32 precision at |x| ~ 1e4 (a rounded lse would not)."""
    x = make_x(3, 1000, torch.float32, "cpu")
    y = F.normalize(x, *F.row_stats(x))
    assert rel_err(y, softmax64(x, -1)[0]) <= 1e-6


@cpu_only
def test_empty_shapes_cpu():
    for shape in [(0, 5), (3, 0), (0, 0)]:
        x = torch.randn(shape)
        y, lse = F.softmax_fwd(x)
        assert y.shape == shape and lse.shape == (shape[0],) and torch.isneginf(lse).all()
        m, sx = F.row_stats(x)
        assert m.shape == sx.shape == (shape[0],) and torch.isneginf(m).all() and (sx == 0).all()
        assert F.normalize(x, torch.zeros(shape[0]), torch.ones(shape[0])).shape == shape
        assert B.softmax_bwd(x, x).shape == shape
        assert (B.row_dot(x, x) == 0).all()


@cpu_only
def test_bad_inputs_cpu():
    with pytest.raises(ValueError):
        F.softmax_fwd(torch.randn(4, 6).t())          # column stride != 1
    with pytest.raises(TypeError):
        F.softmax_fwd(torch.randn(4, 6, dtype=torch.float64))
    with pytest.raises(ValueError):
        F.softmax_fwd(torch.randn(2, 3, 4))
    with pytest.raises(ValueError):
        F.normalize(torch.randn(4, 6), torch.zeros(5), torch.ones(5))
    with pytest.raises(ValueError):
        B.softmax_bwd(torch.randn(4, 6), torch.randn(4, 5))


@cpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [1, 2, 127, 1000, 4097])
def test_bwd_rows_cpu(n, dtype, poisoned):
    y, dy = softmax_pair(4, n, dtype, "cpu")
    check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[dtype])
    delta = B.row_dot(y, dy)
    assert rel_err(delta, (y.double() * dy.double()).sum(-1)) <= 1e-5
    given = torch.randn(4)
    check_softmax_grad(y, dy, B.softmax_bwd(y, dy, given), TOL[dtype], delta=given)


@cpu_only
@pytest.mark.parametrize("chunk", [None, 32])
@pytest.mark.parametrize("m, n", [(4, 127), (8, 128), (3, 1000)])
def test_bwd_rows_reload_cpu(m, n, chunk, poisoned, monkeypatch):
    """The backward rows kernel with whole rows in registers (None), or summing in 32-column pieces
    and reading them again for dx."""
    monkeypatch.setattr(B, "BWD_ROWS_CHUNK", {4: chunk, 2: chunk})
    for dtype in (torch.float32, torch.float16):
        y, dy = softmax_pair(m, n, dtype, "cpu")
        check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[dtype])
        assert rel_err(B.row_dot(y, dy), (y.double() * dy.double()).sum(-1)) <= 1e-5


@cpu_only
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [127, 1000, 4097])
def test_bwd_split_cpu(n, dtype, persistent, poisoned, small_regimes, monkeypatch):
    if persistent:
        monkeypatch.setattr(F, "INTERPRETER_PERSISTENT", True)
        monkeypatch.setattr(B, "BWD_SPLIT_CHUNK", {4: (256, 1), 2: (256, 1)})
    y, dy = softmax_pair(6, n, dtype, "cpu")
    check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[dtype])
    assert rel_err(B.row_dot(y, dy), (y.double() * dy.double()).sum(-1)) <= 1e-5


@cpu_only
@pytest.mark.parametrize("reversed_", [False, True])
def test_two_pass_second_pass_order_cpu(reversed_, poisoned, small_regimes, monkeypatch):
    """The two-pass path's second pass (normalize, dx) in either tile order gives the float64 result."""
    monkeypatch.setattr(F, "STREAM_SECOND_PASS_REVERSED", reversed_)
    x = make_x(6, 4097, torch.float32, "cpu")
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[torch.float32])
    yy, dy = softmax_pair(6, 4097, torch.float32, "cpu")
    check_softmax_grad(yy, dy, B.softmax_bwd(yy, dy), TOL[torch.float32])


@cpu_only
@pytest.mark.parametrize("fma", [False, True])
@pytest.mark.parametrize("n", [1000, 1024])
def test_two_pass_exponents_and_exact_tiles_cpu(n, fma, poisoned, small_regimes, monkeypatch):
    """The two-pass forward with its exponents as one FMA (or a subtraction and a multiply), with tiles
    that cover the rows exactly (no masks) or not: -inf entries, an all -inf row, |x| ~ 1e4, statistics
    given to normalize from afar."""
    monkeypatch.setattr(F, "STREAM_FMA_EXP", fma)
    for dtype in (torch.float32, torch.float16):
        x = make_x(6, n, dtype, "cpu")
        align = F.row_align(x)
        block_m, block_n, _, _ = F.stream_config(6, n, x.element_size(), align)
        assert F.stream_args(x, block_m, block_n, align)["EVEN"] == (n == 1024)
        y, lse = F.softmax_fwd(x)
        check_fwd(x, y, lse, TOL[dtype])
        check_stats(x, *F.row_stats(x))
    x = make_x(3, n, torch.float32, "cpu")
    m = x.amax(-1) + 3.0
    s = torch.tensor([0.5, 2.0, 0.0])
    m[2] = float("-inf")
    y = F.normalize(x, m, s)
    assert rel_err(y[:2], normalize64(x[:2], m[:2], s[:2])) <= 1e-6 and (y[2] == 0).all()


@cpu_only
def test_bwd_mixed_dtypes_and_strides_cpu(poisoned, small_regimes):
    y, dy = softmax_pair(6, 300, torch.float32, "cpu")
    big = torch.randn(6, 400).to(torch.float16)
    big[:, 50:350] = dy.to(torch.float16)
    dy = big[:, 50:350]
    check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[torch.float16])


def check_unaligned_tiles(m, n, dtype, device):
    """Every tile kernel on m rows of n elements (n not a multiple of 16) against float64: the rows
    kernels (forward, backward), normalize and the backward's elementwise pass. Outputs go into the
    middle of a larger buffer, whose other columns must keep their value."""
    pad = 16
    x = make_x(m, n, dtype, device, scale=30.0)

    def framed():
        big = torch.full((m, n + 2 * pad), 7.0, dtype=dtype, device=device)
        return big, big[:, pad:pad + n]

    def kept(big):
        return bool((big[:, :pad] == 7).all() and (big[:, pad + n:] == 7).all())

    big, y = framed()
    align = F.row_align(x, y)
    assert align == (1 if n % 16 == 0 else 16 // x.element_size())
    assert F.row_edges(align, x, y) == (n % align != 0)  # (row strides n and n + 32)
    lse = torch.empty(m, device=device)
    F._rows(F.rows_plan(x, y, True), x, y, lse, lse, lse)  # the rows kernel, whatever ROWS_MAX_N says
    check_fwd(x, y.contiguous(), lse, TOL[dtype])
    assert kept(big)
    big, y = framed()
    _, shift, total = F._two_pass_stats(x)
    F._normalize_into(x, y, shift, total)
    check_fwd(x, y.contiguous(), torch.logsumexp(x.double(), -1).float(), TOL[dtype])
    assert kept(big)
    yy, dy = softmax_pair(m, n, dtype, device)
    for delta in (None, B._two_pass_dot(yy, dy)):
        big, dx = framed()
        if delta is None:
            B._rows(B.rows_plan(yy, dy, dx), yy, dy, dx, None)
        else:
            B._elementwise(yy, dy, dx, delta)
        check_softmax_grad(yy, dy, dx.contiguous(), TOL[dtype])
        assert kept(big)


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=cpu_only), pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 3, 22, 24, 37, 300, 302, 1000, 4097])
def test_tiles_of_unaligned_rows(n, dtype, device, poisoned):
    """Rows that do not start on 16 bytes (N not a multiple of 16): the tile kernels move aligned
    vectors from each row's start rounded down (``tile_masks``), reading a neighbour's elements in the
    end vectors and dropping them, and write the rows' end vectors an element at a time
    (``edge_tile``); every row start (M = 9 rows, N odd) is at another offset in 16 bytes. N = 24 and
    1000 (and 300 in float32) are whole vectors (``row_edges`` False: no end vectors apart); the rows
    kernels take narrower whole vectors at bf16 22 and 302 forward (4 bytes) and 300 (8 bytes), float32 22
    and 302 (8 bytes) (``whole_vector_align``). They hold several rows per program, with a tail tile at
    3 (float32: 4 + 2 columns), 22 (16 + 8 columns with the shift), 37, 300, 302 and 4097
    (``tail_split``)."""
    if device == "cpu" and n > 302:
        pytest.skip("interpreter: small rows only")
    check_unaligned_tiles(9, n, dtype, device)


@cpu_only
@pytest.mark.parametrize("dtype, n, chunk", [(torch.float32, 255, None), (torch.bfloat16, 253, 128),
                                              (torch.bfloat16, 300, 32), (torch.bfloat16, 300, 128)])
def test_edges_of_unaligned_rows_cpu(n, dtype, chunk, poisoned, monkeypatch):
    """The rows' end vectors (``edge_tile``) at small tiles: streaming chunks of 64 columns (K = 5: a
    row's tail vector in the last chunk or, for rows whose shifted end stops short of it (N = 253,
    255), in the one before, ``chunk_edges``); the rows kernels with a tail tile (``tail_split``:
    256 + 2, 4 or 64 columns; N = 300 in whole 8-byte vectors, ``whole_vector_align``), several rows
    per program; the backward rows kernel in registers (None) or in pieces: of 32 (a tail of 64
    columns taken by the pieces' loop) or 128 (a tail piece after them)."""
    monkeypatch.setattr(F, "STREAM_TILE", {4: 64, 2: 64})
    monkeypatch.setattr(B, "BWD_ROWS_CHUNK", {4: chunk, 2: chunk})
    x = torch.empty(9, n, dtype=dtype)
    assert F.stream_config(9, n, x.element_size(), F.row_align(x))[2] == 5
    check_unaligned_tiles(9, n, dtype, "cpu")


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
# 16-bit split rows take the staged kernel only where N % 16 == 0 (65552, 2^20, 2^21)
GPU_N = [1, 2, 127, 1000, 4097, 16385, 32768, 32769, 65539, 65552, 1000003, 2**20, 2**21, 16 * 2**20 + 3]
#: Split-row paths on CUDA: staged (shared memory, Gluon) as its table says and with cp.async where
#: the table loads by TMA, persistent (L2 re-read), two-pass.
SPLIT_PATHS = ["staged", "staged-cp.async", "persistent", "two-pass"]


def use_split_path(monkeypatch, path, max_row_bytes):
    """Route split rows to ``path``; the persistent kernel at every N (``max_row_bytes`` knob)."""
    monkeypatch.setattr(S, "STAGED", path.startswith("staged"))
    if path == "staged-cp.async":
        monkeypatch.setattr(S, "TMA_LOADS", False)
    monkeypatch.setattr(F, "PERSISTENT", path != "two-pass")
    monkeypatch.setattr(*max_row_bytes, None)


def skip_same_path(path, n, rows_kernel, tma_table):
    """Skip the cases another path already runs: the split paths where rows take the rows kernel,
    and the staged kernel with cp.async where the table has no TMA loads (``tma_table`` False), the
    rows cannot take them (N % 64 != 0) or they stay whole."""
    if (path in ("persistent", "two-pass") and rows_kernel) or (
            path == "staged-cp.async" and (rows_kernel or not tma_table or n % 64 != 0)):
        pytest.skip("same path")


def _rows_for(n):
    return max(2, min(64, 2**25 // n))


@pytest.mark.gpu
@pytest.mark.parametrize("path", SPLIT_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", GPU_N)
def test_fwd_gpu(n, dtype, path, poisoned, monkeypatch):
    skip_same_path(path, n, n <= F.ROWS_MAX_N[torch.finfo(dtype).bits // 8], dtype != torch.float32)
    use_split_path(monkeypatch, path, (F, "PERSISTENT_MAX_ROW_BYTES"))
    x = make_x(_rows_for(n), n, dtype, "cuda")
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[dtype])
    check_stats(x, *F.row_stats(x))
    y_only, none = F.softmax_fwd(x, with_lse=False)
    assert none is None and torch.equal(y_only, y)
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, n", [(300, 40000), (7, 3 * 2**20 + 11), (3, 9 * 2**20)])
def test_fwd_persistent_shapes_gpu(m, n, dtype, poisoned):
    """Many rows per program (normalized one row late), rows longer than the grid covers, strided x."""
    big = make_x(m, n + 64, dtype, "cuda", scale=20.0)
    x = big[:, 32:32 + n]
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[dtype])
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1000, 65539, 1000003])
def test_normalize_gpu(n, poisoned):
    x = make_x(8, n, torch.bfloat16, "cuda", scale=30.0)
    m, sx = F.row_stats(x)
    check_stats(x, m, sx)
    y = F.normalize(x, m, sx)
    assert rel_err(y, softmax64(x, -1)[0]) <= TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [16384, 2**20])
def test_fwd_64bit_offsets_gpu(n, poisoned):
    """M * N > 2^31: check the last rows (their offsets need 64 bits) and the first."""
    m = 2**31 // n + 2
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    y, lse = F.softmax_fwd(x)
    for rows in (slice(0, 1), slice(m - 2, m)):
        check_fwd(x[rows], y[rows], lse[rows], TOL[torch.bfloat16])
    dx = B.softmax_bwd(y, x)
    for rows in (slice(0, 1), slice(m - 2, m)):
        check_softmax_grad(y[rows], x[rows], dx[rows], TOL[torch.bfloat16])
    del x, y, dx
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("path", SPLIT_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", GPU_N)
def test_bwd_gpu(n, dtype, path, poisoned, monkeypatch):
    skip_same_path(path, n, n <= B.BWD_ROWS_MAX_N, False)
    use_split_path(monkeypatch, path, (B, "BWD_PERSISTENT_MAX_ROW_BYTES"))
    y, dy = softmax_pair(_rows_for(n), n, dtype, "cuda")
    check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[dtype])
    delta = B.row_dot(y, dy)
    # against the scale of its terms, sum |y dy|: the dot itself cancels (rows of 16M: |delta| ~ 1e-4
    # of it; a relative bound on delta alone failed at 1.9e-5, H200)
    y64, dy64 = y.double(), dy.double()
    err = (delta.double() - (y64 * dy64).sum(-1)).norm().item()
    assert err <= 1e-5 * (y64.abs() * dy64.abs()).sum(-1).norm().item()
    check_softmax_grad(y, dy, B.softmax_bwd(y, dy, delta), TOL[dtype], delta=delta)
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, m, n", [   # forward / backward path
    (torch.bfloat16, 64, 1000),            # rows kernel / rows kernel
    (torch.bfloat16, 64, 65539),           # staged, rows shifted to 16 bytes / the same
    (torch.float32, 8, 2**22),             # staged deep ring / two-pass (under HELD_MIN_BYTES)
    (torch.bfloat16, 4, 2**22),            # staged / staged deep ring
    (torch.float32, 16, 2**24),            # held columns (lag-7 ring) / the same
    (torch.bfloat16, 16, 2**24)])          # two-pass / held columns (lag-7 ring)
def test_repeatable_bits_gpu(dtype, m, n):
    """Run to run the same bits in every regime: a row's partial statistics merge in a fixed order,
    whichever program finishes first (training runs that are made reproducible rely on it). The paths in
    the comments were checked by counting launches (session 51, call 5, an H100)."""
    x = make_x(m, n, dtype, "cuda", scale=30.0)
    y, dy = softmax_pair(m, n, dtype, "cuda")
    first = (*F.softmax_fwd(x), B.softmax_bwd(y, dy))
    for _ in range(3):
        again = (*F.softmax_fwd(x), B.softmax_bwd(y, dy))
        for name, a, b in zip(("y", "lse", "dx"), first, again):
            assert torch.equal(a, b), f"{name} differs between runs"
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [None, 4096, 2**15])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, n", [(37, 1000), (64, 16384), (5, 32767)])
def test_bwd_rows_reload_gpu(m, n, dtype, chunk, poisoned, monkeypatch):
    """The backward rows kernel with whole rows in registers, or summing in pieces and reading again."""
    monkeypatch.setattr(B, "BWD_ROWS_CHUNK", {4: chunk, 2: chunk})
    y, dy = softmax_pair(m, n, dtype, "cuda")
    check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(300, 40000), (3, 9 * 2**20)])
def test_bwd_persistent_shapes_gpu(m, n, poisoned):
    y, dy = softmax_pair(m, n + 64, torch.bfloat16, "cuda")
    y, dy = y[:, 32:32 + n], dy[:, 16:16 + n]
    check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[torch.bfloat16])
    assert F.sync_failures("cuda") == 0


@pytest.mark.parametrize("dtype, n, staged", [
    (torch.bfloat16, 20001, True), (torch.bfloat16, 16385, True), (torch.bfloat16, 16400, True),
    (torch.bfloat16, 24577, True), (torch.bfloat16, 8200, False), (torch.bfloat16, 10240, False),
    (torch.bfloat16, 24576, False), (torch.bfloat16, 32000, True), (torch.bfloat16, 30720, True),
    (torch.bfloat16, 30704, False), (torch.bfloat16, 31000, False), (torch.float32, 32000, False),
    (torch.float32, 20000, True),
    (torch.float32, 16400, True), (torch.float32, 16385, False), (torch.float32, 24577, False),
    (torch.float32, 30000, False), (torch.bfloat16, 32767, True), (torch.float32, 32767, True),
    (torch.bfloat16, 17000, False), (torch.bfloat16, 19500, False), (torch.float32, 17500, False)])
def test_bwd_rows_that_try_the_staged_kernel_first_cpu(dtype, n, staged):
    """``softmax_bwd.staged_first``: masked rows on main tiles of 16384 or more (16-bit: end vectors or
    a tail tile; float32: a tail tile alone; tails only on rows of whole 16-byte vectors, N a multiple
    of 16), 16-bit rows of whole 16-byte vectors from 30720 columns (``BWD_STAGED_ALIGNED_MIN_N``; not
    31000, whole 8-element vectors only), and rows the rows kernel cannot hold (N = 32767 shifted to 16
    bytes covers more than 32768 columns)."""
    y = torch.empty(3, n, dtype=dtype)
    layout = F.rows_fit(B.BWD_ROWS_MAX_N, y, y, y, direction="bwd")
    assert (layout is None) == (n == 32767)
    assert B.staged_first(layout, y.element_size()) == staged


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [16400, 17500, 20000, 20001, 24577, 32000, 32765, 32767])
def test_short_rows_through_the_staged_kernel_gpu(n, dtype, poisoned, monkeypatch):
    """Rows under ``STAGED_MIN_N`` that the staged kernel takes, both directions: rows the rows kernel
    cannot hold (``staged_fits``' any_length), the backward's masked rows (``BWD_STAGED_MASKED``) and its
    aligned 16-bit rows from 30720 columns (``BWD_STAGED_ALIGNED_MIN_N``), checked against float64; the
    others of these lengths stay on the rows kernel (every row of 32765 and 32767 floats 16-byte shifted,
    so that the float32 32767 passes 32768 columns)."""
    launched = []
    launch = S.launch
    monkeypatch.setattr(S, "launch",
                        lambda direction, *a, **k: launched.append(direction) or launch(direction, *a, **k))
    m = 9
    x = make_x(m, n, dtype, "cuda")
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[dtype])
    elem = x.element_size()
    assert (launched == ["fwd"]) == (n >= S.STAGED_MIN_N["fwd", elem] or F.rows_fit(F.ROWS_MAX_N[elem], x, y) is None)
    launched.clear()
    yy, dy = softmax_pair(m, n, dtype, "cuda")
    check_softmax_grad(yy, dy, B.softmax_bwd(yy, dy), TOL[dtype])
    layout = F.rows_fit(B.BWD_ROWS_MAX_N, yy, dy, yy, direction="bwd")
    assert (launched == ["bwd"]) == B.staged_first(layout, elem)
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("n, dtype", [(24576, torch.float32), (25600, torch.float32), (32768, torch.float32),
                                      (40960, torch.bfloat16), (50000, torch.bfloat16)])
def test_rows_off_16_bytes_gpu(n, dtype, poisoned, monkeypatch):
    """Rows whose data pointer is off 16 bytes (their tiles move an element at a time): the forward's rows
    kernel takes them up to ``ROWS_MAX_N_ELEMENTWISE`` columns, the split path beyond; the float32
    backward tries the staged kernel first from ``BWD_STAGED_ELEMENTWISE_MIN_N``; values against float64."""
    rows, run_rows = [], F._rows
    monkeypatch.setattr(F, "_rows", lambda *a, **k: rows.append(1) or run_rows(*a, **k))
    launched = []
    launch = S.launch
    monkeypatch.setattr(S, "launch",
                        lambda direction, *a, **k: launched.append(direction) or launch(direction, *a, **k))
    m, elem = 5, torch.finfo(dtype).bits // 8
    x = off_16_bytes(make_x(m, n, dtype, "cuda"))
    assert x.data_ptr() % 16
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[dtype])
    assert bool(rows) == (n <= F.ROWS_MAX_N_ELEMENTWISE[elem])
    launched.clear()
    yy, dy = (off_16_bytes(t) for t in softmax_pair(m, n, dtype, "cuda"))
    check_softmax_grad(yy, dy, B.softmax_bwd(yy, dy), TOL[dtype])
    least = B.BWD_STAGED_ELEMENTWISE_MIN_N[elem]
    assert (launched == ["bwd"]) == (least is not None and n >= least)
    assert F.sync_failures("cuda") == 0


def test_staged_table_fits_and_checks_its_config_cpu():
    """Every staged entry keeps its ring consistent and fits a Hopper multiprocessor's shared memory;
    on a GPU with less (Ampere's 163 KB per block) the entries that do not fit give way to the entry
    before them; a config whose slots cannot hold the rows in use is refused before any launch; CPU
    tensors never take the staged (Gluon) kernel."""
    hopper, ampere = 232448, 166912  # bytes a block may take (cudaDevAttrMaxSharedMemoryPerBlockOptin)
    for (direction, elem), entries in S.STAGED_CONFIG.items():
        shortest = [n for n, _ in entries]
        assert shortest[0] == 0 and shortest == sorted(shortest)
        for i, (n, config) in enumerate(entries):
            # a length given twice: the later entry is TMA-only, the earlier one is for rows without TMA
            shadowed = i + 1 < len(entries) and entries[i + 1][0] == n
            assert not shadowed or (S.tma_only(direction, elem, entries[i + 1][1])
                                    and not S.tma_only(direction, elem, config))
            assert S.staged_config(direction, elem, max(n, 1), tma=not shadowed) == config
            assert S.staged_config(direction, elem, max(n, 1), tma=not shadowed, max_shared=hopper) == config
            chunk, warps, stages, ahead, lag, tma_load = config
            assert (stages, ahead, lag) in S.RINGS
            tensors = 2 if direction == "bwd" else 1
            assert S.slot_bytes(direction, elem, config) >= stages * chunk * elem * tensors
            small = S.staged_config(direction, elem, max(n, 1), tma=not shadowed, max_shared=ampere)
            assert S.slot_bytes(direction, elem, small) <= ampere
            if S.slot_bytes(direction, elem, config) > ampere:  # the fitting entry before it
                assert small == [c for _, c in entries[:i] if S.slot_bytes(direction, elem, c) <= ampere][-1]
            else:
                assert small == config
            assert chunk % (32 * warps * 16 // elem) == 0  # whole 16-byte vectors per thread
            assert S.sub_tile(chunk) == chunk  # (the main table's chunks are powers of two)
    assert S.slot_bytes("bwd", 2, S.staged_config("bwd", 2, 1 << 20)) > ampere  # (the case above is reached)
    for (direction, elem), entries in S.STAGED_CONFIG_SHIFTED.items():  # rows not 16-byte aligned
        shortest = [n for n, _ in entries]
        assert shortest[0] == 0 and shortest == sorted(shortest)
        for i, (n, entry) in enumerate(entries):
            past = S.staged_config(direction, elem, n + 1, tma=False)
            taken = S.staged_config(direction, elem, n + 1, tma=False, shifted=True)
            assert taken == past if entry is None else taken in S.alternatives(entry)
            for config in S.alternatives(entry) if entry is not None else ():
                assert config[2:5] in S.RINGS and not config[5] and S.slot_bytes(direction, elem, config) <= hopper
                assert config[0] % (32 * config[1] * 16 // elem) == 0
                assert S.sub_tile(config[0]) >= 32 * config[1] * 16 // elem  # a sub-tile: 16 bytes a thread
                if S.sub_tile(config[0]) < config[0]:  # sub-tiles wait in their slots
                    assert config[2] in (3, config[4] + 2) and config[3] == 1
    # alternatives: the config padding the row least (shifted rows span 16 bytes more), a chunk of sub-tiles
    # counted SUB_TILE_COST more; the first of equals
    def chunk(direction, elem, n):
        return S.staged_config(direction, elem, n, tma=False, shifted=True)[0]
    assert [chunk("fwd", 2, n) for n in (24577, 28673, 40001, 50257, 65537)] == [9216, 10240, 8192, 10240, 8192]
    assert [chunk("bwd", 2, n) for n in (130001, 140001, 172025)] == [8192, 6144, 6144]  # (172032: both 21 x 8192)
    assert S.least_padded("fwd", 2, 40000, [(10240, 4), (8192, 4)]) == (8192, 4)  # both 40960: sub-tiles cost
    assert S.least_padded("bwd", 2, 40000, [(10240, 4), (8192, 4)]) == (10240, 4)  # (no cost backward)
    assert S.least_padded("fwd", 2, 20480, [(8192, 4), (10240, 4)]) == (10240, 4)  # 3 x 8192 > 2 x 10240 x 1.05
    assert S.least_padded("bwd", 2, 24576, [(8192, 4), (6144, 4)]) == (8192, 4)
    assert S.least_padded("bwd", 2, 24576, []) is None
    for (direction, elem), entries in S.STAGED_CONFIG_WHOLE.items():  # rows of whole chunks, by TMA
        assert [n for n, _ in entries] == sorted(n for n, _ in entries)
        for (n, config), (end, _) in zip(entries, entries[1:] + [(1 << 40, None)]):
            if config is None:
                continue
            assert config[2:5] in S.RINGS and S.slot_bytes(direction, elem, config) <= hopper
            chunk = config[0]
            whole = [k * chunk for k in range(cdiv(n, chunk), cdiv(end, chunk)) if k * chunk >= n]
            assert whole, (direction, elem, n)  # the entry applies to some length
            for length in whole:
                assert S.staged_config(direction, elem, length) == config
                assert S.staged_config(direction, elem, length, tma=False) != config   # cp.async: the main table
                main = S.staged_config(direction, elem, length + 8)
                assert main != config and main == [c for k, c in S.STAGED_CONFIG[direction, elem] if length + 8 >= k][-1]
    x = torch.randn(2, 1 << 16)
    assert not S.available(x)
    # a ring the table takes only with TMA loads gives way to the entry before it where rows cannot
    for direction, elem in S.STAGED_CONFIG:
        for n in (1 << 16, 1 << 20, 1 << 21):
            assert not S.tma_only(direction, elem, S.staged_config(direction, elem, n, tma=False))
    assert S.tma_only("fwd", 4, S.staged_config("fwd", 4, 1 << 22))
    rows = torch.randn(2, 1 << 22)  # CPU tensors take no TMA
    assert S.launch_config("fwd", rows, rows) == S.staged_config("fwd", 4, 1 << 22, tma=False)
    for ring in ((2, 1, 1), (4, 2, 1), (3, 1, 0), (3, 2, 1), (4, 2, 2), (4, 1, 1), (9, 1, 7), (6, 2, 3)):
        with pytest.raises(ValueError, match="STAGES, AHEAD, LAG"):
            S.launch("fwd", x, x, torch.empty_like(x), torch.empty(2), (8192, 4, *ring, False))
    # chunks: a power of two of at least 16 bytes a thread, or a multiple of one
    assert [S.sub_tile(c) for c in (8192, 6144, 4608, 10240, 13312)] == [8192, 2048, 512, 2048, 1024]
    for chunk, warps in ((6000, 4), (1536, 8), (256, 4), (0, 4)):
        with pytest.raises(ValueError, match="multiple of a power of two"):
            S.launch("fwd", x, x, torch.empty_like(x), torch.empty(2), (chunk, warps, 3, 1, 1, False))


def _holds_on_132(direction: str, elem: int, config, n: int, shifted: bool) -> bool:
    """Whether one launch of ``config`` holds rows of ``n`` on an H100 / H200 (132 multiprocessors of 228 KB);
    shifted rows count 16 bytes more."""
    return n + (16 // elem - 1 if shifted else 0) <= S.longest_row(direction, elem, config, 132, 233472)


def test_staged_gpu_entries_cpu():
    """A GPU model's ``STAGED_CONFIG_GPU`` entries are taken on that model only, at their lengths and up to the
    table's next entry, in place of the table's entries of the same length; the rest of the table stays; each
    entry is a config the kernel has, that fits a Hopper block and holds the rows it takes on an H100 / H200
    (132 multiprocessors). So does every entry of the shifted table but its last (past which the held path
    takes the rows), as each model takes it."""
    hopper = 232448
    assert S.gpu_tables(None) == (S.STAGED_CONFIG, S.STAGED_CONFIG_SHIFTED)
    assert S.gpu_tables("NVIDIA H100 PCIe") == (S.STAGED_CONFIG, S.STAGED_CONFIG_SHIFTED)  # (no entries of its own)
    assert S.STAGED_CONFIG_GPU
    for gpu, own in S.STAGED_CONFIG_GPU.items():
        main, shifted_table = S.gpu_tables(gpu)
        for (name, direction, elem), entries in own.items():
            table = {"main": S.STAGED_CONFIG, "shifted": S.STAGED_CONFIG_SHIFTED}[name][direction, elem]
            merged = (main if name == "main" else shifted_table)[direction, elem]
            lengths, replaced = [n for n, _ in merged], {n for n, _ in entries}
            assert lengths == sorted(lengths) and lengths[0] == 0
            kept = [e for e in table if e[0] not in replaced]  # the table's other entries, in order
            assert [e for e in merged if e[0] not in replaced] == kept and len(merged) == len(kept) + len(entries)
            assert [e for e in merged if e[0] in replaced] == sorted(entries, key=lambda e: e[0])
            shifted = name == "shifted"
            for n, config in entries:
                assert config[2:5] in S.RINGS and S.slot_bytes(direction, elem, config) <= hopper
                assert config[0] % (32 * config[1] * 16 // elem) == 0
                assert not shifted or not config[5]
                later = [k for k, _ in merged if k > n]  # (none: the table's last entry, held past its rows)
                for length in (n, (n + later[0] - 1) // 2 | 1, later[0] - 1) if later else (n,):
                    got = S.staged_config(direction, elem, length, tma=not shifted, shifted=shifted, gpu=gpu)
                    assert got == config, (gpu, name, direction, elem, length)
                    assert _holds_on_132(direction, elem, config, length, shifted), (gpu, length, config)
    for gpu in (None, *S.STAGED_CONFIG_GPU):
        for (direction, elem), entries in S.gpu_tables(gpu)[1].items():
            for (n, entry), (after, _) in zip(entries, entries[1:]):
                for config in S.alternatives(entry) if entry is not None else ():
                    assert _holds_on_132(direction, elem, config, after - 1, True), (gpu, direction, elem, n, config)
    # the H100's: the bf16 forward's lag 5 of 8192 from 65537 (aligned rows; shifted rows of 100000-524287, and
    # from 4194305, where they take the main table), the bf16 backward's shifted rows of 2883585-4325369 in 8192s
    h100 = "NVIDIA H100 80GB HBM3"
    for gpu, want in ((h100, (8192, 4, 7, 1, 5)), (None, (8192, 4, 4, 1, 3)), ("NVIDIA H200", (8192, 4, 4, 1, 3))):
        assert S.staged_config("fwd", 2, 5000192, gpu=gpu)[:5] == want
        assert S.staged_config("fwd", 2, 5000011, tma=False, shifted=True, gpu=gpu)[:5] == want
    assert [S.staged_config("fwd", 2, n, gpu=h100)[:5] for n in (65536, 65792, 1048576, 3000064, 6029312)] == (
        [(16384, 4, 3, 1, 1)] + [(8192, 4, 7, 1, 5)] * 4)
    assert S.staged_config("fwd", 2, 3000064)[:5] == S.staged_config("fwd", 2, 3000017, tma=False, shifted=True,
                                                                     gpu=h100)[:5] == (16384, 4, 3, 1, 2)
    assert [S.staged_config("fwd", 2, n, tma=False, shifted=True, gpu=h100)[:5] for n in (99999, 100003, 524287)] == (
        [S.staged_config("fwd", 2, 99999, tma=False, shifted=True)[:5]] + [(8192, 4, 7, 1, 5)] * 2)
    assert [S.staged_config("bwd", 2, n, tma=False, shifted=True, gpu=h100)[:2]
            for n in (2883583, 2883585, 4194305, 4325369, 4325371)] == [(4096, 4), (8192, 4), (8192, 4), (8192, 4),
                                                                        (4096, 4)]
    assert S.staged_config("bwd", 2, 3000064, gpu=h100) == S.staged_config("bwd", 2, 3000064)  # (aligned: the table)
    # and the float32 forward's shifted rows from 4194305 in lag 7 of 8192 by 8 warps (rows to 6488064)
    got = [S.staged_config("fwd", 4, n, tma=False, shifted=True, gpu=h100)[:5] for n in (4194303, 4194305, 6488061)]
    assert got == [S.staged_config("fwd", 4, 4194303, tma=False, shifted=True)[:5]] + [(8192, 8, 7, 1, 7)] * 2
    assert S.staged_config("fwd", 4, 4194305, tma=False, shifted=True)[:5] == (4096, 4, 7, 1, 6)


@pytest.mark.gpu
def test_staged_gpu_entries_gpu(poisoned, monkeypatch):
    """An entry of ``STAGED_CONFIG_GPU`` under this GPU's name is what the library launches (and not under
    another name); the plans made before it do not outlive it."""
    n, here = 100000, S.gpu_model(torch.cuda.current_device())
    x = make_x(4, n, torch.float32, "cuda", scale=30.0)
    table = S.launch_config("fwd", x, x)
    other = (4096, 4, 3, 1, 1, False) if table[0] != 4096 else (8192, 4, 3, 1, 1, False)
    entry = {("main", "fwd", 4): [(65536, other)]}
    for name, want in (("another GPU", table), (here, other)):
        monkeypatch.setattr(S, "STAGED_CONFIG_GPU", {name: entry})
        assert S.launch_config("fwd", x, x) == want
        launched, real = [], S.launch_planned

        def spy(plan, *args, **kwargs):
            launched.append(plan[3]["CHUNK"])
            return real(plan, *args, **kwargs)
        monkeypatch.setattr(S, "launch_planned", spy)
        y, lse = F.softmax_fwd(x)
        monkeypatch.setattr(S, "launch_planned", real)
        check_fwd(x, y, lse, TOL[torch.float32])
        assert launched == [want[0]]
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, n", [(1, 65536), (300, 40000), (37, 2**19 + 16), (5, 2**19 + 64), (3, 2**20 + 64)])
def test_staged_shapes_gpu(m, n, dtype, tma, poisoned):
    """The staged kernel itself: one row, many rows per program, a tail chunk; strided rows (16-byte
    aligned, so 16-bit rows qualify); chunks loaded by cp.async or TMA, both directions (TMA takes
    rows whose length the narrowest box width divides: 16 bytes, and chunk / 256 elements (a box has
    at most 256 rows); 2^19 + 16: float32 backward chunks of 4096 by boxes 16 wide, the other rows
    of it fall back; from 2^19 + 16 the float32 forward's lag 2 with its written chunk in registers;
    2^20 + 64: the 16-bit rings of lag 2)."""
    x = make_x(m, n + 64, dtype, "cuda", scale=30.0)[:, 32:32 + n]
    assert S.available(x)
    fwd, bwd = (S.staged_config(d, x.element_size(), n)[:5] + (tma,) for d in ("fwd", "bwd"))
    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert (S.tma_width(n, fwd[0], x) > 0) == (hopper and n % max(16 // x.element_size(), fwd[0] // 256) == 0)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    lse = torch.empty(m, device="cuda")
    assert S.launch("fwd", x, x, y, lse, fwd)
    check_fwd(x, y, lse, TOL[dtype])
    dy = torch.randn_like(y)
    dx = torch.empty_like(dy)
    assert S.launch("bwd", y, dy, dx, dx, bwd)
    check_softmax_grad(y, dy, dx, TOL[dtype])
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, n", [(300, 40001), (50, 40958), (30, 50257), (60, 100003), (9, 200003), (37, 2**19 + 17),
                                  (5, 2**20 + 3), (3, 2**21 + 5)])
def test_staged_unaligned_rows_gpu(m, n, dtype, poisoned):
    """Rows that do not start on 16 bytes, shifted (``ALIGN``): every row starts at another offset in
    16 bytes (N odd), or rows of N = 40958, which for the rows shifted least leave their last chunk
    empty (Q counts N + ALIGN - 1 columns); the rings of ``STAGED_CONFIG_SHIFTED`` (chunks of sub-tiles:
    bf16 forward 40958 / 50257 9216 / 10240, backward 6144 from 40001, float32 forward 6144 and backward 4608
    at 40001-50257; 100003: the float32 forward's chunks of 8192; 200003: the float32 backward's lag 2 in
    registers) and the main table's deep ones by cp.async, both directions; the outputs go into the middle
    of a larger buffer whose other columns must keep their value."""
    pad = 16

    def framed():
        big = torch.full((m, n + 2 * pad), 7.0, dtype=dtype, device="cuda")
        return big, big[:, pad:pad + n]

    def kept(big):
        return bool((big[:, :pad] == 7).all() and (big[:, pad + n:] == 7).all())

    x = make_x(m, n, dtype, "cuda", scale=30.0)
    big, y = framed()
    assert S.available(x, x, y) and S.tma_width(n, 8192, x) == 0  # (by cp.async)
    elem = x.element_size()
    assert S.launch_config("fwd", x, x, y) == S.staged_config("fwd", elem, n, tma=False, shifted=True,
                                                              gpu=S.gpu_model(torch.cuda.current_device()))
    lse = torch.empty(m, device="cuda")
    assert S.launch("fwd", x, x, y, lse)
    check_fwd(x, y.contiguous(), lse, TOL[dtype])
    assert kept(big)
    yy, dy = softmax_pair(m, n, dtype, "cuda")
    big, dx = framed()
    assert S.launch("bwd", yy, dy, dx, None)
    check_softmax_grad(yy, dy, dx.contiguous(), TOL[dtype])
    assert kept(big)
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("m, n", [(40, 30848), (40, 30821), (7, 61447), (300, 12289)])
def test_staged_sub_tiles_gpu(m, n, dtype, tma, poisoned):
    """Chunks that are not a power of two, several sub-tiles each (``sub_tile``), in the rings that keep
    chunks in their slots (lag 1 in 3 slots, lag 2 in 4, lag 3 in 5), both directions, by cp.async or
    TMA where the rows take it: aligned rows (30848), rows not 16-byte aligned (odd N), last chunks with
    sub-tiles wholly past the row's end (30848 and 30821 in chunks of 5 sub-tiles: the last holds about 100
    columns), rows of one chunk or two, -inf entries and an all -inf row."""
    vec = 128 // torch.finfo(dtype).bits * 32 * 4  # elements of a 16-byte vector a thread over 4 warps
    x = make_x(m, n, dtype, "cuda", scale=30.0)
    y, dy = softmax_pair(m, n, dtype, "cuda")
    for chunk, stages, lag in ((5 * 2 * vec, 3, 1), (3 * vec, 4, 2), (5 * vec, 5, 3)):
        assert S.sub_tile(chunk) < chunk
        config = (chunk, 4, stages, 1, lag, tma)
        out, lse = torch.empty_like(x), torch.empty(m, device="cuda")
        assert S.launch("fwd", x, x, out, lse, config)
        check_fwd(x, out, lse, TOL[dtype])
        dx = torch.empty_like(dy)
        assert S.launch("bwd", y, dy, dx, None, config)
        check_softmax_grad(y, dy, dx, TOL[dtype])
    assert F.sync_failures("cuda") == 0


def test_staged_grid_plan_cpu(monkeypatch):
    """Units come from the counter on every resident program while a row's chunks are at most the
    direction's share of them; longer rows (and CLAIM off) take the most whole rows' worth."""
    monkeypatch.setattr(S, "CLAIM_MAX_ROW_SHARE", {("fwd", 1): 0.125, ("bwd", 1): 0.25, ("fwd", 2): 1.0,
                                                   ("bwd", 2): 1.0})
    assert S.grid_plan("bwd", 1000, 256, 264, lag=2) == (264, True)     # lag 2: claims up to the grid
    assert S.grid_plan("bwd", 1000, 256, 264, claim=False, lag=2) == (256, False)
    assert S.grid_plan("fwd", 1000, 16, 264) == (264, True)
    assert S.grid_plan("fwd", 2, 16, 264) == (32, True)
    assert S.grid_plan("fwd", 1000, 33, 264) == (264, True)
    assert S.grid_plan("fwd", 1000, 64, 264) == (256, False)
    assert S.grid_plan("bwd", 1000, 64, 264) == (264, True)
    assert S.grid_plan("bwd", 1000, 128, 264) == (256, False)
    assert S.grid_plan("bwd", 1, 256, 264) == (256, False)
    assert S.grid_plan("fwd", 1000, 16, 264, claim=False) == (256, False)
    assert S.grid_plan("bwd", 1, 300, 264, claim=False) == (0, False)   # one row outnumbers the grid
    monkeypatch.setattr(S, "CLAIM", False)
    assert S.grid_plan("fwd", 1000, 16, 264) == (256, False)
    assert S.grid_plan("bwd", 3, 16, 264) == (48, False)


def test_staged_spill_fallbacks_cpu(monkeypatch):
    """A table config whose build spills on the installed triton gives way to the first of its
    ``SPILL_FALLBACKS`` whose plan holds the row (shifted bf16 rows of the lag-2 ring of 16384: lag 2 of
    12288, or past what that holds lag 5 of 8192; of the lag-3 ring of 8192: lag 5; aligned float32
    backward rows of the lag-2 ring of 4096 two ahead: one ahead; the held path's shifted float32 backward
    lag 7: lag 6); a build that does not spill, or a config the caller gives, stays."""
    monkeypatch.setattr(F, "RESIDENT_PROGRAMS", 256)
    spilled = {"bytes": 0}
    monkeypatch.setattr(F, "local_bytes", lambda *args: spilled["bytes"])

    def taken(direction, a, b, out, lse, config=None):
        consts = S._launch_plan(direction, a, b, out, lse, config, None)[3]
        return consts["CHUNK"], consts["STAGES"], consts["AHEAD"], consts["LAG"]

    for n, fallback in ((524289, (12288, 4, 1, 2)), (3500001, (8192, 7, 1, 5))):
        # (256 programs hold rows of 256 chunks of 12288, 3.1M, in lag 2; of 1024 of 8192 in lag 5)
        x, y, lse = torch.empty(2, n, dtype=torch.bfloat16), torch.empty(2, n, dtype=torch.bfloat16), torch.empty(2)
        assert F.row_align(x, x, y) > 1  # (the second row starts off 16 bytes)
        table = S.launch_config("fwd", x, x, y)
        assert table[:5] == (16384, 4, 3, 1, 2) and ("fwd", 2, *table[:5], True) in S.SPILL_FALLBACKS
        spilled["bytes"] = 0
        assert taken("fwd", x, x, y, lse) == (16384, 3, 1, 2)
        spilled["bytes"] = 8
        assert taken("fwd", x, x, y, lse) == fallback, n
        assert taken("fwd", x, x, y, lse, table) == (16384, 3, 1, 2)  # as given
    # shifted rows past 4194304 take the main table's lag 3 of 8192 by cp.async: lag 5 of 8192 where it spills
    monkeypatch.setattr(F, "RESIDENT_PROGRAMS", 396)
    x = y = torch.empty(2, 4194305, dtype=torch.bfloat16)
    assert S.launch_config("fwd", x, x, y)[:5] == (8192, 4, 4, 1, 3)
    assert taken("fwd", x, x, y, None) == (8192, 7, 1, 5)
    spilled["bytes"] = 0
    assert taken("fwd", x, x, y, None) == (8192, 4, 1, 3)
    spilled["bytes"] = 8
    # the held path's launch on shifted float32 backward rows past the lag-7 ring: lag 6 where its build spills
    monkeypatch.setattr(F, "RESIDENT_PROGRAMS", 132)
    y = torch.empty(2, 4194305)
    assert S.launch_config("bwd", y, y, y)[:5] == (4096, 4, 7, 1, 7)
    assert S.held_config("bwd", y, y, y)[:5] == (4096, 4, 7, 1, 6)
    spilled["bytes"] = 0
    assert S.held_config("bwd", y, y, y)[:5] == (4096, 4, 7, 1, 7)
    y = torch.empty(2, 2703361)  # (past what lag 6 holds on 132 programs: the direct launch keeps lag 7)
    spilled["bytes"] = 8
    assert taken("bwd", y, y, y, None) == (4096, 7, 1, 7)
    dy = torch.empty(3, 131072)
    assert S.launch_config("bwd", dy, dy)[:5] == (4096, 4, 3, 2, 2)
    assert taken("bwd", dy, dy, torch.empty_like(dy), None) == (4096, 3, 1, 2)
    spilled["bytes"] = 0
    assert taken("bwd", dy, dy, torch.empty_like(dy), None) == (4096, 3, 2, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_deep_rings_gpu(direction, dtype, poisoned):
    """Rows just past the start of each of the table's deep rings (lag >= 3: several chunks of a row
    per program; the 16-bit forward's lag 3 and 4 in 4 slots with their registers capped) go through
    the library's softmax, right and with no wait given up."""
    elem, gpu = torch.finfo(dtype).bits // 8, S.gpu_model(torch.cuda.current_device())
    main = S.gpu_tables(gpu)[0]  # (the table as this GPU model takes it)
    for start in sorted({n for n, config in main[(direction, elem)] if config[4] >= 3}):
        n = -(-start // 256) * 256 + 4096  # a multiple of 256: TMA rows on Hopper
        want = S.staged_config(direction, elem, n, gpu=gpu)
        x = make_x(3, n, dtype, "cuda", scale=30.0)
        if direction == "fwd":
            assert S.launch_config("fwd", x, x)[4] >= 3
            y, lse = F.softmax_fwd(x)
            check_fwd(x, y, lse, TOL[dtype])
        else:
            y, dy = softmax_pair(3, n, dtype, "cuda")
            assert S.launch_config("bwd", y, dy)[4] >= 3
            check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[dtype])
        if torch.cuda.get_device_capability()[0] == 9:  # TMA rows, the table's entry for them
            assert S.launch_config(direction, x, x) == want, (start, want)
        assert F.sync_failures("cuda") == 0, start


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_shifted_deep_rings_gpu(direction, dtype, poisoned, monkeypatch):
    """Odd-length rows (not 16-byte aligned: cp.async) just past the start of each deep ring (lag >= 3)
    of ``STAGED_CONFIG_SHIFTED`` take it and come out right through the library; rows twice as long as
    the last one's start, past its capacity, take the held path with it (``HELD_MIN_BYTES`` lowered for
    small M)."""
    monkeypatch.setattr(H, "HELD_MIN_BYTES", 0)
    elem, gpu = torch.finfo(dtype).bits // 8, S.gpu_model(torch.cuda.current_device())
    shifted_table = S.gpu_tables(gpu)[1]  # (the table as this GPU model takes it)
    deep = [n for n, c in shifted_table[direction, elem] if c is not None and S.alternatives(c)[0][4] >= 3]
    assert deep
    for n in [start + 1 + start % 2 for start in deep] + [2 * deep[-1] + 1]:
        x = make_x(3, n, dtype, "cuda", scale=30.0)
        a, b = (x, x) if direction == "fwd" else softmax_pair(3, n, dtype, "cuda")
        config = S.launch_config(direction, a, b)
        assert F.row_align(a, b) > 1 and config == S.staged_config(direction, elem, n, tma=False, shifted=True, gpu=gpu)
        assert (H.held_width(direction, a, b, torch.empty_like(b), config) > 0) == (n > 2 * deep[-1])
        if direction == "fwd":
            y, lse = F.softmax_fwd(x)
            check_fwd(x, y, lse, TOL[dtype])
        else:
            check_softmax_grad(a, b, B.softmax_bwd(a, b), TOL[dtype])
        assert F.sync_failures("cuda") == 0, n


@pytest.mark.gpu
@pytest.mark.parametrize("n", [32768, 49152, 40960])
def test_staged_whole_chunks_gpu(n, poisoned):
    """bf16 rows of a whole number of 16384-element chunks take them (``STAGED_CONFIG_WHOLE``, by TMA on
    Hopper), others of the same range the main table's 8192; right either way."""
    x = make_x(5, n, torch.bfloat16, "cuda", scale=30.0)
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[torch.bfloat16])
    if torch.cuda.get_device_capability()[0] == 9:
        assert S.launch_config("fwd", x, x)[0] == (16384 if n % 16384 == 0 else 8192)
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
def test_staged_four_programs_that_fill_shared_memory_gpu(poisoned):
    """Seven 8 KB slots per program: 57 KB of shared memory, four blocks per multiprocessor only
    without the 1 KB CUDA reserves per block, so three are resident; the grid follows (no wait gives
    up: a grid counted at four would wait on programs that never start)."""
    x = make_x(2, 1 << 21, torch.float32, "cuda", scale=30.0)   # 1024 chunks: more than the programs
    y, lse = torch.empty_like(x), torch.empty(2, device="cuda")
    assert S.launch("fwd", x, x, y, lse, (2048, 4, 7, 1, 5, True))
    check_fwd(x, y, lse, TOL[torch.float32])
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
def test_staged_rows_at_full_capacity_gpu(poisoned, monkeypatch):
    """bf16 backward rows of exactly the deepest ring's capacity (``held_columns``, the held path's
    fill), 40 of them, ten calls: no wait gives up. The deep rings start a claim after the step's wait
    where the unit taken then is in the written row (``LATE_CLAIM``); with every claim at the step's top,
    1 to 15 calls in 24 had waits that gave up, on an H100 (sessions 44-45). ``SPIN_MAX`` is lowered so
    that a give-up costs milliseconds here, not seconds; normal waits last microseconds."""
    probe = torch.empty(1, 8 << 20, dtype=torch.bfloat16, device="cuda")
    n = S.held_columns("bwd", probe, probe, probe)
    y, dy = softmax_pair(40, n, torch.bfloat16, "cuda")
    plan = S._launch_plan("bwd", y, dy, torch.empty_like(dy), None, None, None)
    assert plan is not None and plan[2] * S.launch_config("bwd", y, dy)[0] == n   # whole rows, one launch
    assert plan[1] and plan[3]["LATE_CLAIM"]  # (claimed units in a deep ring)
    monkeypatch.setattr(F, "SPIN_MAX", 1 << 12)
    before = F.sync_failures("cuda")
    for _ in range(10):
        dx = B.softmax_bwd(y, dy)
    torch.cuda.synchronize()
    assert F.sync_failures("cuda") == before
    assert dx.is_contiguous()
    check_softmax_grad(y[::13], dy[::13], dx[::13].contiguous(), TOL[torch.bfloat16])  # (every 13th row: float64 copies)


def test_held_width_cpu(monkeypatch):
    """Where the held path cuts rows: its fill of the staged kernel's capacity in whole chunks, none
    where whole rows fit, the held share is under the direction's minimum or the call moves fewer
    bytes than HELD_MIN_BYTES."""
    monkeypatch.setattr(F, "RESIDENT_PROGRAMS", 100)
    monkeypatch.setattr(H, "HELD_MIN_BYTES", 0)
    config = (4096, 8, 7, 1, 5, False)             # capacity: 4 x 100 chunks of 4096
    rows = torch.empty(2, 2**21)
    for direction in ("fwd", "bwd"):  # the library's keys: on for every one
        for t in (rows, rows.bfloat16()):
            assert H.held_width(direction, t, t, t, config) > 0
    monkeypatch.setattr(H, "HELD_MIN_SHARE", dict.fromkeys(H.HELD_MIN_SHARE))  # None: off
    assert H.held_width("bwd", rows, rows, rows, config) == 0
    monkeypatch.setattr(H, "HELD_FILL", {"fwd": 0.9, "bwd": 1.0})
    monkeypatch.setattr(H, "HELD_MIN_SHARE", {("fwd", 4): 0.2, ("bwd", 4): 0.1})
    for direction, n, want in (("fwd", 2**21, 360 * 4096), ("bwd", 2**21, 400 * 4096),
                               ("fwd", 360 * 4096, 0),        # whole rows fit
                               ("fwd", 360 * 4096 * 5, 360 * 4096), ("fwd", 360 * 4096 * 5 + 1, 0),
                               ("bwd", 400 * 4096 * 10, 400 * 4096), ("bwd", 400 * 4096 * 10 + 1, 0)):
        x = torch.empty(2, n)
        assert H.held_width(direction, x, x, x, config) == want, (direction, n)
    # forward float32: x read once, y written, the streamed 2^21 - H columns of x read again
    held = 360 * 4096
    assert H.traffic("fwd", rows, rows, rows, held) == 2 * 4 * (3 * 2**21 - held)
    assert H.traffic("bwd", rows, rows.bfloat16(), rows.bfloat16(), held) == 2 * (8 * 2**21 + 6 * (2**21 - held))
    monkeypatch.setattr(H, "HELD_MIN_BYTES", H.traffic("fwd", rows, rows, rows, held))
    assert H.held_width("fwd", rows, rows, rows, config) == held
    assert H.held_width("fwd", rows[:1], rows[:1], rows[:1], config) == 0
    # while a CUDA graph is captured: no byte minimum, HELD_MIN_ROWS_CAPTURED rows instead
    monkeypatch.setattr(H, "HELD_MIN_BYTES", float("inf"))
    monkeypatch.setattr(H, "HELD_MIN_ROWS_CAPTURED", 2)
    assert H.held_width("fwd", rows, rows, rows, config) == 0
    assert H.held_width("fwd", rows, rows, rows, config, captured=True) == held
    assert H.held_width("fwd", rows[:1], rows[:1], rows[:1], config, captured=True) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("direction, n", [("fwd", 8 << 20), ("bwd", (4 << 20) + 5)])
def test_held_path_captured_in_cuda_graph_gpu(direction, n, monkeypatch):
    """Float32 rows past the staged kernel's capacity, 4 of them: too few bytes for the held path in an eager
    call (``HELD_MIN_BYTES``), but while a CUDA graph is captured they take it (``HELD_MIN_ROWS_CAPTURED``), and
    the graph's replays, on new inputs copied in, give the float64 softmax."""
    taken = []
    held_split = H.held_split

    def spy(*args):
        taken.append(held_split(*args))
        return taken[-1]
    monkeypatch.setattr(H, "held_split", spy)
    if direction == "fwd":
        a = make_x(4, n, torch.float32, "cuda", scale=30.0)
        b = a
        run = lambda: F.softmax_fwd(a)                                  # noqa: E731
    else:
        a, b = softmax_pair(4, n, torch.float32, "cuda")
        run = lambda: (B.softmax_bwd(a, b), None)                       # noqa: E731
    assert H.traffic(direction, a, b, a, 0) < H.HELD_MIN_BYTES
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()                                                           # eagerly: the path without held columns
    torch.cuda.current_stream().wait_stream(side)
    assert taken == [False]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = run()
    assert taken == [False, True]
    for seed in range(2):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        if direction == "fwd":
            a.copy_(make_x(4, n, torch.float32, "cuda", scale=30.0, gen=gen))
        else:
            b.copy_(torch.randn(b.shape, generator=gen, device="cuda"))
        out.fill_(float("nan"))
        graph.replay()
        if direction == "fwd":
            check_fwd(a, out, lse, TOL[torch.float32])
        else:
            check_softmax_grad(a, b, out, TOL[torch.float32])
    assert F.sync_failures("cuda") == 0


def test_occupancy_counts_reserved_shared_memory_cpu():
    """Blocks per multiprocessor by registers, by shared memory with CUDA's reserved kilobyte per
    block, and the warp / block limits (H100/H200: 64K registers, 228 KB of shared memory)."""
    regs, smem = 65536, 233472
    assert F.occupancy(64, 57344 + 600, 4, regs, smem) == 3    # 4 x (57944 + 1024) > 233472
    assert F.occupancy(64, 65632, 8, regs, smem) == 3
    assert F.occupancy(62, 114808, 8, regs, smem) == 2
    assert F.occupancy(255, 0, 4, regs, smem) == 2             # registers: 256 x 32 per warp
    assert F.occupancy(16, 0, 1, regs, smem) == 32             # the block limit
    assert F.occupancy(16, 0, 4, regs, smem) == 16             # the 64-warp limit
    assert F.occupancy(255, 300000, 32, regs, smem) == 1       # at least one


def test_staged_register_caps_cpu():
    """A register cap names a config of the table, and its launches (only theirs) compile with it."""
    for (direction, elem, ring), cap in S.REGISTER_CAPS.items():
        assert any(config[:5] == ring for _, config in S.STAGED_CONFIG[direction, elem])
        assert cap % 8 == 0 and cap < 255
    x = torch.empty(2, 1 << 22, dtype=torch.bfloat16)
    consts, warps = S._constexprs("fwd", x, x, x, (8192, 4, 4, 1, 3, True), False)
    assert consts["maxnreg"] == S.REGISTER_CAPS[("fwd", 2, (8192, 4, 4, 1, 3))] and warps == 4
    for config in ((8192, 4, 4, 1, 2, True), (16384, 4, 3, 1, 2, True)):  # (merging partitions: below)
        assert "maxnreg" not in S._constexprs("fwd", x, x, x, config, False)[0]
    assert "maxnreg" not in S._constexprs("fwd", x.float(), x.float(), x.float(), (8192, 4, 4, 1, 3, True), False)[0]


def test_staged_merge_partitions_cpu():
    """A merging partition names a deep ring of the table and compiles into its launches only up to
    its longest row, with its register cap, waiting for a row's pending words only up to its longest
    row that does."""
    for (direction, elem, ring), (warps, early, cap, longest, waiting) in S.MERGE_PARTITIONS.items():
        config = [c for n, c in S.STAGED_CONFIG[direction, elem] if c[:5] == ring and n <= longest]
        assert config and ring[4] >= 3 and warps in (1, 2, 4) and early in (0, 1) and cap % 8 == 0 and cap <= 255
        assert 0 <= waiting <= longest
        dtype = torch.float32 if elem == 4 else torch.bfloat16
        lengths = [(n, True, n <= waiting) for n in (waiting, waiting + 256) if 0 < n <= longest]
        if longest < 1 << 30:  # (an entry for rows of any length: its end is not one to allocate)
            lengths.append((longest + 256, False, False))
        for n, merged, waits in lengths:
            x = torch.empty(2, n, dtype=dtype)
            consts, _ = S._constexprs(direction, x, x, x, config[0], False)
            assert (consts["MERGE_WARPS"], consts["MERGE_EARLY"]) == ((warps, early) if merged else (0, 0))
            assert consts["MERGE_WAITS"] == waits
            assert consts.get("maxnreg") == (cap if merged else S.REGISTER_CAPS.get((direction, elem, ring)))


@pytest.mark.gpu
@pytest.mark.parametrize("tail", [64, 80])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_staged_register_cap_gpu(dtype, tail, poisoned):
    """The 16-bit forward's lag 3 in 4 slots of 16 KB compiles within its register cap, so three
    programs per multiprocessor are resident where shared memory holds three (Hopper; by cp.async,
    unbounded, it took 198 registers: two); rows past what two programs per multiprocessor hold run,
    right. Rows of a multiple of 64 load by TMA on Hopper; with a tail of 80 (a multiple of 16, as
    16-bit rows must be, but not of 32, the narrowest TMA box for chunks of 8192) by cp.async."""
    config = (8192, 4, 4, 1, 3, True)
    cap = S.REGISTER_CAPS[("fwd", 2, config[:5])]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = S.capacity(3, 2 * sms) * 8192 + 3 * 8192 + tail   # (16-bit rows: 16-byte aligned, as S.available asks)
    x = make_x(2, n, dtype, "cuda", scale=30.0)
    assert S.available(x)
    y, lse = torch.empty_like(x), torch.empty(2, device="cuda")
    consts, warps = S._constexprs("fwd", x, x, y, config, False)
    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert consts["TMA_LOAD"] == (hopper and tail == 64)
    args = S._kernel_args(x, x, y, lse, None, consts, S._stand_in_words(x.device), 8)
    compiled = S._staged_kernel.warmup(*args, **consts, CLAIM=True, num_warps=warps, grid=(1,))
    compiled._init_handles()
    assert compiled.n_regs <= cap
    programs = S._resident(args, consts, warps, True)
    if torch.cuda.get_device_capability()[0] == 9:  # 228 KB of shared memory per multiprocessor
        assert programs == 3 * sms
    assert S.launch("fwd", x, x, y, lse, config) == (programs >= 3 * sms)
    if programs >= 3 * sms:
        check_fwd(x, y, lse, TOL[dtype])
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
def test_staged_tma_only_config_gpu(poisoned):
    """bf16 backward rows of 2^20 take the TMA-only 16384 x 8 config on Hopper; rows whose length the
    box width does not divide (N % 64 != 0) take the cp.async entry of the same length; both right."""
    hopper = torch.cuda.get_device_capability()[0] >= 9
    for n in (1 << 20, (1 << 20) + 16):
        y, dy = softmax_pair(3, n, torch.bfloat16, "cuda")
        config = S.launch_config("bwd", y, dy)
        assert S.tma_only("bwd", 2, config) == (hopper and n % 64 == 0)
        check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[torch.bfloat16])
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
def test_staged_tma_only_ring_gpu(poisoned):
    """float32 forward rows of 2^22 take the one-program deep ring by TMA on Hopper; rows that cannot
    take TMA (N % 4 != 0) take the entry of the same length before it; both right."""
    hopper = torch.cuda.get_device_capability()[0] >= 9
    for n in (1 << 22, (1 << 22) - 2):
        x = make_x(3, n, torch.float32, "cuda", scale=30.0)
        config = S.launch_config("fwd", x, x)
        assert S.tma_only("fwd", 4, config) == (hopper and n % 4 == 0)
        y, lse = F.softmax_fwd(x)
        check_fwd(x, y, lse, TOL[torch.float32])
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("ring", S.RINGS)
@pytest.mark.parametrize("claim", [False, True])
@pytest.mark.parametrize("programs", [7, 12])
def test_staged_small_grids_gpu(programs, claim, ring, poisoned, monkeypatch):
    """Grids of 7 and 12 programs over rows of 3 (forward) and 6 (backward) chunks (lag 2: 6 and 12;
    the deep rings, lag >= 3: 12 and 24, so that a program holds several chunks of one row), units
    claimed from the counter (a row's chunks then straddle the programs' steps) or whole rows per
    group of programs; every ring (a chunk waits in its slot, or in registers). A row launches where
    its chunks are at most ``capacity`` (claims) or the grid (whole rows)."""
    monkeypatch.setattr(F, "RESIDENT_PROGRAMS", programs)
    monkeypatch.setattr(S, "CLAIM", claim)
    monkeypatch.setattr(S, "CLAIM_MAX_ROW_SHARE", {key: max(key[1] - 1.0, 1.0) for key in S.CLAIM_MAX_ROW_SHARE})
    lag = ring[2]
    split = lag if lag <= 2 else 4   # deep rings: chunks of 2048 and 1024
    configs = ((8192 // split, 4, *ring, False), (4096 // split, 4, *ring, False))
    m, n = 50, 3 * 8192 - 5
    x = make_x(m, n, torch.float32, "cuda", scale=30.0)
    y, lse = torch.empty_like(x), torch.empty(m, device="cuda")

    def fits(chunk):
        q = -(-n // chunk)
        return q <= S.capacity(lag, programs) and (claim or q <= programs)

    launched = S.launch("fwd", x, x, y, lse, configs[0])
    assert launched == fits(configs[0][0])
    if launched:
        check_fwd(x, y, lse, TOL[torch.float32])
    dy = torch.randn_like(y)
    dx = torch.empty_like(dy)
    launched = S.launch("bwd", y, dy, dx, dx, configs[1])
    assert launched == fits(configs[1][0])
    if launched:
        check_softmax_grad(y, dy, dx, TOL[torch.float32])
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("claim", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ring, chunks", [((2048, 4, 3, 1, 2), 5), ((1024, 4, 7, 1, 6), 25),
                                         ((1024, 4, 4, 1, 4), 25)])
def test_staged_16bit_chunks_held_as_words_gpu(ring, chunks, dtype, claim, tma, poisoned, monkeypatch):
    """Lag L in L + 1 slots, 1 ahead, on 16-bit rows: the chunk written next waits in registers two
    elements to a 32-bit word (lag L in L slots: the one after it too). Forward and backward on a grid
    of 12 programs: lag 2 on rows of 5 chunks (units claimed or fixed), lags 6 and 4 (in 4 slots) on
    rows of 25 (a program holds several chunks of a row; claimed: fixed units take whole rows only);
    a tail chunk; loads by cp.async or TMA."""
    monkeypatch.setattr(F, "RESIDENT_PROGRAMS", 12)
    monkeypatch.setattr(S, "CLAIM", claim)
    monkeypatch.setattr(S, "CLAIM_MAX_ROW_SHARE", {key: max(key[1] - 1.0, 1.0) for key in S.CLAIM_MAX_ROW_SHARE})
    m, n = 50, chunks * ring[0] - 48
    x = make_x(m, n, dtype, "cuda", scale=30.0)
    out, lse = torch.empty_like(x), torch.empty(m, device="cuda")
    y, dy = softmax_pair(m, n, dtype, "cuda")
    dx = torch.empty_like(dy)
    fits = claim or chunks <= 12
    assert S.launch("fwd", x, x, out, lse, ring + (tma,)) == fits
    assert S.launch("bwd", y, dy, dx, dx, ring + (tma,)) == fits
    if fits:
        check_fwd(x, out, lse, TOL[dtype])
        check_softmax_grad(y, dy, dx, TOL[dtype])
    assert F.sync_failures("cuda") == 0


def _partition(waits: bool, early: int = 1) -> tuple:
    """A ``MERGE_PARTITIONS`` entry: 4 warps, 128 registers, rows of any length, waiting for a row's
    pending words on all of them (``waits``) or on none (leaving those rows to the steps)."""
    return (4, early, 128, 1 << 40, 1 << 40 if waits else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("claim, chunks", [(True, 25), (True, "full"), (False, 11)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("early, waits", [(0, True), (1, True), (1, False)])
@pytest.mark.parametrize("ring", [(7, 1, 5), (7, 1, 6), (4, 1, 4)])
def test_staged_merge_partition_gpu(ring, early, waits, dtype, claim, chunks, poisoned, monkeypatch):
    """Deep rings whose rows' partial words a partition of 4 more warps merges (``MERGE_PARTITIONS``),
    the row sent to it at the step its unit is written or one before (``early``), waiting for pending
    words or leaving those rows to the steps (``waits``): forward and backward on a grid of 12
    programs, rows of 25 chunks with a tail, or of all but 2 of the chunks the ring holds ("full":
    rows then often complete only at the write's step), units claimed (a program holds several
    chunks of a row), or 11 as fixed units; 16-bit rows by TMA, float32 by cp.async."""
    chunks = S.capacity(ring[2], 12) - 2 if chunks == "full" else chunks
    monkeypatch.setattr(F, "RESIDENT_PROGRAMS", 12)
    monkeypatch.setattr(S, "CLAIM", claim)
    monkeypatch.setattr(S, "CLAIM_MAX_ROW_SHARE", {key: max(key[1] - 1.0, 1.0) for key in S.CLAIM_MAX_ROW_SHARE})
    config = (1024, 4, *ring, dtype != torch.float32)
    elem = torch.finfo(dtype).bits // 8
    monkeypatch.setattr(S, "MERGE_PARTITIONS", {(d, elem, config[:5]): _partition(waits, early)
                                                for d in ("fwd", "bwd")})
    consts, _ = S._constexprs("fwd", *[torch.empty(2, 4096, dtype=dtype)] * 3, config, False)
    assert consts["MERGE_WARPS"] == 4 and consts["MERGE_EARLY"] == early and consts["maxnreg"] == 128
    assert consts["MERGE_WAITS"] == waits
    m, n = 50, chunks * 1024 - 48
    x = make_x(m, n, dtype, "cuda", scale=30.0)
    out, lse = torch.empty_like(x), torch.empty(m, device="cuda")
    y, dy = softmax_pair(m, n, dtype, "cuda")
    dx = torch.empty_like(dy)
    assert S.launch("fwd", x, x, out, lse, config) and S.launch("bwd", y, dy, dx, dx, config)
    check_fwd(x, out, lse, TOL[dtype])
    check_softmax_grad(y, dy, dx, TOL[dtype])
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("waits", [True, False])
def test_staged_merge_partition_that_gives_up_still_computes_right_gpu(waits, poisoned, monkeypatch):
    """SPIN_MAX < 0 with a merging partition: every row's statistic is read from global memory, by
    the partition's own 4 warps (``waits``: ``_row_from_global``) or by the steps, which it leaves
    the rows to."""
    monkeypatch.setattr(F, "SPIN_MAX", -1)
    monkeypatch.setattr(F, "RESIDENT_PROGRAMS", 12)
    config = (1024, 4, 7, 1, 5, True)
    monkeypatch.setattr(S, "MERGE_PARTITIONS", {(d, 2, config[:5]): _partition(waits) for d in ("fwd", "bwd")})
    before = F.sync_failures("cuda")
    try:
        x = make_x(9, 30 * 1024 + 16, torch.bfloat16, "cuda", scale=50.0)
        out, lse = torch.empty_like(x), torch.empty(9, device="cuda")
        assert S.launch("fwd", x, x, out, lse, config)
        check_fwd(x, out, lse, TOL[torch.bfloat16])
        y, dy = softmax_pair(9, 30 * 1024 + 16, torch.bfloat16, "cuda")
        dx = torch.empty_like(dy)
        assert S.launch("bwd", y, dy, dx, dx, config)
        check_softmax_grad(y, dy, dx, TOL[torch.bfloat16])
        assert F.sync_failures("cuda") > before
    finally:
        F.error_counter("cuda").zero_()  # the other tests expect no give-ups in this process


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_one_row_with_any_stride_gpu(dtype, poisoned):
    """A single row whose row stride is not 16-byte aligned (never used) takes the staged kernel,
    TMA loads included (16-bit rows of that stride once failed to compile: 2-byte cp.async)."""
    n = 2**16
    x = make_x(2, n + 66, dtype, "cuda", scale=30.0)[:1, 32:32 + n]
    assert x.stride(0) * x.element_size() % 16 != 0 and S.available(x)
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[dtype])
    y, dy = (t[:1, 32:32 + n] for t in softmax_pair(2, n + 66, dtype, "cuda"))
    check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[dtype])


@pytest.mark.gpu
def test_staged_in_a_cuda_graph_gpu(poisoned):
    """Captured in a CUDA graph (after a first call compiled it), the staged kernel replays with its
    partial words filled again by the graph at every replay."""
    x = make_x(64, 65536, torch.bfloat16, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        F.softmax_fwd(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, lse = F.softmax_fwd(x)
    for scale in (1.0, 0.5, 0.25):
        x.mul_(scale)
        graph.replay()
        torch.cuda.synchronize()
        check_fwd(x, y, lse, TOL[torch.bfloat16])
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
def test_staged_refuses_what_it_cannot_take_gpu():
    """Rows longer than the resident grid holds, and 16-bit rows no shift aligns (a start off 16
    bytes), go to the Triton paths; other unaligned rows take it, shifted (``F.row_align``)."""
    x = torch.randn(2, 2**25, device="cuda")
    assert not S.launch("fwd", x, x, torch.empty_like(x), torch.empty(2, device="cuda"))
    assert not S.available(torch.randn(2, 65552 + 8, device="cuda").bfloat16()[:, 1:65553])
    assert S.available(torch.randn(2, 65539, device="cuda").bfloat16())
    assert S.available(torch.randn(2, 65552 + 8, device="cuda").bfloat16()[:, 8:])
    assert S.available(torch.randn(2, 65539, device="cuda"))


@pytest.mark.gpu
def test_staged_wait_that_gives_up_still_computes_right_gpu(poisoned, monkeypatch):
    """SPIN_MAX < 0: every wait of the staged kernel gives up at once, so every row's statistic
    comes from the fallback that re-reads the row from global memory."""
    monkeypatch.setattr(F, "SPIN_MAX", -1)
    before = F.sync_failures("cuda")
    try:
        x = make_x(9, 300000, torch.float32, "cuda", scale=50.0)
        y, lse = F.softmax_fwd(x)
        check_fwd(x, y, lse, TOL[torch.float32])
        dy = torch.randn_like(y)
        check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[torch.float32])
        assert F.sync_failures("cuda") > before
    finally:
        F.error_counter("cuda").zero_()  # the other tests expect no give-ups in this process


@cpu_only
@pytest.mark.parametrize("programs_per_row", [2, 3])
def test_persistent_wait_that_gives_up_still_computes_right_cpu(programs_per_row, poisoned, small_regimes,
                                                                monkeypatch):
    """Programs run one after another in the interpreter: with several per row and SPIN_MAX = 0, the
    first ones give up waiting for the others' partials and must recompute the row from x."""
    monkeypatch.setattr(F, "INTERPRETER_PERSISTENT", True)
    monkeypatch.setattr(F, "INTERPRETER_PROGRAMS_PER_ROW", programs_per_row)
    monkeypatch.setattr(F, "SPIN_MAX", 0)
    monkeypatch.setattr(F, "SPLIT_CHUNK", {4: (64, 1), 2: (64, 1)})
    monkeypatch.setattr(B, "BWD_SPLIT_CHUNK", {4: (64, 1), 2: (64, 1)})
    before = F.sync_failures("cpu")
    x = make_x(5, 300, torch.float32, "cpu", scale=50.0)
    y, lse = F.softmax_fwd(x)
    check_fwd(x, y, lse, TOL[torch.float32])
    dy = torch.randn(5, 300)
    check_softmax_grad(y, dy, B.softmax_bwd(y, dy), TOL[torch.float32])
    assert F.sync_failures("cpu") > before          # the fallback did run


def _held_case(direction, m, n, dtype):
    """Inputs for the held path: (a, b, out, lse) with row 1 all -inf (backward: y = 0), and,
    once ``held`` is known, rows whose held or streamed columns alone are empty (``_empty_parts``)."""
    if direction == "fwd":
        x = make_x(m, n, dtype, "cuda", scale=30.0)
        return x, x, torch.empty_like(x), torch.empty(m, device="cuda")
    y, dy = softmax_pair(m, n, dtype, "cuda")
    return y, dy, torch.empty_like(dy), None


def _empty_parts(a, held, direction):
    """Row 2: its held columns empty (-inf forward, y = 0 backward); row 3: its streamed columns."""
    empty = float("-inf") if direction == "fwd" else 0.0
    a[2, :held] = empty
    a[3, held:] = empty


@pytest.mark.gpu
@pytest.mark.parametrize("direction, dtype, n", [
    ("fwd", torch.float32, 300007),        # lag-1 ring by cp.async (no TMA: N % 4 != 0)
    ("fwd", torch.float32, 2**19 + 4096),  # lag 2, the chunk written held in registers
    ("fwd", torch.float32, 2**21 + 12288),  # a deep ring (lag 5)
    ("fwd", torch.bfloat16, 2**20 + 8192),
    ("bwd", torch.float32, 300007),        # lag 2 in registers
    ("bwd", torch.float32, 2**20 + 4099),  # a deep ring
    ("bwd", torch.bfloat16, 2**18 + 64),
    ("bwd", torch.bfloat16, 2**18 + 67),   # rows shifted to 16 bytes (ALIGN 8)
])
def test_held_split_gpu(direction, dtype, n, poisoned, monkeypatch):
    """Rows longer than the staged kernel holds (a grid counted as 12 programs holds few chunks): the
    leading columns staged with the streamed columns' statistic merged in, the rest two-pass; rows
    whose held or streamed part alone is empty, an all-empty row; through the library too."""
    _check_held_split(direction, dtype, n, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("waits", [True, False])
@pytest.mark.parametrize("direction, dtype, n", [("fwd", torch.float32, 2**21 + 12288),
                                                  ("fwd", torch.bfloat16, 2**23 + 8192),
                                                  ("bwd", torch.bfloat16, 2**21 + 4096)])
def test_held_split_merge_partition_gpu(direction, dtype, n, waits, poisoned, monkeypatch):
    """``test_held_split_gpu``'s deep rings with a merging partition (``MERGE_PARTITIONS``): the
    streamed columns' statistic merged by it (or by the steps, where it leaves them a row)."""
    elem = torch.finfo(dtype).bits // 8
    assert S.staged_config(direction, elem, n)[4] >= 3
    monkeypatch.setattr(S, "MERGE_PARTITIONS", {(direction, elem, config[:5]): _partition(waits)
                                                for _, config in S.STAGED_CONFIG[direction, elem] if config[4] >= 3})
    _check_held_split(direction, dtype, n, monkeypatch)


def _check_held_split(direction, dtype, n, monkeypatch):
    monkeypatch.setattr(F, "RESIDENT_PROGRAMS", 12)
    monkeypatch.setattr(H, "HELD_MIN_SHARE", dict.fromkeys(H.HELD_MIN_SHARE, 0.0))
    monkeypatch.setattr(H, "HELD_MIN_BYTES", 0)
    a, b, out, lse = _held_case(direction, 6, n, dtype)
    config = S.launch_config(direction, a, b)
    chunk = config[0]
    # (rows the staged kernel shifts to 16 bytes keep their last ALIGN columns for the streamed ones)
    align = S._constexprs(direction, a[:, :chunk], b[:, :chunk], out[:, :chunk], config, True)[0]["ALIGN"]
    assert align == (1 if n % 16 == 0 else 16 // a.element_size())
    fits = S.capacity(config[4], 12) * chunk - (align if align > 1 else 0)
    assert S.held_columns(direction, a, b, out, config) == fits < n
    held = H.held_width(direction, a, b, out, config)
    assert held == int(H.HELD_FILL[direction] * fits / chunk) * chunk
    _empty_parts(a, held, direction)
    assert H.held_split(direction, a, b, out, lse)
    if direction == "fwd":
        check_fwd(a, out, lse, TOL[dtype])
        check_fwd(a, *F.softmax_fwd(a), TOL[dtype])
    else:
        check_softmax_grad(a, b, out, TOL[dtype])
        check_softmax_grad(a, b, B.softmax_bwd(a, b), TOL[dtype])
    assert F.sync_failures("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("direction, dtype, n", [("fwd", torch.float32, 7 * 2**20),
                                                  ("fwd", torch.bfloat16, 9 * 2**20 + 16),
                                                  ("bwd", torch.float32, 7 * 2**19 + 5)])
def test_held_split_past_capacity_gpu(direction, dtype, n, poisoned, monkeypatch):
    """Rows just past what the GPU's shared memory holds, by the held path (on for every key): float32
    forward past the lag-7 ring's 6.5M (132 multiprocessors), 16-bit rows without TMA (N % 32 != 0)
    past the lag-5 ring's 8.65M, float32 backward without TMA (N odd) past its lag-7 ring's 3.24M."""
    monkeypatch.setattr(H, "HELD_MIN_SHARE", dict.fromkeys(H.HELD_MIN_SHARE, 0.1))
    monkeypatch.setattr(H, "HELD_MIN_BYTES", 0)
    a, b, out, lse = _held_case(direction, 4, n, dtype)
    held = H.held_width(direction, a, b, out, S.launch_config(direction, a, b))
    assert S.STAGED_MIN_N[direction, a.element_size()] < held < n
    assert not S.launch(direction, a, b, out, lse if lse is not None else out)
    _empty_parts(a, held, direction)
    assert H.held_split(direction, a, b, out, lse)
    if direction == "fwd":
        check_fwd(a, out, lse, TOL[dtype])
    else:
        check_softmax_grad(a, b, out, TOL[dtype])
    assert F.sync_failures("cuda") == 0


def test_probe_softmax_timeline(monkeypatch):
    """``benchmarks/probes/softmax_timeline.py``: its traced copy of the staged kernel still finds its
    anchors and parses, with its six clock readings, and its summary reads the step's spans right off
    a made-up trace (steps of 5000 cycles wrapping 2^32; e2, e3 missing on odd steps: no unit reduced)."""
    import ast
    import pathlib
    import re

    probes = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "probes"
    monkeypatch.syspath_prepend(str(probes))
    import softmax_timeline as st
    from ablations import KERNELS

    traced = st.traced_source((KERNELS / "softmax_staged.py").read_text())
    ast.parse(traced)
    assert traced.count("_trace(PRIOR") == st.EVENTS
    t = torch.zeros(3, st.TRACE_STEPS, st.EVENTS, dtype=torch.int64)
    for s in range(st.TRACE_STEPS):
        start = (1 << 32) - 7000 + 5000 * s
        t[:, s] = torch.tensor([start + e for e in (0, 100, 300, 1300, 3300, 4000)]) & 0xFFFFFFFF
        if s % 2:
            t[:, s, 2:4] = 0
    t = torch.where(t >= 1 << 31, t - (1 << 32), t).to(torch.int32)
    lines = st.analyse(t, 2)
    steps = range(2, st.TRACE_STEPS - 1)   # the first two left out; the last has no next step
    even = sum(1 for s in steps if s % 2 == 0)
    expect = {"issue": (100, len(steps)), "landed": (200, even), "reduce": (1000, even),
              "row statistic": (2000, even), "normalize": (700, len(steps)), "step": (5000, len(steps))}
    for key, (value, count) in expect.items():
        line = next(x for x in lines if key in x)
        assert int(re.search(r" (\d+) \(", line).group(1)) == value, line
        assert f"{3 * count} readings" in line, line
