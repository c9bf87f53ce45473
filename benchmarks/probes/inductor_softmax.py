"""Probe: what torch.compile generates for softmax (forward, backward) beside ours, per (N, dtype).

Run on a GPU:  python3 benchmarks/probes/inductor_softmax.py [--cases 1024:bf16:fwd,16384:bf16:bwd]
                   [--source]
M * N = 2^28. For each case prints ours and torch.compile's GB/s (forward 2 * bytes / t, backward
3 * bytes / t, as launch/bench_softmax.py counts them), then every Triton kernel Inductor
generated for it with the configuration its autotuner kept (block sizes, warps, stages) and, with
``--source``, the kernel's source.
"""
from __future__ import annotations

import argparse
import inspect

import torch
import triton


def inductor_kernels():
    """(name, kept config, source) of every autotuned Triton kernel Inductor has loaded so far."""
    from torch._inductor.codecache import PyCodeCache
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    found = []
    for mod in list(PyCodeCache.modules) + list(getattr(PyCodeCache, "modules_no_attr", {}).values()):
        for name, obj in vars(mod).items():
            if isinstance(obj, CachingAutotuner):
                cfgs = [str(launcher.config) for launcher in obj.launchers] or ["(not launched)"]
                try:
                    src = inspect.getsource(obj.fn.fn)
                except (OSError, TypeError, AttributeError):
                    src = getattr(obj.fn, "src", "(no source)")
                found.append((name, cfgs, src))
    return found


def main():
    from ringsoftmax.kernels import softmax_bwd as B
    from ringsoftmax.kernels import softmax_fwd as F
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="1024:bf16:fwd,16384:bf16:bwd,16777216:fp32:bwd")
    ap.add_argument("--source", action="store_true")
    args = ap.parse_args()
    bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median")  # noqa: E731
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    seen = set()
    for case in args.cases.split(","):
        n, dt, direction = case.split(":")
        n = int(n)
        m = (1 << 28) // n
        x = torch.randn(m, n, device="cuda", dtype=dtypes[dt])
        dy = torch.randn_like(x)
        nb = x.numel() * x.element_size()
        torch._dynamo.reset()
        compiled = torch.compile(lambda t: torch.softmax(t, -1), dynamic=False)
        if direction == "fwd":
            ours = bench(lambda: F.softmax_fwd(x))
            xx = x
            theirs = bench(lambda: compiled(xx))
            mult = 2
        else:
            y, _ = F.softmax_fwd(x)
            ours = bench(lambda: B.softmax_bwd(y, dy))
            xx = x.detach().clone().requires_grad_()
            yy = compiled(xx)
            theirs = bench(lambda: torch.autograd.grad(yy, xx, dy, retain_graph=True))
            mult = 3
        g_ours, g_theirs = mult * nb / ours / 1e6, mult * nb / theirs / 1e6
        print(f"== {case} (M={m}): ours {g_ours:.0f} GB/s, torch.compile {g_theirs:.0f} GB/s, "
              f"ours/compile {g_ours / g_theirs:.3f}", flush=True)
        for name, cfgs, src in inductor_kernels():
            if (name, src) in seen:
                continue
            seen.add((name, src))
            print(f"   kernel {name}: kept {cfgs}")
            if args.source:
                print("\n".join("      " + line for line in src.splitlines()))
        del x, dy
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
