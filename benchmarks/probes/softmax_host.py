"""Probe: is a softmax call's timing bound by the host (Python and launches) rather than the GPU?

``triton.testing.do_bench`` records its start event after clearing the L2 and then runs the call's
Python: where the host takes longer to queue the call than the GPU takes to run it, the GPU idles
inside the timed region and the median measures the host. For each case (dir:dtype:N, M = 2^28 / N)
and each callable (the library's whole call; for rows past the staged kernel's capacity also the
held path's staged launch alone), this prints, per process:

- host: microseconds of Python per call while the GPU is kept busy (a long ``torch.cuda._sleep``
  first, so nothing waits on the GPU);
- do_bench: its median (ms), as the benchmarks time;
- queued: the GPU's own time (ms, median), each call queued behind a 1 ms sleep so the host is
  always ahead of the GPU;
- graph: a CUDA graph of the call, replayed (ms, median), where the call can be captured.

Run on a GPU:  python3 benchmarks/probes/softmax_host.py [--cases fwd:bf16:16777216,...] [--reps 40]
               [--profile]    (the hottest host functions of each library call, under cProfile)
               [--breakdown]  (host us of each step of the held path, one at a time)
               [--launcher both]  (each call with the library's launch cache off, then on, in turn)
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from host_overhead import hottest_functions  # same folder
from softmax_held import parts
from softmax_staged import DTYPES, bench

from ringsoftmax.kernels import launcher
from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F
from ringsoftmax.kernels import softmax_held as H
from ringsoftmax.kernels import softmax_staged as S
from ringsoftmax.kernels.plan_memo import memo


def sleep_cycles(ms: float) -> int:
    return int(ms * 1e-3 * torch.cuda.get_device_properties(0).clock_rate * 1e3)


def host_us(fn, calls: int = 30, sleep_ms: float = 400) -> float:
    """Microseconds of host time per call over ``calls`` calls, the GPU held busy behind a sleep of ``sleep_ms``
    meanwhile (so that no call waits on it)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles(sleep_ms))
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / calls * 1e6


def queued_ms(fn, reps: int) -> float:
    """Median GPU milliseconds of fn with the L2 cleared and a 1 ms sleep queued before each call."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    cycles = sleep_cycles(1.0)
    torch.cuda.synchronize()
    for s, e in zip(starts, ends):
        flush.zero_()
        torch.cuda._sleep(cycles)
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def graph_ms(fn, reps: int):
    """Median milliseconds of a CUDA graph of fn, replayed (L2 cleared in between), or the error."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except Exception as e:  # noqa: BLE001 - report, not raise
        return f"({type(e).__name__})"
    return f"{bench(graph.replay):.3f}"


def cpu_place() -> str:
    """The CPU this process runs on now, its NUMA node, and the CPUs it may run on."""
    try:
        with open("/proc/self/stat") as f:
            cpu = int(f.read().rsplit(")", 1)[1].split()[36])
        node = [d for d in os.listdir(f"/sys/devices/system/cpu/cpu{cpu}") if d.startswith("node")]
        return f"cpu {cpu} ({','.join(node) or 'no node'}), allowed {len(os.sched_getaffinity(0))}"
    except Exception as e:  # noqa: BLE001
        return f"unknown ({e})"


