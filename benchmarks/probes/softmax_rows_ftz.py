"""Probe: the rows softmax kernel with ex2.approx.ftz exponentials against plain tl.exp, side by side.

    python3 benchmarks/probes/softmax_rows_ftz.py

M * N = 2^28, forward 2 * bytes(x) / t as % of the same run's device-to-device copy.
"""
import torch
import triton

from ringsoftmax.kernels import softmax_fwd as F


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=50, return_mode="median")


def main():
    a = torch.empty(1 << 29, device="cuda").normal_()
    b = torch.empty_like(a)
    copy = 2 * 4 * (1 << 29) / bench(lambda: b.copy_(a)) / 1e6
    del a, b
    print(f"copy {copy:.0f} GB/s; {torch.cuda.get_device_name()} triton {triton.__version__}")
    print("dtype | N | ftz % copy | exp % copy | max |y_ftz - y_exp|")
    for dtype in (torch.bfloat16, torch.float32):
        for n in (1024, 4096, 16384):
            x = (torch.randn((1 << 28) // n, n, device="cuda") * 3).to(dtype)
            cells, ys = [], []
            for ftz in (True, False):
                F.ROWS_FTZ = ftz
                t = bench(lambda: F.softmax_fwd(x))
                cells.append(100 * 2 * x.numel() * x.element_size() / t / 1e6 / copy)
                ys.append(F.softmax_fwd(x)[0].float())
            F.ROWS_FTZ = True
            print(f"{dtype} | {n} | {cells[0]:.1f} | {cells[1]:.1f} | {(ys[0] - ys[1]).abs().max().item():.1e}",
                  flush=True)


if __name__ == "__main__":
    main()
