"""The ring demo: ring_attention (forward + backward) and ring_softmax on a long random sequence,
checked against the unsharded computation, with throughput.

    torchrun --nproc-per-node N launch/ring_demo.py [--seqlen S] [--dtype bfloat16] [--layout zigzag] ...

NCCL with one GPU per rank when GPUs are there, else gloo on the CPU. Every rank draws the same
full tensors from one seed and takes its shard; rank 0 computes the unsharded reference in float64
(the library's single-device path) and compares. Exits non-zero if any check fails.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ringsoftmax as rs  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# norm-relative error allowed against float64, by input dtype (fp32 math throughout)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a size or a count the demo cannot run with 0 or less of)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv=None):
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqlen", type=positive_int, default=16384 if gpu else 2048, help="global tokens per sequence")
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--heads", type=positive_int, default=16 if gpu else 4)
    p.add_argument("--kv-heads", type=positive_int, default=8 if gpu else 2)
    p.add_argument("--head-dim", type=positive_int, default=128 if gpu else 64,
                   help="1..256 on GPUs (the Triton kernels' limit)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16" if gpu else "float32")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--layout", choices=rs.layouts.LAYOUTS, default="zigzag")
    p.add_argument("--iters", type=positive_int, default=5 if gpu else 2, help="timed iterations")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if gpu and args.head_dim > 256:
        p.error(f"argument --head-dim: must be at most 256 on GPUs (the Triton kernels' limit), got {args.head_dim}")
    return args


def setup():
    """Initialize the process group (a one-process group when not started by torchrun)."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29511"))
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        backend, device = "nccl", torch.device("cuda", torch.cuda.current_device())
    else:
        backend, device = "gloo", torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["WORLD_SIZE"])))
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
    return dist.get_rank(), dist.get_world_size(), device


def say(rank, *msg):
    if rank == 0:
        print(*msg, flush=True)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, iters, device):
    """Median seconds of ``fn`` over ``iters`` runs after one warm-up."""
    fn()
    sync(device)
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-300)).item()


def main():
    args = parse_args()
    rank, world, device = setup()
    dtype = DTYPES[args.dtype]
    b, n, h, hkv, d = args.batch, args.seqlen, args.heads, args.kv_heads, args.head_dim
    say(rank, f"ring demo | world {world} | {dist.get_backend()} | {device.type}"
              f"{' ' + torch.cuda.get_device_name() if device.type == 'cuda' else ''} | torch {torch.__version__}")
    say(rank, f"batch {b} | seqlen {n} | heads {h} | kv heads {hkv} | head dim {d} | {args.dtype} | "
              f"causal {args.causal} | layout {args.layout}")
    problem = rs.layouts.split_error(args.layout, n, world)
    if problem or h % hkv:
        say(rank, f"error: {problem or f'--heads ({h}) must be a multiple of --kv-heads ({hkv})'}")
        dist.destroy_process_group()
        return 2

    # the same full tensors on every rank; each takes its shard
    gen = torch.Generator().manual_seed(args.seed)
    full = {name: torch.randn(shape, generator=gen).to(dtype) for name, shape in
            (("q", (b, n, h, d)), ("k", (b, n, hkv, d)), ("v", (b, n, hkv, d)), ("dout", (b, n, h, d)),
             ("x", (b, h, n)), ("dy", (b, h, n)))}
    full["x"] = full["x"] * 8
    mine = {name: rs.shard(t.to(device), dim=1 if t.dim() == 4 else 2, layout=args.layout)
            for name, t in full.items()}
    q, k, v = (mine[name].clone().requires_grad_() for name in "qkv")

    say(rank, "[1/4] ring_attention forward + backward")
    out = rs.ring_attention(q, k, v, causal=args.causal, layout=args.layout)
    out.backward(mine["dout"])
    say(rank, "[2/4] ring_softmax forward + backward")
    x = mine["x"].clone().requires_grad_()
    y = rs.ring_softmax(x, dim=-1)
    y.backward(mine["dy"])
    results = {"out": (out, 1), "dq": (q.grad, 1), "dk": (k.grad, 1), "dv": (v.grad, 1), "y": (y, 2),
               "dx": (x.grad, 2)}
    results = {name: (t.detach().clone(), dim) for name, (t, dim) in results.items()}

    say(rank, f"[3/4] timing ({args.iters} iterations after a warm-up)")
    t_fwd = timed(lambda: rs.ring_attention(q, k, v, causal=args.causal, layout=args.layout), args.iters, device)
    t_fb = timed(lambda: torch.autograd.grad(rs.ring_attention(q, k, v, causal=args.causal, layout=args.layout),
                                             (q, k, v), mine["dout"]), args.iters, device)
    t_sm = timed(lambda: rs.ring_softmax(x, dim=-1), args.iters, device)

    say(rank, "[4/4] checking against the unsharded computation in float64 (rank 0)")
    got = {name: rs.unshard(t, dim=dim, layout=args.layout) for name, (t, dim) in results.items()}
    status = torch.zeros(1, device=device)
    if rank == 0:
        status[0] = check(full, got, args, dtype, device)
    dist.broadcast(status, 0)

    flops = 4 * b * n * n * h * d * (0.5 if args.causal else 1.0)
    say(rank, "metric | value")
    say(rank, f"ring_attention fwd | {t_fwd * 1e3:.2f} ms | {b * n / t_fwd:,.0f} tokens/s | "
              f"{flops / t_fwd / world / 1e12:.3g} TFLOP/s per rank")
    say(rank, f"ring_attention fwd+bwd | {t_fb * 1e3:.2f} ms | {b * n / t_fb:,.0f} tokens/s | "
              f"{3.5 * flops / t_fb / world / 1e12:.3g} TFLOP/s per rank")
    say(rank, f"ring_softmax fwd | {t_sm * 1e3:.2f} ms | {b * h * n / t_sm:,.0f} elements/s")
    ok = status.item() == 0
    say(rank, "PASS" if ok else "FAIL")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def check(full, got, args, dtype, device) -> int:
    """Compare the gathered results with float64 single-device results; print errors; 0 if all pass."""
    f64 = {name: t.to(device=device, dtype=torch.float64) for name, t in full.items()}
    q, k, v = (f64[name].clone().requires_grad_() for name in "qkv")
    out, _ = rs.attention(q, k, v, causal=args.causal)
    out.backward(f64["dout"])
    x = f64["x"].clone().requires_grad_()
    y = rs.softmax(x, dim=-1)
    y.backward(f64["dy"])
    want = {"out": out, "dq": q.grad, "dk": k.grad, "dv": v.grad, "y": y, "dx": x.grad}
    tol = TOLERANCE[dtype]
    failed = 0
    print(f"check | norm-relative error vs float64 | tolerance {tol:.0e}", flush=True)
    for name in ("out", "dq", "dk", "dv", "y", "dx"):
        err = rel_err(got[name], want[name].detach())
        bad = not err <= tol
        failed += bad
        print(f"  {name:>3} | {err:.3e} | {'FAIL' if bad else 'ok'}", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
