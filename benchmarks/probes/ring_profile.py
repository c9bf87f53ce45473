"""Probe: where the wall time of one ring_attention call goes, on every rank (torchrun).

Times ``ring_attention`` forward and forward+backward (median of 10, after warm-up) at the ring
demo's default size, then profiles 5 forward calls with torch.profiler on rank 0 and prints: wall
time per call, the GPU's busy time per call (sum of kernel times on all streams), the host time
spent in the call, and the top operators by host and by GPU time.

    torchrun --nproc-per-node 2 benchmarks/probes/ring_profile.py [--seqlen 16384]
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import ringsoftmax as rs


def median_ms(fn, iters=10):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=16384)
    args = ap.parse_args()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    b, n, h, hkv, d = 1, args.seqlen, 16, 8, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(b, n // world, hh, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                     for hh in (h, hkv, hkv, h))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    fwd = lambda: rs.ring_attention(q, k, v, causal=True)  # noqa: E731
    fwd_bwd = lambda: torch.autograd.grad(fwd(), (q, k, v), dout)  # noqa: E731
    with torch.no_grad():
        t_fwd = median_ms(fwd)
    t_fb = median_ms(fwd_bwd)
    if rank == 0:
        print(f"world {world}, seqlen {n}, bf16, causal zigzag: fwd {t_fwd:.2f} ms, fwd+bwd {t_fb:.2f} ms (median of 10)")
    for name, fn in (("forward", fwd), ("forward+backward", fwd_bwd)):
        dist.barrier()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / 5 * 1e3
        if rank != 0:
            continue
        events = prof.key_averages()
        gpu_us = sum(e.self_device_time_total for e in events) / 5
        print(f"\n=== {name}: wall {wall:.2f} ms per call, GPU busy {gpu_us / 1e3:.2f} ms per call (all streams)")
        print(events.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
        print(events.table(sort_by="self_device_time_total", row_limit=10, max_name_column_width=60))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
