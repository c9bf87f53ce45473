"""Probe: repeat the attention backward on a ring's block pair, gradients added into float32 buffers,
and count the calls whose gradients are not finite or differ from the first call's, per gradient.

Run on a GPU:  python3 benchmarks/probes/bwd_race.py [--repeats 1500] [--dims 128,64]
                   [--pairs 4096:0,0:0] [--modes library,ws-dkdv,plain-dkdv]

The ring adds each block pair's dK/dV and dQ into float32 buffers. In triton 3.6 the warp-specialized
dK/dV kernel raced (NaN in repeated ring replays: adding into the caller's buffer in session 5, and
still, more rarely, into fresh buffers in session 20). Modes: ``library`` (the table as it is),
``ws-dkdv`` / ``plain-dkdv`` (the dK/dV kernel forced warp-specialized / plain), ``gluon-dkdv``
(the Gluon dK/dV kernel, ``attention_bwd_gluon``), ``ws`` / ``plain``
(both backward kernels). Pairs as tests/test_attention_kernels.py's ``test_gpu_ring_pairs_repeatable``:
4K x 4K, bf16, GQA 16/8, causal, given as q_offset:k_offset (4096:0: every key visible; 0:0 the
diagonal). Prints counts per (D, pair, mode) and the seconds each mode's loop took.
"""
from __future__ import annotations

import argparse
import time

import torch

from ringsoftmax.kernels import attention_config
from ringsoftmax.kernels.attention_bwd import attention_bwd, attention_delta
from ringsoftmax.kernels.attention_fwd import attention_fwd

MODES = {"library": {}, "ws-dkdv": dict(dkdv_warp_spec=True), "plain-dkdv": dict(dkdv_warp_spec=False),
         "gluon-dkdv": dict(dkdv_gluon=True),
         "ws": dict(bwd_warp_spec=True), "plain": dict(bwd_warp_spec=False)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1500)
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--pairs", default="4096:0,0:0", help="q_offset:k_offset,...")
    ap.add_argument("--modes", default="library,ws-dkdv,plain-dkdv")
    args = ap.parse_args()
    dev, n = torch.device("cuda"), 4096
    print(torch.cuda.get_device_name(), torch.__version__)
    print("D | pair (q at, k at) | mode | calls | non-finite dq / dk / dv | differing dq / dk / dv | s")
    for D in map(int, args.dims.split(",")):
        gen = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(1, n, 16, D, device=dev, generator=gen).to(torch.bfloat16)
        k, v, dout = (torch.randn(1, n, h, D, device=dev, generator=gen).to(torch.bfloat16) for h in (8, 8, 16))
        for q_off, k_off in (map(int, p.split(":")) for p in args.pairs.split(",")):
            kw = dict(softmax_scale=D ** -0.5, causal=True, q_offset=q_off, k_offset=k_off)
            out, lse = attention_fwd(q, k, v, **kw)
            delta = attention_delta(out, dout)
            for mode in args.modes.split(","):
                bad, diff, first = [0, 0, 0], [0, 0, 0], None
                t0 = time.time()
                with attention_config.override(**MODES[mode]):
                    for _ in range(args.repeats):
                        grads = [torch.ones(t.shape, dtype=torch.float32, device=dev) for t in (q, k, v)]
                        attention_bwd(q, k, v, out, dout, lse, delta, dq=grads[0], dk=grads[1], dv=grads[2], **kw)
                        for i, g in enumerate(grads):
                            bad[i] += int(not torch.isfinite(g).all())
                            diff[i] += int(first is not None and not torch.equal(first[i], g))
                        if first is None and all(torch.isfinite(g).all() for g in grads):
                            first = grads
                print(f"{D} | ({q_off}, {k_off}) | {mode} | {args.repeats} | {' / '.join(map(str, bad))} | "
                      f"{' / '.join(map(str, diff))} | {time.time() - t0:.1f}", flush=True)


if __name__ == "__main__":
    main()
