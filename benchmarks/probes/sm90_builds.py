"""Compile the softmax and attention kernels' builds for sm_90 without a GPU: registers, spill, instructions.

Every config the tables (``softmax_staged.STAGED_CONFIG``, ``_SHIFTED``, ``_WHOLE``, and as GPU models take
them, ``_GPU``) give some row,
in each build a launch of it can take: loads by TMA and by cp.async (where the config is not
``tma_only``), rows 16-byte aligned or not (ALIGN), units claimed or fixed (lag 1), a merging
partition or none (``MERGE_PARTITIONS``, by row length), with a prior (the held path, the tables'
last entries); the Gluon attention kernels' tiles (forward ``TILES``, ``SPLIT_TILE``; dK/dV
``CONFIG``, causal or not, accumulating or not); and the Triton rows kernels' launches (forward and
backward, float32 and bf16) on rows of every length they take (``ROWS_LENGTHS``). Each is built for
an sm_90 target by the installed triton, as a launch would build it, and its PTX assembled again by
triton's own ``make_cubin`` (its ptxas and flags) for ptxas's report: registers per thread, stack frame and spill-store bytes, SASS
instructions (nvdisasm), and where any spill is, by source line. A spill cost up to 60 points of
copy in the staged kernel (session 41: bf16 backward 1M-2M at 40% for seven sessions, unseen:
112-128 bytes of spill stores); ``--check`` exits 1 where a build spills more than ``KNOWN_SPILLS``
lists for the installed triton release, and the CPU tests run it (``tests/test_kernel_builds.py``).

    python benchmarks/probes/sm90_builds.py [--check] [--jobs 2] [--only fwd/2|attention|rows]

No GPU needed (a stand-in driver names the target); builds go to triton's cache, so a second run
takes seconds. The builds depend on triton's release: the GPU machines' 3.6 and a fresh install's
3.9 differ (run it with both). Row lengths are planned for an H100 / H200 (``SMS``).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

DTYPES = {2: "bfloat16", 4: "float32"}
#: The GPU the row lengths are planned for: an H100's / H200's multiprocessors and shared memory per
#: multiprocessor (bytes).
SMS, SHARED_PER_SM = 132, 233472


def _longest(direction: str, elem: int, config) -> int:
    """The longest row one launch of ``config`` takes on that GPU (``softmax_staged.longest_row``)."""
    from ringsoftmax.kernels import softmax_staged as S

    return S.longest_row(direction, elem, config, SMS, SHARED_PER_SM)


def _range_ends(entries, i: int, floor: int, direction: str, elem: int, config) -> tuple[int, int]:
    """(shortest, longest) row that ``config`` of ``entries[i]`` (a table's (shortest row, config)
    list) takes in one launch: from its shortest row, at least ``floor``, to the next longer entry's
    or the longest one launch of it takes (``_longest``); longest < shortest where it takes none."""
    lo = max(entries[i][0], floor)
    later = [s for s, _ in entries[i + 1:] if s > entries[i][0]]
    return lo, min(later[0] - 1 if later else 1 << 40, _longest(direction, elem, config))


def _lengths(lo: int, hi: int, key, shifted: bool) -> list[int]:
    """Row lengths in [lo, hi] that reach each build a config has there: both ends, and about the
    merging partition's limits (``MERGE_PARTITIONS``); aligned rows a multiple of 256 (so TMA boxes
    are as wide as they go), shifted rows odd."""
    from ringsoftmax.kernels import softmax_staged as S

    marks = {lo, hi}
    if key in S.MERGE_PARTITIONS:
        longest, waiting = S.MERGE_PARTITIONS[key][3:]
        marks |= {x for x in (waiting, longest, longest + 256) if lo <= x <= hi}
    if shifted:
        return sorted({x | 1 for x in marks})
    return sorted({-(-x // 256) * 256 if x // 256 * 256 < lo else x // 256 * 256 for x in marks})


def table_builds(only: str | None = None) -> list[tuple]:
    """(direction, elem, n, config, tma, shifted, claim, prior) of every build the tables ask for, as every GPU
    model takes them (the tables, and with each model's ``STAGED_CONFIG_GPU`` entries), each build once."""
    from ringsoftmax.kernels import softmax_staged as S

    builds = []
    for gpu in (None, *S.STAGED_CONFIG_GPU):
        builds += _gpu_table_builds(gpu, only)
    return list(dict.fromkeys(builds))


def _gpu_table_builds(gpu: str | None, only: str | None) -> list[tuple]:
    """``table_builds`` of the tables as GPU model ``gpu`` takes them (``softmax_staged.gpu_tables``)."""
    from ringsoftmax.kernels import softmax_staged as S

    builds = []
    main, shifted_table = S.gpu_tables(gpu)
    tables = ((main, False), (S.STAGED_CONFIG_WHOLE, False), (shifted_table, True))
    for table, shifted in tables:
        for (direction, elem), entries in table.items():
            if only and only != f"{direction}/{elem}":
                continue
            for i, (_, entry) in enumerate(entries):
                if entry is None:
                    continue
                last = i == len(entries) - 1 and table is not S.STAGED_CONFIG_WHOLE
                for config in S.alternatives(entry):
                    lo, hi = _range_ends(entries, i, S.STAGED_MIN_N[direction, elem], direction, elem, config)
                    if hi < lo:
                        continue
                    key = (direction, elem, tuple(config[:5]))
                    loads = [False] if shifted else ([True] if config[5] else []) + (
                        [] if S.tma_only(direction, elem, config) else [False])
                    for n in _lengths(lo, hi, key, shifted):
                        for tma in loads:
                            for claim in _claims(config):
                                for prior in ([False, True] if last else [False]):
                                    builds.append((direction, elem, n, tuple(config), tma, shifted, claim, prior))
                        builds += _fallback_builds(direction, elem, n, config, shifted, last)
    return builds + _shifted_gap_builds(main, shifted_table, only)


def _claims(config) -> list[bool]:
    """Unit choices a launch of ``config`` may build: claimed, and for lag-1 rings fixed units too."""
    return [True, False] if config[4] == 1 else [True]


def _shifted_gap_builds(main_table: dict, shifted_table: dict, only: str | None) -> list[tuple]:
    """Builds of shifted rows where the shifted table (``STAGED_CONFIG_SHIFTED`` as a GPU takes it) has no
    config (its None entries): those rows take the main table's configs that are not ``tma_only``, by
    cp.async, shifted."""
    from ringsoftmax.kernels import softmax_staged as S

    builds = []
    for (direction, elem), shifted_entries in shifted_table.items():
        if only and only != f"{direction}/{elem}":
            continue
        main = [(s, c) for s, c in main_table[direction, elem] if not S.tma_only(direction, elem, c)]
        for i, (start, entry) in enumerate(shifted_entries):
            if entry is not None:
                continue
            end = shifted_entries[i + 1][0] - 1 if i + 1 < len(shifted_entries) else 1 << 40
            for j, (_, config) in enumerate(main):
                lo, hi = _range_ends(main, j, max(start, S.STAGED_MIN_N[direction, elem]), direction, elem, config)
                hi = min(hi, end)
                for n in _lengths(lo, hi, (direction, elem, tuple(config[:5])), True) if hi >= lo else []:
                    for claim in _claims(config):
                        builds.append((direction, elem, n, tuple(config), False, True, claim, False))
                    builds += _fallback_builds(direction, elem, n, config, True, False)
    return builds


def _fallback_builds(direction: str, elem: int, n: int, config, shifted: bool, last: bool) -> list[tuple]:
    """Builds of the configs that replace ``config`` on rows of ``n`` where its build spills
    (``SPILL_FALLBACKS``: by cp.async; with a prior too where ``config`` is its table's ``last``, whose
    launches the held path makes: ``softmax_staged.held_config``)."""
    from ringsoftmax.kernels import softmax_staged as S

    return [(direction, elem, n, tuple(fallback), False, shifted, claim, prior)
            for fallback in S.SPILL_FALLBACKS.get((direction, elem, *config[:5], shifted), ())
            for claim in _claims(fallback) for prior in ([False, True] if last else [False])]


def attention_builds() -> list[tuple]:
    """("attn fwd", head dim, causal, tile) of the Gluon attention forward's tiles (``TILES``, and
    ``SPLIT_TILE`` where a launch may split) and ("attn dkdv", head dim, causal, accumulate, config)
    of the Gluon backward's (``CONFIG``), bf16."""
    from ringsoftmax.kernels import attention_bwd_gluon as BG, attention_fwd_gluon as FG

    builds = []
    for (d, causal), tile in FG.TILES.items():
        builds.append(("attn fwd", d, causal, tuple(tile)))
        if not causal and tuple(FG.SPLIT_TILE) != tuple(tile):
            builds.append(("attn fwd", d, causal, tuple(FG.SPLIT_TILE)))
    for d, config in BG.CONFIG.items():
        for causal in (False, True):
            for accumulate in (False, True):
                builds.append(("attn dkdv", d, causal, accumulate, tuple(config)))
    return builds


#: Row lengths the rows kernels' builds are collected on (``rows_builds``): every power of two, one past
#: it and odd lengths between, up to the rows kernels' longest rows (``ROWS_MAX_N``).
ROWS_LENGTHS = sorted({1, 2, 3, 7, 100, 127, 1000, 3000, 6000, 12000, 24000, 32000, 50000}
                      | {1 << k for k in range(1, 17)} | {(1 << k) + 1 for k in range(1, 16)})


class _Launches:
    """Stands in for a Triton kernel: ``kernel[grid](*args, **kwargs)`` records the launch instead."""

    def __init__(self, kernel, sink: list):
        self.kernel, self.sink = kernel, sink

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.sink.append((self.kernel, args, kwargs))


def rows_builds(only: str | None = None) -> list[tuple]:
    """("rows fwd" / "rows bwd", dtype, M, N) of the rows kernels' launches (``softmax_fwd._rows``,
    ``softmax_bwd._rows``) on contiguous rows of each ``ROWS_LENGTHS`` length they take
    (``softmax_fwd.rows_fit``), many rows (2^28 elements) and 7, float32 and bf16."""
    import torch

    from ringsoftmax.kernels import softmax_bwd as B, softmax_fwd as F

    builds = []
    for direction in ("fwd", "bwd"):
        if only and only not in ("rows", f"rows {direction}"):
            continue
        for elem, dtype in DTYPES.items():
            limit = F.ROWS_MAX_N[elem] if direction == "fwd" else B.BWD_ROWS_MAX_N
            for n in ROWS_LENGTHS:
                a = torch.empty((2, n), dtype=getattr(torch, dtype), device="meta")
                if F.rows_fit(limit, a, a, direction=direction) is None:
                    continue
                for m in sorted({max(1, (1 << 28) // n), 7}):
                    builds.append((f"rows {direction}", dtype, m, n))
    return builds


def _rows_launch(spec: tuple):
    """(kernel, args, kwargs) of the rows kernel's launch on ``spec``'s meta tensors."""
    import torch

    from ringsoftmax.kernels import softmax_bwd as B, softmax_fwd as F

    direction, dtype, m, n = spec
    a = torch.empty((m, n), dtype=getattr(torch, dtype), device="meta")
    out = torch.empty_like(a)
    stats = torch.empty(m, dtype=torch.float32, device="meta")
    sink = []
    module, name = (F, "_softmax_rows_kernel") if direction == "rows fwd" else (B, "_bwd_rows_kernel")
    kernel = getattr(module, name)
    setattr(module, name, _Launches(kernel, sink))
    try:
        if direction == "rows fwd":
            F._rows(F.rows_plan(a, out, True), a, out, stats, stats, stats)
        else:
            B._rows(B.rows_plan(a, a, out), a, a, out, None)
    finally:
        setattr(module, name, kernel)
    return sink[0]


def _fake_sm90_driver():
    """Point triton's active driver at an sm_90 target with no device (compiles only)."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    class Sm90:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_active_torch_device(self):
            return torch.device("cpu")

    driver.set_active(Sm90())


def _launch_constexprs(spec: tuple) -> tuple[dict, int, list]:
    """(constexprs but CLAIM, num_warps, kernel arguments) of a launch of ``spec`` on meta tensors."""
    import torch

    from ringsoftmax.kernels import softmax_staged as S

    direction, elem, n, config, tma, shifted, claim, prior = spec
    m = 64
    a = torch.empty((m, n), dtype=getattr(torch, DTYPES[elem]), device="meta")
    out = torch.empty_like(a)
    consts, warps = S._constexprs(direction, a, a, out, config, prior)
    if tma:  # (meta tensors take no TMA; the launch gives aligned rows this width on sm_90)
        consts.update(TMA_LOAD=True, TMA_W=S.box_width(n, S.sub_tile(config[0]), elem), ALIGN=1)
        assert consts["TMA_W"], spec
    q = S.cdiv(n + consts["ALIGN"] - 1, config[0])
    stand_in = torch.empty(1, dtype=torch.int32, device="meta")
    args = S._kernel_args(a, a, out, torch.empty(m, device="meta"), torch.empty((4, m), device="meta") if prior
                          else None, consts, torch.empty(m * q + 1, dtype=torch.int64, device="meta"), q)
    args[7] = stand_in  # (the error counter)
    if not prior:
        args[8] = stand_in
    return consts, warps, args


def distinct(specs: list) -> list[tuple]:
    """(spec, constexprs) of the distinct builds among ``specs`` (row lengths often compile the same kernel)."""
    seen, out = set(), []
    for spec in specs:
        if spec[0].startswith("attn"):
            out.append((spec, {}))
            continue
        if spec[0].startswith("rows"):
            kernel, args, kwargs = _rows_launch(spec)
            key = (spec[0], spec[1], tuple(sorted(kwargs.items())),
                   tuple((a % 16 == 0, a == 1) for a in args if isinstance(a, int)))
            if key not in seen:
                seen.add(key)
                out.append((spec, kwargs))
            continue
        consts, warps, _ = _launch_constexprs(spec)
        key = (spec[1], spec[6], warps, tuple(sorted(consts.items())))
        if key not in seen:
            seen.add(key)
            out.append((spec, consts))
    return out


def build(spec: tuple) -> tuple[int, int, int, int]:
    """Compile one build (``table_builds``'s tuple) for sm_90 and assemble its PTX again through triton's own
    ``make_cubin`` (the ptxas and flags a launch uses: triton >= 3.9 adds ``--regAllocOptLevel=2``, which
    changes where ptxas spills): (registers, stack frame bytes, spill stores bytes, SASS instructions,
    where the spills are)."""
    import triton

    from ringsoftmax.kernels.compile_options import COMPILE_OPTIONS
    from ringsoftmax.kernels import softmax_staged as S

    _fake_sm90_driver()
    if spec[0].startswith("attn"):
        kernel = _attention_kernel(spec)
    elif spec[0].startswith("rows"):
        rows_kernel, args, kwargs = _rows_launch(spec)
        kernel = rows_kernel.warmup(*args, **kwargs, grid=(1,))
    else:
        consts, warps, args = _launch_constexprs(spec)
        kernel = S._staged_kernel.warmup(*args, **consts, CLAIM=spec[6], num_warps=warps, grid=(1,), **COMPILE_OPTIONS)
    report, cubin = _assemble(kernel)
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-g", "-c", path], capture_output=True, text=True,
                              check=True).stdout
    frame, stores = (int(v) for v in re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", report).groups())
    regs = int(re.search(r"Used (\d+) registers", report).group(1))
    return regs, frame, stores, len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/", sass, re.M)), _local_lines(sass)


def _assemble(kernel) -> tuple[str, bytes]:
    """(ptxas's report, cubin) of a compiled kernel's PTX, assembled by triton's backend with the kernel's
    options, as its compile did (the report is what ptxas wrote to the log file triton hands it)."""
    import triton.backends.nvidia.compiler as nvidia
    from triton.backends.compiler import GPUTarget

    backend = nvidia.CUDABackend(GPUTarget("cuda", 90, 32))
    # (a warp-specialized kernel's num_warps counts its partitions' warps: not a power of two; ptxas's flags
    # do not depend on it)
    options = backend.parse_options({k: v for k, v in kernel.metadata._asdict().items() if k != "num_warps"})
    logs = []
    run = nvidia.subprocess.run

    def spy(cmd, *args, **kwargs):
        done = run(cmd, *args, **kwargs)
        if "-v" in cmd and kwargs.get("stderr") is not None:
            with open(kwargs["stderr"].name) as f:
                logs.append(f.read())
        return done

    nvidia.subprocess.run = spy
    try:
        cubin = backend.make_cubin(kernel.asm["ptx"], {}, options, 90)
    finally:
        nvidia.subprocess.run = run
    assert len(logs) == 1, "triton's make_cubin no longer runs ptxas -v once with a log file"
    return logs[0], cubin


def _attention_kernel(spec: tuple):
    """Compile an ``attention_builds`` spec on (2, 1024, 4, D) bf16 meta tensors as its launcher would."""
    import torch

    from ringsoftmax.kernels import attention_bwd_gluon as BG, attention_fwd_gluon as FG
    from ringsoftmax.kernels.compile_options import COMPILE_OPTIONS

    d, causal = spec[1], spec[2]
    q = torch.empty((2, 1024, 4, d), dtype=torch.bfloat16, device="meta")
    rows = torch.empty((2, 4, 1024), dtype=torch.float32, device="meta")
    strides = [*q.stride()[:3]]
    if spec[0] == "attn fwd":
        tile = spec[3]
        unused = torch.empty(1, dtype=torch.int32, device="meta")
        return FG._gl_attn_fwd_ws_kernel.warmup(
            q, q, q, q, rows, unused, unused, unused, 1024, 1024, 2, 4, 1, *strides * 4, 1.0, 0, HEAD_DIM=d,
            BLOCK_M=tile[0], BLOCK_N=tile[1], STAGES=tile[2], CAUSAL=causal, CONSUMER_REGS=tile[3],
            PRODUCER_REGS=tile[4], num_warps=4, grid=(1,), **COMPILE_OPTIONS)
    accumulate, (block_m, stages, regs) = spec[3], spec[4]
    return BG._gl_attn_bwd_dkdv_kernel.warmup(
        q, q, q, q, rows, rows, q, q, 1024, 1024, 1024, 2, 4, 1, *strides * 6, 1.0, 1.0, 0, HEAD_DIM=d,
        BLOCK_M=block_m, STAGES=stages, CAUSAL=causal, ACCUMULATE=accumulate, CONSUMER_REGS=regs, num_warps=4,
        grid=(1,), **COMPILE_OPTIONS)


def _local_lines(sass: str) -> str:
    """Where a build's local-memory (spill) instructions are: 'STL 1111, LDL 466, ...', by the kernel
    source line of each (nvdisasm's line info; the line a helper is inlined from, not its call)."""
    line, out = "?", []
    for text in sass.splitlines():
        found = re.search(r'File "[^"]*/([^/"]+)", line (\d+)', text)
        if found:
            line = found.group(2) if found.group(1) == "softmax_staged.py" else f"{found.group(1)}:{found.group(2)}"
        op = re.search(r"\b(STL|LDL)(\.\w+)*\b", text)
        if op and "/*" in text:
            out.append(f"{op.group(1)} {line}")
    return ", ".join(out)


def build_key(spec, consts) -> str:
    """A build's name: what it compiles (not the row length, which changes only the words' block)."""
    from ringsoftmax.kernels.compile_options import COMPILE_OPTIONS

    if spec[0] == "attn fwd":
        return f"attention fwd D={spec[1]}{' causal' if spec[2] else ''} tile {'x'.join(map(str, spec[3]))}"
    if spec[0].startswith("rows"):
        # (the launch's compile options, the same on every launch, are left out of the name)
        return f"{spec[0]} {spec[1]} " + " ".join(f"{k}={v}" for k, v in sorted(consts.items())
                                                  if k not in COMPILE_OPTIONS)
    if spec[0] == "attn dkdv":
        return (f"attention dkdv D={spec[1]}{' causal' if spec[2] else ''}{' accumulate' if spec[3] else ''} "
                f"config {'x'.join(map(str, spec[4]))}")
    direction, elem, n, config, tma, shifted, claim, prior = spec
    chunk, warps, stages, ahead, lag = config[:5]
    return (f"{direction} {DTYPES[elem]} {chunk}x{warps} slots {stages} ahead {ahead} lag {lag} "
            f"{'tma' if tma else 'cp.async'}{' shifted' if shifted else ''}{' fixed' if not claim else ''}"
            f"{' prior' if prior else ''}{' merge' if consts.get('MERGE_WARPS') else ''}"
            f"{' waits' if consts.get('MERGE_WAITS') else ''}"
            f"{' maxnreg ' + str(consts['maxnreg']) if 'maxnreg' in consts else ''}")


#: ``build_key`` of the forward rows kernel's bf16 build of 65536 columns (EVEN: N a multiple of the tile).
ROWS_65536 = ("rows fwd bfloat16 ALIGN=1 BLOCK_M=1 BLOCK_N=65536 EDGES=False EVEN={e} FMA=False FTZ=False "
              "LOAD_EVICT= OFFS64=False STORE_LSE=True STORE_Y=True TAIL_N=0 num_warps=16")
#: ``build_key`` of the forward rows kernel's bf16 build of 16384 columns at maxnreg 64 (rows of 16K-32K).
ROWS_16384 = ("rows fwd bfloat16 ALIGN={align} BLOCK_M=1 BLOCK_N=16384 EDGES={edges} EVEN=False FMA=False FTZ=False "
              "LOAD_EVICT= OFFS64=False STORE_LSE=True STORE_Y=True TAIL_N={tail} maxnreg=64 num_warps=16")
#: Spills the builds may have, by triton release (major.minor) and ``build_key``: bytes of spill
#: stores (ptxas), and where they are. Every other build, and every build on other releases, must
#: spill nothing: a new spill fails ``--check`` until it is fixed or measured and listed here.
KNOWN_SPILLS = {
    "3.6": {
        # a row's words merged at maxnreg 128 (line ~721, once per row, not per element)
        "fwd bfloat16 8192x4 slots 7 ahead 1 lag 5 cp.async shifted merge maxnreg 128": 12,
        "fwd bfloat16 8192x4 slots 7 ahead 1 lag 6 cp.async shifted merge maxnreg 128": 12,
        # two loop-invariant scalars at 96 registers (stored once, loaded once a step)
        "bwd float32 4096x4 slots 3 ahead 1 lag 1 cp.async shifted": 8,
        # attention: the forward's 192-row tile at D=64 (128 registers a compute thread; +1.8 to +4.0%
        # over 128 rows at 2K-32K keys, H200, session 26), and the dK/dV kernel at D=128 (its per-step softmax tile;
        # known since session 21, when it measured 453-475 TFLOP/s full, 390-475 causal, H100, against
        # the Triton kernels' 435-456 / 367-454)
        "attention fwd D=64 tile 192x128x2x160x32": 56,
        "attention dkdv D=128 config 64x2x240": 20,
        "attention dkdv D=128 accumulate config 64x2x240": 28,
        "attention dkdv D=128 causal config 64x2x240": 192,
        "attention dkdv D=128 causal accumulate config 64x2x240": 200,
        # the forward rows kernel's 16-bit tile of 65536 columns (128 elements a thread at 16 warps): rows
        # past 32K take it only where the staged kernel does not run (no Gluon, or pointers off 16 bytes:
        # there only up to ROWS_MAX_N_ELEMENTWISE since session 42, where it lost to the split path)
        ROWS_65536.format(e=False): 268,
        ROWS_65536.format(e=True): 284,
        # rows of one element: 128 rows of a vector each per warp, their end-vector code (not timed)
        "rows fwd bfloat16 ALIGN=8 BLOCK_M=128 BLOCK_N=8 EDGES=True EVEN=False FMA=False FTZ=False LOAD_EVICT= "
        "OFFS64=False STORE_LSE=True STORE_Y=True TAIL_N=0 num_warps=1": 72,
    },
    "3.9": {
        # Triton 3.9 assembles with ptxas 13.4 and --regAllocOptLevel=2 (a workaround of triton's for a ptxas
        # 13 bug), and these builds spill where 3.6's do not. Measured on an H100 with 3.9 (sessions 43 and
        # 46), they cost 11-43 points of copy; where they spill, the launch takes the configs that
        # softmax_staged.SPILL_FALLBACKS gives (the measurements are there):
        "fwd bfloat16 16384x4 slots 3 ahead 1 lag 2 cp.async shifted": 532,
        "fwd bfloat16 8192x4 slots 3 ahead 1 lag 1 cp.async shifted maxnreg 128": 52,
        "bwd float32 4096x4 slots 3 ahead 2 lag 2 cp.async": 8,
        "fwd bfloat16 8192x4 slots 4 ahead 1 lag 3 cp.async shifted maxnreg 168": 252,
        # not measured on 3.9: rings that hold a chunk in registers (255 registers) or run at a register cap
        "fwd float32 8192x4 slots 7 ahead 1 lag 7 tma": 4,
        "fwd float32 8192x4 slots 7 ahead 1 lag 7 tma prior": 4,
        "fwd bfloat16 8192x4 slots 3 ahead 1 lag 1 cp.async": 4,
        "fwd bfloat16 16384x4 slots 3 ahead 1 lag 2 cp.async": 20,
        "fwd bfloat16 8192x4 slots 7 ahead 1 lag 6 tma merge maxnreg 128": 80,
        "bwd float32 4096x4 slots 7 ahead 1 lag 7 tma prior merge maxnreg 248": 16,
        # (the LATE_CLAIM build, session 45: 16 bytes where it spilled none; on an H100 with 3.9, float32 backward
        # 2359552 / 2703360 ran 101.4% of copy with and without LATE_CLAIM, shifted rows of 2097153-4194305
        # within 0.4 points of it)
        "bwd float32 4096x4 slots 7 ahead 1 lag 7 tma merge maxnreg 248": 16,
        "bwd bfloat16 8192x4 slots 3 ahead 2 lag 2 cp.async": 64,
        "bwd bfloat16 16384x8 slots 3 ahead 2 lag 2 tma": 92,
        "fwd bfloat16 8192x4 slots 7 ahead 1 lag 5 cp.async shifted merge maxnreg 128": 180,
        "fwd bfloat16 8192x4 slots 7 ahead 1 lag 6 cp.async shifted merge maxnreg 128": 320,
        "fwd bfloat16 8192x4 slots 7 ahead 1 lag 7 cp.async shifted": 16,
        "bwd float32 4096x4 slots 7 ahead 1 lag 5 cp.async shifted": 4,
        "bwd float32 4096x4 slots 7 ahead 1 lag 6 cp.async shifted merge maxnreg 248": 4,
        "bwd float32 4096x4 slots 7 ahead 1 lag 7 cp.async shifted": 16,
        "bwd float32 4096x4 slots 7 ahead 1 lag 7 cp.async shifted prior": 60,
        # attention: as on 3.6, more bytes, and the forward at D=128 (not causal)
        "attention fwd D=64 tile 192x128x2x160x32": 348,
        "attention fwd D=128 tile 128x128x2x232x40": 68,
        "attention dkdv D=128 config 64x2x240": 108,
        "attention dkdv D=128 accumulate config 64x2x240": 112,
        "attention dkdv D=128 causal config 64x2x240": 380,
        "attention dkdv D=128 causal accumulate config 64x2x240": 388,
        # rows kernels: the 65536-column tile as on 3.6; 16-bit rows of 16K-32K at maxnreg 64 (not measured on 3.9)
        ROWS_65536.format(e=False): 276,
        ROWS_65536.format(e=True): 348,
        ROWS_16384.format(align=8, edges=True, tail=8): 4,
        ROWS_16384.format(align=1, edges=False, tail=8192): 32,
    },
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where a build spills more than KNOWN_SPILLS lists")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="builds compiled at once")
    parser.add_argument("--only", help="one staged table (fwd/2, fwd/4, bwd/2 or bwd/4), attention, rows, "
                        "rows fwd or rows bwd")
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    specs = (table_builds(args.only) + (attention_builds() if args.only in (None, "attention") else [])
             + rows_builds(args.only))
    builds = distinct(specs)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(build, [spec for spec, _ in builds]))
    print(f"triton {triton.__version__}, sm_90: {len(builds)} distinct builds of {len(specs)} in the tables")
    known = KNOWN_SPILLS.get(".".join(triton.__version__.split(".")[:2]), {})
    spills = []
    for (spec, consts), (regs, frame, stores, instrs, where) in zip(builds, results):
        key = build_key(spec, consts)
        rows = ("" if spec[0].startswith("attn") else f"N={spec[3]} M={spec[2]}" if spec[0].startswith("rows")
                else f"N={spec[2]}")
        line = f"{key:88s} {rows:11s} regs {regs:3d} frame {frame:3d} spill {stores:3d} instrs {instrs:5d}"
        print(line)
        if stores > known.get(key, 0):
            spills.append(f"{line}\n    at {where}")
    if spills:
        print(f"\n{len(spills)} builds spill more than KNOWN_SPILLS lists for triton {triton.__version__}:\n"
              + "\n".join(spills))
    return 1 if args.check and spills else 0

if __name__ == "__main__":
    sys.exit(main())
