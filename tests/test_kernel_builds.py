"""The GPU kernels' builds for sm_90, compiled on the CPU: none spills more than it is known to.

A spill in the staged kernel's steps cost up to 60 points of copy and went unseen for seven sessions
(bf16 backward 1M-2M, session 41): no CPU test ran the kernel, and the GPU tests check values only.
``benchmarks/probes/sm90_builds.py --check`` compiles every build the staged kernel's config tables,
the Gluon attention kernels' tiles and the rows kernels' launches ask for with the installed triton and
its ptxas and flags (triton's own ``make_cubin``; no GPU: a stand-in driver names the target) and fails
where one spills more than its
``KNOWN_SPILLS`` entry for this triton release (none listed: nothing).
"""
import os
import pathlib
import subprocess
import sys

import pytest

PROBE = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "probes" / "sm90_builds.py"


def _has_gluon() -> bool:
    try:
        from triton.experimental import gluon  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _has_gluon(), reason="the staged kernel is Gluon (triton >= 3.5)")
def test_sm90_builds_spill_no_more_than_known():
    # (fusion off by default, as triton 3.10 will have it: the launches pin it on, COMPILE_OPTIONS)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "0"}
    run = subprocess.run([sys.executable, str(PROBE), "--check", "--jobs", str(min(4, os.cpu_count() or 1))],
                         capture_output=True, text=True, env=env, timeout=1800)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " distinct builds of " in run.stdout, run.stdout[-2000:]


def test_sm90_builds_cover_the_tables():
    """Every config of the tables is built (as loaded by TMA and by cp.async where it takes both), as every
    GPU model takes the tables, with the fixed units of the lag-1 rings, the priors of the held path and the
    merging partitions."""
    sys.path.insert(0, str(PROBE.parent))
    try:
        import sm90_builds as B
    finally:
        sys.path.remove(str(PROBE.parent))
    from ringsoftmax.kernels import softmax_staged as S

    specs = B.table_builds()
    built = {(d, e, c, tma, shifted) for d, e, _, c, tma, shifted, _, _ in specs}
    tables = [(table, shifted) for gpu in (None, *S.STAGED_CONFIG_GPU)  # (as each GPU model takes them)
              for table, shifted in zip(S.gpu_tables(gpu), (False, True))]
    assert len(tables) > 2  # (some model has entries of its own)
    for table, shifted in tables:
        for (direction, elem), entries in table.items():
            for i, (_, entry) in enumerate(entries):
                for config in S.alternatives(entry) if entry is not None else []:
                    lo, hi = B._range_ends(entries, i, S.STAGED_MIN_N[direction, elem], direction, elem, config)
                    if hi < lo:  # (below the rows the staged kernel takes, or past what one launch holds)
                        continue
                    if shifted or not S.tma_only(direction, elem, config):
                        assert (direction, elem, config, False, shifted) in built, (direction, elem, config)
                    if config[5] and not shifted:
                        assert (direction, elem, config, True, False) in built, (direction, elem, config)
    for (direction, elem, *_, shifted), fallbacks in S.SPILL_FALLBACKS.items():
        for fallback in fallbacks:
            assert (direction, elem, fallback, False, shifted) in built, fallback
    assert any(not claim for *_, claim, _ in specs) and any(prior for *_, prior in specs)
    assert any(spec[3][4] >= 5 and B._launch_constexprs(spec)[0]["MERGE_WARPS"] for spec in specs)
    rows = B.rows_builds()
    for direction in ("rows fwd", "rows bwd"):
        for dtype in ("float32", "bfloat16"):
            lengths = {n for d, t, _, n in rows if (d, t) == (direction, dtype)}
            assert {1, 1000, 4097, 32768} <= lengths, (direction, dtype)
    # the rows kernels' launches pass the compile options every launch passes (FMA contraction pinned)
    from ringsoftmax.kernels.compile_options import COMPILE_OPTIONS
    for spec in (("rows fwd", "bfloat16", 4, 4097), ("rows bwd", "float32", 4, 1000)):
        assert COMPILE_OPTIONS.items() <= B._rows_launch(spec)[2].items(), spec
