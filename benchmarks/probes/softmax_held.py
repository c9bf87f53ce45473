"""Probe: where the held path's time goes (``ringsoftmax/kernels/softmax_held.py``), part by part.

For rows of N elements (M = 2^28 / N), with the held columns at ``--fills`` shares of the staged
kernel's capacity, times in turn for ``--rounds`` rounds (medians): the whole held path, the
two-pass path, and each part alone: the streamed columns' statistic, the staged launch on the held
columns (with that statistic as its prior), the same launch on a contiguous copy of the held
columns (row stride = the held width), and the streamed columns' second pass. Each part's GB/s
counts its own traffic; % is of a device-to-device copy.

Run on a GPU:  python3 benchmarks/probes/softmax_held.py [--cases fwd:bf16:16777216,bwd:fp32:4194304]
               [--fills 1.0,0.9] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from softmax_staged import DTYPES, bench, copy_gbs  # same folder: the staged probe's helpers
from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F
from ringsoftmax.kernels import softmax_held as H
from ringsoftmax.kernels import softmax_staged as S


def parts(direction: str, a, b, fill: float) -> tuple[int, dict]:
    """(held columns, name -> (callable, bytes moved)) for rows a, b at this fill."""
    m, n = a.shape
    out = torch.empty_like(b)
    lse = torch.empty(m, device="cuda")
    config = S.launch_config(direction, a, b)
    keep = (H.HELD_MIN_SHARE, H.HELD_FILL, H.HELD_MIN_BYTES)
    H.HELD_MIN_SHARE, H.HELD_FILL = dict.fromkeys(H.HELD_MIN_SHARE, 0.0), {"fwd": fill, "bwd": fill}
    H.HELD_MIN_BYTES = 0
    held = H.held_width(direction, a, b, out, config)
    H.HELD_MIN_SHARE, H.HELD_FILL, H.HELD_MIN_BYTES = keep
    stats = torch.empty((5, m), device="cuda")
    prior = stats[1:]
    ea, eb = a.element_size(), b.element_size()
    rest = n - held
    held_copy = [t[:, :held].contiguous() for t in (a, b)]
    out_copy = torch.empty_like(held_copy[1])
    if direction == "fwd":
        first = (lambda: F._two_pass_stats(a[:, held:], out=stats[:3]), m * rest * ea)
        second = (lambda: F._normalize_into(a[:, held:], out[:, held:], prior[2], prior[3]), 2 * m * rest * ea)
        staged_bytes = 2 * m * held * ea
    else:
        first = (lambda: B._two_pass_dot(a[:, held:], b[:, held:], out=stats[1]), m * rest * (ea + eb))
        second = (lambda: B._elementwise(a[:, held:], b[:, held:], out[:, held:], prior[2]), 2 * m * rest * (ea + eb))
        staged_bytes = m * held * (ea + eb + eb)
    first[0]()

    def staged(views):
        # the prior's inputs (rows 0-1) are not changed by the launch: every call sees the same
        return lambda: S.launch(direction, *views, lse if direction == "fwd" else None, config, prior)

    views = (a[:, :held], b[:, :held], out[:, :held])
    copies = (held_copy[0], held_copy[1] if direction == "bwd" else held_copy[0], out_copy)

    def whole(min_share):
        def run():
            H.HELD_MIN_SHARE, H.HELD_FILL, H.HELD_MIN_BYTES = min_share, {"fwd": fill, "bwd": fill}, 0
            if direction == "fwd":
                return F.softmax_fwd(a, with_lse=False)
            return B.softmax_bwd(a, b)
        return run

    total = 2 * m * n * ea if direction == "fwd" else m * n * (ea + 2 * eb)
    return held, {"held path": (whole(dict.fromkeys(H.HELD_MIN_SHARE, 0.0)), total),
                  "two-pass": (whole(dict.fromkeys(H.HELD_MIN_SHARE)), total),
                  "streamed, 1st pass": first, "held, staged": (staged(views), staged_bytes),
                  "held, staged (contiguous copy)": (staged(copies), staged_bytes),
                  "streamed, 2nd pass": second}


def sm_clock() -> int:
    """The SM clock now (MHz), 0 where NVML is not there."""
    try:
        return torch.cuda.clock_rate()
    except Exception:  # noqa: BLE001 - pynvml missing or not supported
        return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="fwd:bf16:16777216,fwd:fp32:8388608,bwd:fp32:4194304")
    ap.add_argument("--fills", default="1.0,0.9")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    copy = copy_gbs()
    keep = (H.HELD_MIN_SHARE, H.HELD_FILL, H.HELD_MIN_BYTES)
    print(f"copy {copy:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__}")
    print("dir | dtype | N | M | fill | held columns | part | ms, median (range, p90 of the rounds) | "
          "GB/s (its own bytes) | % copy")
    for case in args.cases.split(","):
        direction, dname, n = case.split(":")
        n = int(n)
        m = max(1, (1 << 28) // n)
        dtype = DTYPES[dname]
        x = torch.randn(m, n, device="cuda").mul_(3)
        a = x.to(dtype) if direction == "fwd" else torch.softmax(x, -1).to(dtype)
        b = a if direction == "fwd" else torch.randn_like(a)
        for fill in map(float, args.fills.split(",")):
            held, calls = parts(direction, a, b, fill)
            for f, _ in calls.values():
                f()
            times = {k: [] for k in calls}
            clocks = []
            for _ in range(args.rounds):
                for k, (f, _) in calls.items():
                    times[k].append(bench(f))
                    clocks.append(sm_clock())
            if any(clocks):
                print(f"SM clock after each timing: {min(clocks)}-{max(clocks)} MHz", flush=True)
            for k, (_, nbytes) in calls.items():
                t = statistics.median(times[k])
                g = nbytes / t / 1e6
                ts = sorted(times[k])
                spread = f"{ts[0]:.3f}-{ts[-1]:.3f}, p90 {ts[int(0.9 * (len(ts) - 1))]:.3f}"
                print(f"{direction} | {dname} | {n} | {m} | {fill} | {held} | {k} | {t:.3f} ({spread}) | {g:.0f} | "
                      f"{100 * g / copy:.1f}", flush=True)
            H.HELD_MIN_SHARE, H.HELD_FILL, H.HELD_MIN_BYTES = keep
        print(f"waits given up so far: {F.sync_failures('cuda')}", flush=True)
        del x, a, b
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
