"""Ring attention across GPUs beside PyTorch's context_parallel, in one run, on the same inputs.

    torchrun --nproc-per-node 2 launch/bench_ring.py [--seqlens 32768,131072] [--heads 16] [--head-dim 128]

Prints, per (causal, global seqlen): fwd and fwd+bwd milliseconds and TFLOP/s per GPU for
ringsoftmax.ring_attention (zigzag layout) and for torch's context_parallel with the cuDNN and
flash SDPA backends; the ratio ours / best peer. Causal counts half the work; fwd+bwd counts 3.5x
the forward's FLOPs. A peer that is missing or raises is reported as such.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ringsoftmax as rs  # noqa: E402


def timed_ms(fn, iters=5, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def ours(q, k, v, dout, causal):
    """(fwd ms, fwd+bwd ms) of ring_attention on this rank's zigzag shards."""
    qs, ks, vs, ds = (rs.shard(t, 1, layout="zigzag") for t in (q, k, v, dout))
    qs, ks, vs = (t.requires_grad_() for t in (qs, ks, vs))
    fwd = lambda: rs.ring_attention(qs, ks, vs, causal=causal)
    return timed_ms(fwd), timed_ms(lambda: torch.autograd.grad(fwd(), (qs, ks, vs), ds))


def context_parallel_peer(q, k, v, dout, causal, backend, mesh):
    """(fwd ms, fwd+bwd ms) of SDPA under torch's context_parallel (sequence dim 2 of (B, H, S, D))."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import sdpa_kernel
    from torch.distributed.tensor.experimental import _attention
    qt, kt, vt, dt = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))
    # torch load-balances (head-tail sharding) only causal attention and raises for the rest
    options = _attention._cp_options
    balance = options.enable_load_balance
    options.enable_load_balance = causal
    try:
        with sdpa_kernel([backend]), context_parallel(mesh, buffers=[qt, kt, vt, dt], buffer_seq_dims=[2, 2, 2, 2]):
            qq, kk, vv = (t.detach().requires_grad_() for t in (qt, kt, vt))
            fwd = lambda: F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            return timed_ms(fwd), timed_ms(lambda: torch.autograd.grad(fwd(), (qq, kk, vv), dt))
    finally:
        options.enable_load_balance = balance


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlens", default="32768,131072")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    args = p.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.attention import SDPBackend
    mesh = init_device_mesh("cuda", (world,))

    def row(*c):
        if rank == 0:
            print(" | ".join(str(x) for x in c), flush=True)

    row("device", torch.cuda.get_device_name(), "x", world, "torch", torch.__version__)
    row("impl", "causal", "global seqlen", "fwd ms", "fwd TF/GPU", "fwd+bwd ms", "fwd+bwd TF/GPU")
    h, d = args.heads, args.head_dim
    for causal in (True, False):
        for n in (int(s) for s in args.seqlens.split(",")):
            torch.manual_seed(0)
            q, k, v, dout = (torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            flops = 4 * n * n * h * d * (0.5 if causal else 1.0) / world
            results = {}
            impls = {"ringsoftmax": lambda: ours(q, k, v, dout, causal)}
            for name, be in (("cp-cudnn", SDPBackend.CUDNN_ATTENTION), ("cp-flash", SDPBackend.FLASH_ATTENTION)):
                impls[name] = lambda be=be: context_parallel_peer(q, k, v, dout, causal, be, mesh)
            for name, fn in impls.items():
                try:
                    tf, tb = fn()
                    results[name] = tb
                    row(name, causal, n, f"{tf:.2f}", f"{flops / tf / 1e9:.0f}", f"{tb:.2f}", f"{3.5 * flops / tb / 1e9:.0f}")
                except Exception as e:  # noqa: BLE001 - a failing peer is reported, not hidden
                    row(name, causal, n, "FAIL", repr(e)[:120].replace("\n", " "))
                torch.cuda.empty_cache()
            peers = [t for name, t in results.items() if name != "ringsoftmax"]
            if "ringsoftmax" in results and peers:
                row("ratio fwd+bwd ours/best peer (speed)", causal, n, f"{min(peers) / results['ringsoftmax']:.2f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
