"""Probe: where a small softmax call's host time goes (the library's Python, Triton's launch, torch).

A call on a small tensor costs what the host takes to queue it: on an H200's machine the library's
attention block calls took 86-154 us and a torch op 12 us (``host_overhead.py``). This prints host
microseconds per call (the GPU kept busy behind a long sleep, so nothing waits on it) for torch's
softmax, the library's calls at each layer (public function, kernel launcher, the Triton launch
alone, the compiled kernel launched without Triton's binder, the library's launch cache on and off),
the pieces a call is made of, and the hottest functions of the public calls under cProfile.

Run on a GPU:  PYTHONPATH=$PWD:$PWD/benchmarks/probes python3 benchmarks/probes/launch_cost.py [--rows 64]
                   [--cols 1024] [--profile]
"""
from __future__ import annotations

import argparse
import time

import torch
import triton
import triton.language as tl
from host_overhead import hottest_functions  # same folder

import ringsoftmax as rs
from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import launcher
from ringsoftmax.kernels import softmax_fwd as F


@triton.jit
def _empty_kernel(X):
    pass


def host_us(fn, calls: int = 200) -> float:
    """Microseconds of host time per call, the GPU held busy behind a long sleep meanwhile."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(0.5 * torch.cuda.get_device_properties(0).clock_rate * 1e3))  # ~0.5 s
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls // 5):
            fn()
        best = min(best, (time.perf_counter() - t0) / (calls // 5) * 1e6)
    torch.cuda.synchronize()
    return best


def rows_launch_args(x, y, lse):
    """The rows kernel's grid and every argument in signature order, as ``softmax_fwd`` launches it."""
    m, n = x.shape
    align, edges, cols = F.row_layout(x, y)
    block_m, block_n, tail_n, warps = F.rows_config(m, cols, x.element_size())
    tile = F.rows_tile_args(m, n, block_m, block_n, (x.stride(0), y.stride(0)), F.ROWS_LOAD_EVICT, align, tail_n,
                            edges)
    args = (x, y, lse, lse, lse, m, n, x.stride(0), y.stride(0), block_m, block_n, True, True,
            tile["EVEN"], tile["OFFS64"], tile["LOAD_EVICT"], tile["ALIGN"], tile["EDGES"], tile["TAIL_N"],
            F.ROWS_EXP[0], F.ROWS_EXP[1])
    return (triton.cdiv(m, block_m), 1, 1), args, warps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--profile", action="store_true", help="also the hottest functions under cProfile")
    a = ap.parse_args()
    torch.manual_seed(0)
    x = torch.randn(a.rows, a.cols, device="cuda", dtype=torch.bfloat16)
    xg = x.clone().requires_grad_(True)
    dy = torch.randn_like(x)
    y, lse = F.softmax_fwd(x)
    grid, args, warps = rows_launch_args(x, y, lse)
    kernel = F._softmax_rows_kernel
    jit_kwargs = dict(zip(("BLOCK_M", "BLOCK_N", "STORE_Y", "STORE_LSE", "EVEN", "OFFS64", "LOAD_EVICT", "ALIGN",
                           "EDGES", "TAIL_N", "FTZ", "FMA"), args[9:]))
    compiled = kernel[grid](*args[:9], **jit_kwargs, num_warps=warps)
    stream = torch.cuda.current_stream().cuda_stream
    empty = _empty_kernel[(1,)](x)
    compiled_softmax = torch.compile(lambda t: torch.softmax(t, -1))
    compiled_softmax(x)

    def raw(c, g, a_):
        c.run(g[0], 1, 1, stream, c.function, c.packed_metadata, None, None, None, *a_)

    def uncached(fn):
        """fn with every launch through Triton (the launch cache off)."""
        def call():
            launcher.ENABLED = False
            try:
                fn()
            finally:
                launcher.ENABLED = True
        return call

    def fwd_bwd(fn):
        def step():
            out = fn(xg)
            out.backward(dy)
        return step

    calls = {
        "torch.softmax": lambda: torch.softmax(x, -1),
        "torch.compile softmax": lambda: compiled_softmax(x),
        "rs.softmax": lambda: rs.softmax(x),
        "rs.softmax, launch cache off": uncached(lambda: rs.softmax(x)),
        "rs.softmax_with_lse": lambda: rs.softmax_with_lse(x),
        "kernels softmax_fwd (launcher)": lambda: F.softmax_fwd(x),
        "kernels softmax_bwd (launcher)": lambda: B.softmax_bwd(y, dy),
        "rows kernel: Triton launch": lambda: kernel[grid](*args[:9], **jit_kwargs, num_warps=warps),
        "rows kernel: launcher.launch_kernel": lambda: launcher.launch_kernel(kernel, grid, *args[:9], **jit_kwargs,
                                                                              num_warps=warps),
        "rows kernel: compiled[grid](...)": lambda: compiled[grid](*args),
        "rows kernel: compiled.run (no binder)": lambda: raw(compiled, grid, args),
        "empty kernel: Triton launch": lambda: _empty_kernel[(1,)](x),
        "empty kernel: compiled.run": lambda: raw(empty, (1, 1, 1), (x,)),
        "torch.empty (M, N)": lambda: torch.empty(x.shape, dtype=x.dtype, device=x.device),
        "torch.add (a torch op)": lambda: torch.add(lse, 1.0),
        "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
        "triton driver get_current_stream": lambda: triton.runtime.driver.active.get_current_stream(0),
        "F.rows_config + rows_tile_args": lambda: rows_launch_args(x, y, lse),
        "fwd+bwd torch.softmax": fwd_bwd(lambda t: torch.softmax(t, -1)),
        "fwd+bwd rs.softmax": fwd_bwd(rs.softmax),
        "fwd+bwd rs.softmax, launch cache off": uncached(fwd_bwd(rs.softmax)),
    }
    y_ref = y.clone()
    y.fill_(float("nan"))
    raw(compiled, grid, args)  # the launch without Triton's binder writes the same y
    torch.cuda.synchronize()
    assert torch.equal(y, y_ref), "compiled.run gave another y"
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"x ({a.rows}, {a.cols}) bf16; host us per call (best of 5 batches); {rs.__file__}")
    for name, fn in calls.items():
        print(f"  {name:42s} {host_us(fn):7.1f} us", flush=True)
    for name in ("rs.softmax", "fwd+bwd rs.softmax", "rows kernel: Triton launch") if a.profile else ():
        print(f"--- cProfile, 300 x {name}, by own time")
        print(hottest_functions(calls[name], 300, 22))


if __name__ == "__main__":
    main()
