"""Probe (issue 4): the block-pair forward/backward calls one rank of a ring makes, on one GPU.

Replays rank 0's ring steps of ``ring_attention`` (zigzag, causal, world 2 by default) without
communication: for every step, the (query segment, key segment) pairs that ``ring.py`` passes to
``attention_fwd`` (float32 out, then the merge) and ``attention_bwd``, timed per kernel mode. Shows
which forward path each call took. bf16, 16 heads, 8 KV heads, head dim 128.

    python benchmarks/probes/ring_steps.py [global_seqlen ...]
"""
import sys

import torch
import triton.testing

from ringsoftmax.kernels import attention_config as config
from ringsoftmax.kernels import attention_fwd as fwd_module
from ringsoftmax.kernels.attention_bwd import attention_bwd, attention_delta
from ringsoftmax.merge import merge_
from ringsoftmax.ring import _blocks, _mask_args, _visible_pairs

MODES = {"default": {}, "no fwd WS": dict(fwd_warp_spec=False), "no WS": dict(fwd_warp_spec=False, bwd_warp_spec=False),
         "no WS, no TMA": dict(fwd_warp_spec=False, bwd_warp_spec=False, fwd_tma=False)}


def main():
    world, H, Hkv, D, layout = 2, 16, 8, 128, "zigzag"
    paths, real = [], fwd_module.launch

    def recording(kernel, grid, args, kwargs, *rest, **kw):
        paths.append("ws" if kwargs.get("WARP_SPEC") else "rest" if kwargs.get("RESUME") else "plain")
        return real(kernel, grid, args, kwargs, *rest, **kw)
    fwd_module.launch = recording
    for S in [int(x) for x in sys.argv[1:]] or [16384, 65536]:
        n = S // world
        q = torch.randn(1, n, H, D, device="cuda", dtype=torch.bfloat16)
        kv = [torch.randn(1, n, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        do = torch.randn_like(q)
        q_segs = _blocks(layout, n, 0, world, True)
        pairs = [(qs, ks) for src in range(world) for qs, ks in _visible_pairs(q_segs, _blocks(layout, n, src, world, True), True)]

        def fwd():
            out = torch.zeros(1, n, H, D, dtype=torch.float32, device="cuda")
            lse = torch.full((1, H, n), float("-inf"), dtype=torch.float32, device="cuda")
            for qs, ks in pairs:
                o, l = fwd_module.attention_fwd(q[:, qs.local], kv[0][:, ks.local], kv[1][:, ks.local],
                                                out_dtype=torch.float32, **_mask_args(qs, ks, True, D ** -0.5))
                merge_(out[:, qs.local], lse[:, :, qs.local], o, l)
            return out, lse

        out, lse = fwd()
        delta = attention_delta(out, do)
        dq = torch.zeros(q.shape, dtype=torch.float32, device="cuda")
        dk, dv = (torch.zeros(kv[0].shape, dtype=torch.float32, device="cuda") for _ in range(2))

        def bwd():
            for qs, ks in pairs:
                attention_bwd(q[:, qs.local], kv[0][:, ks.local], kv[1][:, ks.local], out[:, qs.local], do[:, qs.local],
                              lse[:, :, qs.local], delta[:, :, qs.local], dq=dq[:, qs.local], dk=dk[:, ks.local],
                              dv=dv[:, ks.local], **_mask_args(qs, ks, True, D ** -0.5))
        print(f"S={S} (per rank {n}), {len(pairs)} block pairs: " +
              ", ".join(f"{qs.local.stop - qs.local.start}x{ks.local.stop - ks.local.start}" for qs, ks in pairs))
        for name, ov in MODES.items():
            with config.override(**ov):
                paths.clear()
                fwd()
                ran = ",".join(paths)
                t_f = triton.testing.do_bench(fwd, rep=200)
                t_b = triton.testing.do_bench(bwd, rep=200)
            print(f"  {name:<14} fwd {t_f:7.3f} ms  bwd {t_b:7.3f} ms   fwd paths: {ran}", flush=True)


if __name__ == "__main__":
    main()
