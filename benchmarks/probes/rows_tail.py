"""Probe: the rows kernels with and without their tail tile (``softmax_fwd.ROWS_TAIL``), side by side.

Run on a GPU: python3 benchmarks/probes/rows_tail.py  (prints % of a device-to-device copy: forward
2 * bytes(x) / t, backward 3 * bytes(x) / t, M * N = 2^28, median of three rounds each)."""
import torch, triton
from ringsoftmax.kernels import softmax_fwd as F, softmax_bwd as B

def bench(fn):
    return triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median")

a = torch.empty(1 << 29, device="cuda"); b = torch.empty_like(a)
copy = 2 * 4 * (1 << 29) / bench(lambda: b.copy_(a)) / 1e6
del a, b
print(f"copy {copy:.0f} GB/s | {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
print("N | dtype | dir | tail on % | tail off % | on/off")
for dt in (torch.float32, torch.bfloat16):
    for n in (300, 1000, 3072, 4097, 6144, 12288, 16385, 24576):
        m = (1 << 28) // n
        x = torch.randn(m, n, device="cuda", dtype=dt)
        y = torch.softmax(x.float(), -1).to(dt); dy = torch.randn_like(y)
        for d in ("fwd", "bwd"):
            fn = (lambda: F.softmax_fwd(x, with_lse=False)) if d == "fwd" else (lambda: B.softmax_bwd(y, dy))
            nbytes = (2 if d == "fwd" else 3) * x.numel() * x.element_size()
            res = {}
            for _ in range(3):
                for flag in (True, False):
                    F.ROWS_TAIL = flag  # (tail_split reads it per call)
                    res.setdefault(flag, []).append(bench(fn))
            on, off = (100 * nbytes / sorted(res[f])[1] / 1e6 / copy for f in (True, False))
            print(f"{n} | {str(dt)[6:]} | {d} | {on:.1f} | {off:.1f} | {on / off:.3f}", flush=True)
        del x, y, dy
F.ROWS_TAIL = True
