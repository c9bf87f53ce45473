"""Probe: host time of one eager attention_varlen call queued behind ~50 ms of GPU sleep, with cu_seqlens on the
GPU and on the CPU (a call that reads them from the GPU, or copies them from pageable memory, waits for the sleep).

Run on a GPU:  python3 benchmarks/probes/varlen_sync.py
"""
import time, torch, ringsoftmax as rs
dev = "cuda"
lens = [300, 0, 1000, 77, 2048]
cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
T = int(cu[-1])
q = torch.randn(T, 16, 128, device=dev, dtype=torch.bfloat16)
k, v = (torch.randn(T, 4, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
cycles = int(50e-3 * torch.cuda.get_device_properties(0).clock_rate * 1e3)   # ~50 ms of GPU sleep
for where, c in (("cuda", cu.to(dev)), ("cpu", cu), ("cuda", cu.to(dev)), ("cpu", cu)):
    rs.attention_varlen(q, k, v, c, causal=True); torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    t0 = time.perf_counter()
    out, lse = rs.attention_varlen(q, k, v, c, causal=True)
    host = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    ref, _ = rs.attention_varlen(q, k, v, cu.to(dev), causal=True)
    print(f"cu_seqlens on {where}: host {host:.2f} ms for the call (GPU busy ~50 ms behind it); same output: {torch.equal(out, ref)}")
