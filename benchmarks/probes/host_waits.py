"""Probe: does a public call wait for the GPU? Each call (forward, and forward + backward) is queued behind
400 ms of GPU sleep after a warm-up (``softmax_host.host_us`` with one call); its host time says whether it
waited (a host read of a GPU tensor, a copy from pageable memory, a synchronize). Host times under a few ms:
queued without waiting; ~400 ms: it waited. attention_varlen runs twice, with cu_seqlens on the GPU (the host
reads them there: it waits) and on the CPU.

Run on a GPU:  python3 benchmarks/probes/host_waits.py
"""
import torch
from softmax_host import host_us  # same folder

import ringsoftmax as rs

DEV = "cuda"


def host_ms(fn) -> float:
    fn()
    return host_us(fn, calls=1) / 1e3


def with_backward(fn, *inputs):
    """fn(*inputs) then backward of the sum of its float outputs (inputs' gradients dropped each time)."""
    def run():
        for t in inputs:
            t.grad = None
        outs = fn(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        sum(o.float().sum() for o in outs if o.requires_grad).backward()
    return run


def cases():
    for m, n, dt in ((64, 1000, torch.bfloat16), (16, 1 << 20, torch.bfloat16), (16, 16 << 20, torch.bfloat16),
                     (2, 8 << 20, torch.float32), (4, 300007, torch.float32)):
        x = torch.randn(m, n, device=DEV, dtype=dt, requires_grad=True)
        yield f"softmax_with_lse ({m}, {n}) {str(dt)[6:]}", lambda x=x: rs.softmax_with_lse(x, -1), \
            with_backward(lambda t: rs.softmax_with_lse(t, -1), x)
    q, k, v = (torch.randn(2, 1024, h, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True) for h in (8, 2, 2))
    yield "attention (2, 1024, 8, 64) causal", lambda: rs.attention(q, k, v, causal=True), \
        with_backward(lambda a, b, c: rs.attention(a, b, c, causal=True), q, k, v)
    cu = torch.tensor([0, 300, 300, 900, 1024])
    qp, kp, vp = (t[0].detach().requires_grad_() for t in (q, k, v))
    for where, c in (("GPU", cu.to(DEV)), ("CPU", cu)):
        yield f"attention_varlen, cu_seqlens on the {where}", \
            lambda c=c: rs.attention_varlen(qp, kp, vp, c, causal=True), \
            with_backward(lambda a, b, e, c=c: rs.attention_varlen(a, b, e, c, causal=True), qp, kp, vp)
    o, l = (t.detach() for t in rs.attention(q, k, v))
    yield "merge", lambda: rs.merge(o, l, o, l), None


def main():
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; host ms of a call queued behind 400 ms of GPU sleep")
    print("call | forward | forward + backward")
    for name, fwd, both in cases():
        cells = [f"{host_ms(f):.2f}" if f is not None else "-" for f in (fwd, both)]
        print(f"{name} | {' | '.join(cells)}", flush=True)


if __name__ == "__main__":
    main()