def breakdown(direction, a, b) -> dict:
    """name -> host us per call of each step the held path takes on rows a, b, one at a time (its
    columns as the library's rule would cut them, also where the library takes the two-pass path)."""
    m, n = a.shape
    out = torch.empty_like(b)
    lse = torch.empty(m, device="cuda")
    config = S.launch_config(direction, a, b)
    keep = (H.HELD_MIN_SHARE, H.HELD_MIN_BYTES)
    H.HELD_MIN_SHARE, H.HELD_MIN_BYTES = dict.fromkeys(H.HELD_MIN_SHARE, 0.0), 0
    held = H.held_width(direction, a, b, out, config)
    H.HELD_MIN_SHARE, H.HELD_MIN_BYTES = keep
    views = (a[:, :held], b[:, :held], out[:, :held])
    stats = torch.empty((5, m), device="cuda")
    prior = stats[1:]
    grid, claim, q, consts, warps = S._launch_plan(direction, *views, lse, config, prior)
    words = torch.full((m * q + 1,), S.PENDING_WORD, dtype=torch.int64, device="cuda")
    args = S._kernel_args(*views, lse, prior, consts, words, q)
    steps = {
        "torch.empty (M, N)": lambda: torch.empty((m, n), dtype=b.dtype, device="cuda"),
        "staged refusal": lambda: F.staged_fits(direction, a, b, out) and F.staged_launch(direction, a, b, out, lse),
        "launch_config": lambda: S.launch_config(direction, a, b),
        "held_width (unmemoized)": lambda: H.held_width(direction, a, b, out, config),
        "_launch_plan (unmemoized)": lambda: S._launch_plan(direction, *views, lse, config, prior),
        "_kernel_args": lambda: S._kernel_args(*views, lse, prior, consts, words, q),
        "torch.full (words)": lambda: torch.full((m * q + 1,), S.PENDING_WORD, dtype=torch.int64, device="cuda"),
        "staged kernel launch": lambda: S._staged_kernel[(grid,)](*args, **consts, CLAIM=claim, num_warps=warps),
        "S.launch (held)": lambda: S.launch(direction, *views, lse, config, prior),
        "memo hit (the launch's plan)": lambda: memo("launch", views, (direction, config, False), None, S.plan_knobs()),
    }
    if direction == "fwd":
        steps["_two_pass_stats"] = lambda: F._two_pass_stats(a[:, held:], out=stats[:3])
        steps["_normalize_into"] = lambda: F._normalize_into(a[:, held:], out[:, held:], stats[3], stats[4])
        steps["softmax_fwd (whole)"] = lambda: F.softmax_fwd(a, with_lse=True)
    else:
        steps["_two_pass_dot"] = lambda: B._two_pass_dot(a[:, held:], b[:, held:], out=stats[1])
        steps["_elementwise"] = lambda: B._elementwise(a[:, held:], b[:, held:], out[:, held:], stats[3])
        steps["softmax_bwd (whole)"] = lambda: B.softmax_bwd(a, b)
    result = {}
    for name, fn in steps.items():
        if fn is not None:
            fn()
            result[name] = min(host_us(fn) for _ in range(3))
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="fwd:bf16:16777216,fwd:fp32:8388608,bwd:fp32:4194304,fwd:fp32:4194304")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--held", default="on", help="on: the held path on for every key; library: as shipped")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--launcher", default="on", choices=("on", "off", "both"),
                    help="the library's launch cache (launcher.ENABLED); both: each call off then on")
    args = ap.parse_args()
    if args.held == "on":
        H.HELD_MIN_SHARE, H.HELD_MIN_BYTES = dict.fromkeys(H.HELD_MIN_SHARE, 0.0), 0
    print(f"pid {os.getpid()}: {cpu_place()}; {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    print("dir | dtype | N | call | host us/call | do_bench ms | queued ms | graph ms | do_bench / queued")
    for case in args.cases.split(","):
        direction, dname, n = case.split(":")
        run_case(direction, dname, int(n), args)
        torch.cuda.empty_cache()


def run_case(direction: str, dname: str, n: int, args) -> None:
    m = max(1, (1 << 28) // n)
    dtype = DTYPES[dname]
    x = torch.randn(m, n, device="cuda").mul_(3)
    a = x.to(dtype) if direction == "fwd" else torch.softmax(x, -1).to(dtype)
    b = a if direction == "fwd" else torch.randn_like(a)
    del x
    calls = {"library": (lambda: F.softmax_fwd(a, with_lse=True)) if direction == "fwd"
             else (lambda: B.softmax_bwd(a, b))}
    held, pieces = parts(direction, a, b, H.HELD_FILL[direction])
    if held:
        calls["held, staged launch"] = pieces["held, staged"][0]
    modes = {"on": (True,), "off": (False,), "both": (False, True)}[args.launcher]
    for (name, fn), enabled in ((c, e) for c in calls.items() for e in modes):
        launcher.ENABLED = enabled
        label = name + ("" if args.launcher != "both" else ", cached launches" if enabled else ", Triton launches")
        fn()
        h = host_us(fn)
        d = bench(fn)
        q = queued_ms(fn, args.reps)
        g = graph_ms(fn, args.reps)
        print(f"{direction} | {dname} | {n} | {label} | {h:.0f} | {d:.3f} | {q:.3f} | {g} | {d / q:.2f}", flush=True)
        if args.profile and name == "library":
            print(hottest_functions(fn, 30, 12), flush=True)
    launcher.ENABLED = True
    if args.breakdown and held:
        for name, us in breakdown(direction, a, b).items():
            print(f"  host step | {direction} | {dname} | {n} | {name} | {us:.1f} us", flush=True)
    print(f"waits given up so far: {F.sync_failures('cuda')}", flush=True)


if __name__ == "__main__":
    main()
