"""Probe: host (CPU) time per call of the attention block kernels and the merge, one GPU.

The ring computes each rank's share as a few block calls per step, each followed by a merge; at
short blocks the GPU finishes before the host has queued the next call, and the host time is what
the ring costs. This probe times calls on blocks too small to keep the GPU busy (B=1, S=128,
16 heads, head dim 128, bf16), so the wall time per call is the host's, then prints the hottest
functions under cProfile.

    PYTHONPATH=$PWD python3 benchmarks/probes/host_overhead.py
"""
import cProfile
import io
import pstats
import time

import torch

from ringsoftmax.kernels.attention_bwd import attention_bwd, attention_delta
from ringsoftmax.kernels.attention_fwd import attention_fwd
from ringsoftmax.merge import merge_


def per_call_us(fn, n=300):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    torch.manual_seed(0)
    B, S, H, D = 1, 128, 16, 128
    q, k, v, dout = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    kw = dict(softmax_scale=D ** -0.5, causal=True)
    out, lse = attention_fwd(q, k, v, **kw)
    delta = attention_delta(out, dout)
    acc_out = torch.zeros(B, S, H, D, device="cuda")
    acc_lse = torch.full((B, H, S), float("-inf"), device="cuda")
    o32, l32 = attention_fwd(q, k, v, out_dtype=torch.float32, **kw)
    dq, dk, dv = (torch.zeros(B, S, H, D, device="cuda") for _ in range(3))
    calls = {
        "attention_fwd (causal)": lambda: attention_fwd(q, k, v, **kw),
        "attention_fwd (past, fp32 out)": lambda: attention_fwd(q, k, v, out_dtype=torch.float32, q_offset=S, **kw),
        "attention_fwd (full)": lambda: attention_fwd(q, k, v, softmax_scale=D ** -0.5),
        "attention_delta": lambda: attention_delta(out, dout),
        "attention_bwd (causal, accumulate)": lambda: attention_bwd(q, k, v, out, dout, lse, delta, dq=dq, dk=dk,
                                                                    dv=dv, **kw),
        "merge_": lambda: merge_(acc_out, acc_lse, o32, l32),
        "empty kernel (torch.add)": lambda: torch.add(acc_lse, 1.0),
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; host microseconds per call "
          f"(B={B}, S={S}, H={H}, D={D}, bf16)")
    for name, fn in calls.items():
        print(f"  {name:36s} {per_call_us(fn):7.1f} us", flush=True)
    for name in ("attention_fwd (causal)", "attention_bwd (causal, accumulate)"):
        print(f"--- cProfile, 200 x {name}, by own time")
        print(hottest_functions(calls[name], 200, 14))


def hottest_functions(fn, calls: int, lines: int) -> str:
    """The ``lines`` functions with the most own time over ``calls`` calls of fn, under cProfile."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(lines)
    return "\n".join(line for line in text.getvalue().splitlines()[6:] if line.strip())


if __name__ == "__main__":
    main()
