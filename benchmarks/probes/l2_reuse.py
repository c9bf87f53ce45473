"""Probe: how much of a second read comes back from L2, for a two-pass softmax done slab by slab.

Run on a GPU:  python3 benchmarks/probes/l2_reuse.py [--slabs-mb 4,8,16,24,32,48] [--total-mb 1536]

Rows longer than the chip keeps in shared memory are read twice (statistics, then normalize). If
the rows were taken a slab at a time, small enough for L2 (50 MB on an H100 / H200), the second
read could come from L2 and the forward would move 2 bytes per element instead of 3. Sessions 1,
10 and 12 tried kernels built on that and saw little of the re-read come back. This probe asks the
question without a softmax around it: a float32 tensor of ``--total-mb`` is taken in slabs of S MB,
each slab by two Triton kernels on a persistent grid (SMs x 4 programs, tiles of 4096 in a
grid-stride loop):

1. ``read``: sums the slab (the statistics pass: one read);
2. ``rw``: reads the slab again and writes y = 2 x to another tensor (the normalize pass).

The slabs' launches are captured in one CUDA graph (so host gaps do not count) and replayed, timed by
``triton.testing.do_bench`` (L2 flushed before each replay; medians of ``--rounds`` interleaved rounds).
The figure printed is the forward's: 2 * bytes / time, as % of the staged probe's device-to-device copy
(``copy_gbs``) measured in the same process. A slab pair with no L2 reuse moves 3 bytes per 2
(67%); with the whole re-read from L2, 2 per 2 (the copy's speed, ~100%).

Variants: cache hints (none; ``evict_last`` on the first read, ``evict_first`` on the second read
and the stores) and the second pass's order (tiles in the first pass's order, or last first, so that
it starts on what the first pass read last).
"""
from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl

from softmax_staged import bench, copy_gbs  # same folder: the staged probe's timing (do_bench, L2 flushed) and copy

TILE = 4096


@triton.jit
def read_kernel(x_ptr, part_ptr, n_tiles, FIRST_POLICY: tl.constexpr, TILE: tl.constexpr):
    """The statistics pass: program p sums tiles p, p + P, ... of x (float32) into part[p]."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros([TILE], dtype=tl.float32)
    for t in range(pid, n_tiles, grid):
        offs = t * TILE + tl.arange(0, TILE)  # (int32: --total-mb under 8192)
        acc += tl.load(x_ptr + offs, eviction_policy=FIRST_POLICY)
    tl.store(part_ptr + pid, tl.sum(acc, 0))


@triton.jit
def rw_kernel(x_ptr, y_ptr, n_tiles, SECOND_POLICY: tl.constexpr, STORE_POLICY: tl.constexpr,
              REVERSE: tl.constexpr, TILE: tl.constexpr):
    """The normalize pass: program p reads tiles p, p + P, ... of x again (last first where REVERSE)
    and writes 2 x to y."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    for i in range(pid, n_tiles, grid):
        t = n_tiles - 1 - i if REVERSE else i
        offs = t * TILE + tl.arange(0, TILE)  # (int32: --total-mb under 8192)
        v = tl.load(x_ptr + offs, eviction_policy=SECOND_POLICY)
        tl.store(y_ptr + offs, v * 2.0, eviction_policy=STORE_POLICY)


VARIANTS = {  # name: (first read, second read, stores, reverse)
    "plain": ("", "", "", False),
    "plain, reversed": ("", "", "", True),
    "hints": ("evict_last", "evict_first", "evict_first", False),
    "hints, reversed": ("evict_last", "evict_first", "evict_first", True),
}


def graph_of(x, y, part, slab: int, variant, grid: int) -> torch.cuda.CUDAGraph:
    """One CUDA graph of the read and rw launches of every slab of ``slab`` elements, in order."""
    first, second, store, reverse = variant

    def launches():
        for start in range(0, x.numel(), slab):
            xs, ys = x[start:start + slab], y[start:start + slab]
            read_kernel[(grid,)](xs, part, slab // TILE, FIRST_POLICY=first, TILE=TILE, num_warps=4)
            rw_kernel[(grid,)](xs, ys, slab // TILE, SECOND_POLICY=second, STORE_POLICY=store, REVERSE=reverse,
                               TILE=TILE, num_warps=4)

    launches()  # (compiles and warms up outside the capture)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launches()
    return g


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--slabs-mb", default="4,8,16,24,32,48")
    ap.add_argument("--total-mb", type=int, default=1536)
    ap.add_argument("--per-sm", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n = args.total_mb * (1 << 20) // 4
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = sms * args.per_sm
    part = torch.empty(grid, device="cuda")
    copy = copy_gbs()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"{args.total_mb} MB float32, grid {grid}; copy {copy:.0f} GB/s")
    print("slab MB | variant | GB/s (2 * bytes / t) | % copy | read pass alone, % of a read at copy speed")
    for mb in map(int, args.slabs_mb.split(",")):
        slab = mb * (1 << 20) // 4
        if n % slab or slab % TILE:
            print(f"{mb} | skipped: {args.total_mb} MB is not a whole number of slabs")
            continue
        graphs = {name: graph_of(x, y, part, slab, v, grid) for name, v in VARIANTS.items()}
        # the read pass alone over the whole tensor, one slab per launch (its own speed, for reference)
        reads = torch.cuda.CUDAGraph()
        with torch.cuda.graph(reads):
            for start in range(0, n, slab):
                read_kernel[(grid,)](x[start:start + slab], part, slab // TILE, FIRST_POLICY="", TILE=TILE, num_warps=4)
        times = {name: [] for name in graphs}
        read_times = []
        for _ in range(args.rounds):
            for name, g in graphs.items():
                times[name].append(bench(g.replay))
            read_times.append(bench(reads.replay))
        read_pct = 100 * (x.numel() * 4 / statistics.median(read_times) / 1e6) / copy
        for name, ts in times.items():
            gbs = 2 * x.numel() * 4 / statistics.median(ts) / 1e6
            print(f"{mb} | {name} | {gbs:.0f} | {100 * gbs / copy:.1f} | {read_pct:.1f}", flush=True)
        # check: y = 2 x after the last replay (every variant writes the same y)
        assert torch.equal(y, 2 * x), "rw pass wrote wrong values"
        del graphs, reads
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
