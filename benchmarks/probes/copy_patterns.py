"""Probe: how fast a plain register copy runs in the staged softmax kernel's access order, beside others.

Run on a GPU:  python3 benchmarks/probes/copy_patterns.py [--total 2^28] [--sizes 262144,1048576]
                   [--chunks 8192,1024] [--warps 4] [--rounds 3]

The staged kernel's data path alone (its copy ablation) stops at ~90% of a device-to-device copy in
every ring configuration (session 13). These Triton copies take no shared memory; they differ only
in which chunk of an (M, N) float32 tensor each program copies at each step:

- ``grid``: one program per chunk, in memory order (a plain copy kernel);
- ``flat``: a persistent grid of P programs (SMs x ``--per-sm``), program p copying chunks p, p + P,
  p + 2P, ... of the tensor in memory order;
- ``rows``: the staged kernel's order: Q = N / CHUNK programs per row, G = P // Q rows in flight,
  program (slot, q) copying chunk q of rows slot, slot + G, ... (the rest of P idle);
- ``claim``: a persistent grid of P programs, each taking the next chunk in memory order from an
  atomic counter until none is left (the order a hardware-scheduled grid keeps, on a persistent grid).

Prints GB/s (2 * bytes / time) and % of torch's copy, medians of ``--rounds`` interleaved rounds.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(X, Y, COUNTER, M, N, Q, G, STEPS, MODE: tl.constexpr, CHUNK: tl.constexpr):
    """MODE 0 grid: chunk = program; 1 flat: chunks p + k * P; 2 rows: chunk q of rows slot + k * G;
    3 claim: chunks from the counter COUNTER (zero at the start)."""
    pid = tl.program_id(0)
    offs = tl.arange(0, CHUNK)
    if MODE == 0:
        start = pid.to(tl.int64) * CHUNK
        tl.store(Y + start + offs, tl.load(X + start + offs))
    elif MODE == 1:
        total = M * Q
        for k in range(0, STEPS):
            c = pid + k * tl.num_programs(0)
            if c < total:
                start = c.to(tl.int64) * CHUNK
                tl.store(Y + start + offs, tl.load(X + start + offs))
    elif MODE == 3:
        total = M * Q
        c = tl.atomic_add(COUNTER, 1, sem="relaxed")
        while c < total:
            start = c.to(tl.int64) * CHUNK
            tl.store(Y + start + offs, tl.load(X + start + offs))
            c = tl.atomic_add(COUNTER, 1, sem="relaxed")
    else:
        slot = pid // Q
        q = pid - slot * Q
        for k in range(0, STEPS):
            row = slot + k * G
            if row < M:
                start = row.to(tl.int64) * N + q * CHUNK
                tl.store(Y + start + offs, tl.load(X + start + offs))


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--total", type=int, default=1 << 28)
    ap.add_argument("--sizes", default="262144,1048576")
    ap.add_argument("--chunks", default="8192,1024")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--per-sm", default="2,4", help="persistent programs per multiprocessor")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.randn(args.total, device="cuda")
    y = torch.empty_like(x)
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    nbytes = 2 * x.numel() * 4
    runs = {"torch copy": lambda: y.copy_(x)}
    for n in map(int, args.sizes.split(",")):
        m = args.total // n
        for chunk in map(int, args.chunks.split(",")):
            q = n // chunk

            def launch(mode, programs, g=0, chunk=chunk, m=m, n=n, q=q):
                steps = triton.cdiv(m * q, programs) if mode == 1 else triton.cdiv(m, max(g, 1))

                def run():
                    if mode == 3:
                        counter.zero_()
                    _copy_kernel[(programs,)](x, y, counter, m, n, q, g, steps, MODE=mode, CHUNK=chunk,
                                              num_warps=args.warps)
                return run

            runs[f"N {n} chunk {chunk} grid"] = launch(0, m * q)
            for per in map(int, args.per_sm.split(",")):
                p = sms * per
                runs[f"N {n} chunk {chunk} flat {p}"] = launch(1, p)
                runs[f"N {n} chunk {chunk} claim {p}"] = launch(3, p)
                if q <= p:
                    g = min(p // q, m)
                    runs[f"N {n} chunk {chunk} rows {g}x{q} of {p}"] = launch(2, g * q, g)
    for name, run in runs.items():   # compile, and check the copy
        y.zero_()
        run()
        torch.cuda.synchronize()
        assert torch.equal(x, y), name
    times = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            times[name].append(bench(run))
    copy = nbytes / statistics.median(times["torch copy"]) / 1e6
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}; "
          f"copy {copy:.0f} GB/s; {args.warps} warps")
    print("variant | GB/s | % copy")
    for name in runs:
        gbs = nbytes / statistics.median(times[name]) / 1e6
        print(f"{name} | {gbs:.0f} | {100 * gbs / copy:.1f}")


if __name__ == "__main__":
    main()
