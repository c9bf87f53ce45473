"""session 37 call 8: bf16 backward at N = 16385 / 20001 / 16400, the bench's inputs (x = randn, y = softmax_fwd(x),
dy = randn) and the probe's (y = softmax(randn * 3)), rows kernel against staged, in several allocation orders."""
import statistics, torch, triton
from ringsoftmax.kernels import softmax_bwd as B, softmax_fwd as F
def bench(fn): return triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median")
a = torch.empty(1 << 29, device="cuda"); b = torch.empty_like(a); t = bench(lambda: b.copy_(a)); copy = 8 * (1 << 29) / t / 1e6; del a, b
print(f"copy {copy:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
print("tree: session 37 final (2d20c84)")
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
