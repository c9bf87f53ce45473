"""Probe: calls whose persistent waits gave up, per call, in rows that fill a deep ring (or the held path).

Run on a GPU:  python3 benchmarks/probes/staged_waits.py [--calls 24] [--spin 16] [--variant late=]
                   [--variant 'early=S.LATE_CLAIM = False'] [--cases bwd/bf16/6488064,...]

A staged program that waits too long for a row's partial words gives up after ``SPIN_MAX`` polls and
reads the row again from global memory: the result stays right, but such a call takes up to seconds
where it should take a millisecond (sessions 44-45: a program waiting on a unit it had claimed but not
taken). The default cases are rows at 0.96 and 1.0 of the lag-7 ring's capacity on an H100 / H200 and
the held path's rows, whose held columns fill the ring. For each case and variant (Python run with
``F``, ``B``, ``S`` for ``softmax_fwd``, ``softmax_bwd``, ``softmax_staged``, as in ``knobs.py``; the
knobs are restored after each) the probe times ``--calls`` calls one by one and prints the median and
slowest call, how many calls had waits that gave up (``F.sync_failures``) and how many waits gave up.
``--spin`` sets ``SPIN_MAX`` to 2^spin polls, so that a give-up costs milliseconds, not seconds.
"""
from __future__ import annotations

import argparse
import time

import torch
import triton

from knobs import knobs_set, snapshot  # same folder: the knobs probe's variants
from softmax_staged import DTYPES  # (and the staged probe's dtype names)
from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F

CASES = ("bwd/bf16/8388608,bwd/bf16/6225920,bwd/bf16/6488064,bwd/fp32/3244032,bwd/fp32/4194304,"
         "fwd/bf16/8388608,fwd/fp32/6488064")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=CASES, help="direction/dtype/N, comma-separated (M = 2^28 // N)")
    ap.add_argument("--calls", type=int, default=24)
    ap.add_argument("--spin", type=int, default=16, help="SPIN_MAX = 2^spin polls")
    ap.add_argument("--variant", action="append", default=[], help="name=statements (repeatable)")
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in (args.variant or ["lib="]))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"SPIN_MAX 2^{args.spin}, {args.calls} calls a case")
    F.SPIN_MAX = 1 << args.spin
    saved = snapshot()
    for case in args.cases.split(","):
        direction, dname, n = case.split("/")
        n = int(n)
        m = max(1, (1 << 28) // n)
        x = (torch.randn(m, n, device="cuda") * 3).to(DTYPES[dname])
        y, _ = F.softmax_fwd(x)
        dy = torch.randn(m, n, device="cuda").to(x.dtype)
        call = (lambda: B.softmax_bwd(y, dy)) if direction == "bwd" else (lambda: F.softmax_fwd(x, with_lse=False))
        print(f"{direction} {dname} {n} M={m}", flush=True)
        for name, stmts in variants.items():
            with knobs_set(stmts, saved):
                call()
                torch.cuda.synchronize()
                times, gave_up = [], []
                for _ in range(args.calls):
                    before = F.sync_failures("cuda")
                    t0 = time.perf_counter()
                    call()
                    torch.cuda.synchronize()
                    times.append((time.perf_counter() - t0) * 1e3)
                    gave_up.append(F.sync_failures("cuda") - before)
            times.sort()
            print(f"  {name}: ms median {times[len(times) // 2]:.3f} max {times[-1]:.2f}; calls with waits that gave "
                  f"up {sum(g > 0 for g in gave_up)} of {args.calls}, waits given up {sum(gave_up)}", flush=True)
        del x, y, dy
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
