"""Probe: wave quantization of the persistent Gluon forward (``attention_fwd_gluon``).

Its grid is one program per multiprocessor, program p taking query tiles p, p + grid, ...: with
T tiles on P multiprocessors the launch lasts ceil(T / P) tile-times, so T = k P + r (0 < r << P)
costs a whole tile-time more than k P for r / P more work. This times the kernel alone at tile
counts around k P (one 128-row tile per query head, every head on one K/V head: bf16, non-causal),
every count once per round, in turn, for ``--rounds`` rounds (medians), and prints each time against
the exact fill's beside the two models (work: T / kP; waves: ceil(T / P) / k). ``--split 0,1`` times
the launch without and with its split of the key tiles over the programs (``split=``), side by side.

Run on a GPU:  python3 benchmarks/probes/fa_waves.py [--dims 64,128] [--seqlens 4096,32768] [--rounds 5]
                   [--split 0,1]
(the launch bench's B * S = 32K tokens and 16 heads are 4096 tiles: 31.03 waves of 132.)
"""
from __future__ import annotations

import argparse
import functools
import math
import statistics

import torch
import triton

from ringsoftmax.kernels import attention_fwd_gluon as G


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seqlens", default="4096,32768")
    ap.add_argument("--waves", type=int, default=31, help="k: the exact fill is k * multiprocessors tiles")
    ap.add_argument("--extra", default="0,4,33,66,132", help="tiles past the exact fill")
    ap.add_argument("--tiles", default="", help="tile counts to time instead of the exact fill plus --extra")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--split", default="0", help="split values to time (0, 1 or both)")
    args = ap.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, "multiprocessors", sms)
    print("D | keys | split | tiles | waves | ms | time / exact fill | work model | waves model")
    for D in map(int, args.dims.split(",")):
        for Sk in map(int, args.seqlens.split(",")):
            k = torch.randn(1, Sk, 1, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            cases = []
            counts = ([int(t) for t in args.tiles.split(",")] if args.tiles
                      else [args.waves * sms + extra for extra in map(int, args.extra.split(","))])
            for tiles in counts:
                q = torch.randn(1, 128, tiles, D, device="cuda", dtype=torch.bfloat16)
                out, lse = torch.empty_like(q), torch.empty(1, tiles, 128, device="cuda")
                for split in map(int, args.split.split(",")):
                    cases.append(((split, tiles), functools.partial(G.launch, q, k, v, out, lse, split=bool(split),
                                                                    qk_scale=D ** -0.5 * 1.4426950408889634,
                                                                    causal=False)))
            times = {key: [] for key, _ in cases}
            for _ in range(args.rounds):
                for key, f in cases:
                    times[key].append(triton.testing.do_bench(f, warmup=10, rep=60, return_mode="median"))
            base = statistics.median(times[cases[0][0]])
            for (split, tiles), _ in sorted(cases, key=lambda c: c[0]):
                t = statistics.median(times[split, tiles])
                print(f"{D} | {Sk} | {split} | {tiles} | {tiles / sms:.2f} | {t:.3f} | {t / base:.3f} | "
                      f"{tiles / (args.waves * sms):.3f} | {math.ceil(tiles / sms) / args.waves:.3f}", flush=True)
            splits = sorted({split for split, _ in times})
            if len(splits) > 1:   # the split launch against the unsplit one, count by count
                for tiles in counts:
                    ratio = statistics.median(times[splits[0], tiles]) / statistics.median(times[splits[-1], tiles])
                    print(f"{D} | {Sk} | tiles {tiles} ({tiles / sms:.2f} waves): split speedup {ratio:.3f}",
                          flush=True)


if __name__ == "__main__":
    main()
