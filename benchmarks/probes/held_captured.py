"""Probe: the held path against the path without it (``softmax_held``), in CUDA-graph replays and eagerly.

Rows past what the staged kernel holds, float32 and bf16, forward and backward, M rows each (default 1, 4, 16).
Each variant forces the held path on (``HELD_MIN_BYTES`` and ``HELD_MIN_ROWS_CAPTURED`` 0) or off (both inf),
captures the library call in a CUDA graph and times its replays and the eager call (``do_bench`` medians), as %
of the same run's copy; "held taken" says whether the capture took the held path in each variant.

Run on a GPU:  python3 benchmarks/probes/held_captured.py [rows,...]
"""
import math, sys, torch, triton
from triton.testing import do_bench
from ringsoftmax.kernels import softmax_fwd as F, softmax_bwd as B, softmax_held as H
DT = {"fp32": torch.float32, "bf16": torch.bfloat16}
MS = tuple(int(v) for v in sys.argv[1].split(",")) if len(sys.argv) > 1 else (1, 4, 16)
CASES = [("fwd", "fp32", n, m) for n in (8 << 20, 16 << 20) for m in MS] + \
        [("fwd", "bf16", n, m) for n in (16 << 20, 32 << 20) for m in MS] + \
        [("bwd", "fp32", n, m) for n in (4 << 20, 8 << 20) for m in MS] + \
        [("bwd", "bf16", n, m) for n in (8 << 20, 16 << 20) for m in MS]
taken = []
orig = H.held_split
def spy(*a, **k):
    r = orig(*a, **k); taken.append(r); return r
H.held_split = spy
src = torch.empty(1 << 28, device="cuda", dtype=torch.uint8); dst = torch.empty_like(src)
copy = 2 * src.numel() / do_bench(lambda: dst.copy_(src), return_mode="median") / 1e6
print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} copy {copy:.0f} GB/s")
def call(d, t):
    return (lambda: F.softmax_fwd(t[0], True)) if d == "fwd" else (lambda: B.softmax_bwd(t[0], t[1]))
print("dir dtype N M | held graph | two-pass graph | held eager | two-pass eager   (% of copy; held taken at capture?)")
for d, dt, n, m in CASES:
    x = torch.randn(m, n, device="cuda", dtype=DT[dt])
    t = (x,) if d == "fwd" else (torch.softmax(x.float(), -1).to(DT[dt]), torch.randn_like(x))
    nbytes = (2 if d == "fwd" else 3) * x.numel() * x.element_size()
    res = {}
    for rnd in range(2):
        for v, thr in (("held", 0), ("two", math.inf)):
            H.HELD_MIN_BYTES = H.HELD_MIN_ROWS_CAPTURED = thr
            fn = call(d, t)
            taken.clear(); fn(); torch.cuda.synchronize(); took = any(taken)
            s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn(); fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            taken.clear()
            with torch.cuda.graph(g):
                fn()
            took = any(taken)
            tg = do_bench(g.replay, return_mode="median")
            te = do_bench(fn, return_mode="median")
            res.setdefault(v, []).append((tg, te, took))
            del g
    f = lambda ms: 100 * nbytes / ms / 1e6 / copy
    h = min(res["held"]); w = min(res["two"])
    print(f"{d} {dt} {n} {m} | {f(h[0]):.1f} | {f(w[0]):.1f} | {f(h[1]):.1f} | {f(w[1]):.1f}   ({h[2]}, {w[2]})  ratio graph {w[0]/h[0]:.3f}", flush=True)
    del x, t
    torch.cuda.empty_cache()
