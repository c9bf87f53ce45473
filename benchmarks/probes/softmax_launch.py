"""Probe: does host time per call enter the softmax timings? Ours beside torch.compile's softmax.

Run on a GPU:  python3 benchmarks/probes/softmax_launch.py [--cases 1024:bf16:fwd,16384:bf16:bwd]

``triton.testing.do_bench`` (what launch/bench_softmax.py times with) flushes L2 with a 256 MB
fill before each call and records the start event before the call is queued: if the host takes
longer to queue a call than the GPU takes for the fill, the GPU's idle wait is in the number. Per
case (M * N = 2^28) this prints GB/s by do_bench, by do_bench on tiny rows (host time alone: the
wall time per call when the GPU has nothing to do), and by ``do_bench_cudagraph`` (the calls
replayed from a CUDA graph: no host time), for ours and for torch.compile'd softmax (backward:
our kernel against the compiled backward graph's kernels through autograd).
"""
from __future__ import annotations

import argparse

import torch
import triton

from host_overhead import per_call_us  # same folder: wall time per call with a GPU that keeps up


def main():
    from ringsoftmax.kernels import softmax_bwd as B
    from ringsoftmax.kernels import softmax_fwd as F
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="1024:bf16:fwd,1024:fp32:fwd,16384:bf16:bwd,16384:bf16:fwd")
    args = ap.parse_args()
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    print("case | who | do_bench GB/s | cudagraph GB/s | host us/call (tiny rows)")
    for case in args.cases.split(","):
        n, dt, direction = case.split(":")
        n = int(n)
        for m in ((1 << 28) // n, 8):   # the benchmark's size, then rows small enough to time the host
            x = torch.randn(m, n, device="cuda", dtype=dtypes[dt])
            dy = torch.randn_like(x)
            torch._dynamo.reset()
            compiled = torch.compile(lambda t: torch.softmax(t, -1), dynamic=False)
            if direction == "fwd":
                calls = {"ours": lambda: F.softmax_fwd(x), "compile": lambda: compiled(x)}
                mult = 2
            else:
                y, _ = F.softmax_fwd(x)
                xx = x.detach().clone().requires_grad_()
                yy = compiled(xx)
                calls = {"ours": lambda: B.softmax_bwd(y, dy),
                         "compile": lambda: torch.autograd.grad(yy, xx, dy, retain_graph=True)}
                mult = 3
            nbytes = mult * x.numel() * x.element_size()
            for who, fn in calls.items():
                if m > 8:
                    t = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
                    try:
                        with torch.cuda.stream(torch.cuda.Stream()):
                            tg = triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")
                        graph = f"{nbytes / tg / 1e6:.0f}"
                    except Exception as e:  # noqa: BLE001 - a call that cannot be captured is reported
                        graph = f"error {type(e).__name__}"
                    cells = f"{nbytes / t / 1e6:.0f} | {graph} | -"
                else:
                    cells = f"- | - | {per_call_us(fn):.1f}"
                print(f"{case} m={m} | {who} | {cells}", flush=True)
            del x, dy
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
