"""Probe: the bf16 backward's rows kernel against the staged kernel (``BWD_STAGED_MASKED`` off / as the
library has it) at N = 16385 / 20001 / 16400, M * N = 2^28, on three kinds of inputs: the bench's
(x = randn, y = softmax_fwd(x), dy = randn), ``knobs.py``'s (y = softmax(randn * 3)), and those after a
28 MiB allocation that moves y and dy. Prints % of a device-to-device copy (3 * bytes(y) / t, medians
of 3 timings) and the distance between y and dy.

Run on a GPU:  PYTHONPATH=$PWD python3 benchmarks/probes/bwd_inputs.py
"""
import statistics, torch, triton
from ringsoftmax.kernels import softmax_bwd as B, softmax_fwd as F
def bench(fn): return triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median")
a = torch.empty(1 << 29, device="cuda"); b = torch.empty_like(a); t = bench(lambda: b.copy_(a)); copy = 8 * (1 << 29) / t / 1e6; del a, b
print(f"copy {copy:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
on = dict(B.BWD_STAGED_MASKED)
for n in (16385, 20001, 16400):
    m = (1 << 28) // n
    for inputs in ("bench", "probe", "probe-pad"):
        torch.manual_seed(0)
        if inputs == "bench":
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16); dy = torch.randn_like(x); y, _ = F.softmax_fwd(x); del x
        else:
            pad = torch.empty(7 << 20, device="cuda") if inputs == "probe-pad" else None
            y = torch.softmax(torch.randn(m, n, device="cuda") * 3, -1).to(torch.bfloat16); dy = torch.randn_like(y)
        res = {}
        for name, knob in (("rows", {4: None, 2: None}), ("staged", on)):
            B.BWD_STAGED_MASKED = knob
            ts = [bench(lambda: B.softmax_bwd(y, dy)) for _ in range(3)]
            res[name] = 3 * y.numel() * 2 / statistics.median(ts) / 1e6 / copy * 100
        B.BWD_STAGED_MASKED = on
        print(f"bf16 bwd N={n} inputs={inputs} y-dy={(dy.data_ptr() - y.data_ptr()) >> 20} MiB: rows {res['rows']:.1f} staged {res['staged']:.1f} % copy", flush=True)
        del y, dy; torch.cuda.empty_cache()
