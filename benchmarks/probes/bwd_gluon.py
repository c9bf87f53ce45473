"""Probe (issue 4): the Gluon dK/dV kernel against the Triton ones, one GPU, one run.

1. Values: dK, dV of the Gluon kernel against the plain Triton kernel (float32 gradients, added into
   buffers of ones as the ring does, and written fresh), on odd lengths and every unit-stride
   ring-step mask, GQA, bf16 and fp16, D = 64 and 128; prints the largest difference relative to
   the largest gradient.
2. Speed: the backward (dQ kernel included, the same in every mode) with dK/dV plain, by Triton's
   warp specialization, and by the Gluon kernel in each ``--configs`` variant
   (block_m:stages:registers), B * S = 32K tokens, 16 heads, bf16; TFLOP/s at 2.5x the forward's FLOPs
   (causal counts half), medians of ``--rounds`` rounds taken in turn.

    PYTHONPATH=$PWD python3 benchmarks/probes/bwd_gluon.py [--seqlens 4096,32768] [--dims 128,64]
        [--configs "128=64:2:240;64=64:3:240"] [--rounds 3] [--skip-values] [--modules name=path,...]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.testing

from module_copies import load_copies  # same folder
from ringsoftmax.kernels import attention_bwd_gluon as gluon_bwd
from ringsoftmax.kernels import attention_config as config
from ringsoftmax.kernels.attention_bwd import attention_bwd, attention_delta
from ringsoftmax.kernels.attention_fwd import attention_fwd


def masks(Sq, Sk):
    """(causal, q_offset, k_offset): full, diagonal, keys in the past, keys in the future, partial."""
    return [(False, 0, 0), (True, 0, 0), (True, Sk + 64, 0), (True, 0, Sq + 1), (True, Sq // 3, Sq // 2)]


def values(dev):
    print("dtype | D | H/Hkv | Sq x Sk | causal, q_off, k_off | accumulate | dk err | dv err | dq err")
    worst, launches, real = 0.0, [], gluon_bwd.launch
    gluon_bwd.launch = lambda *a, **kw: (launches.append(1), real(*a, **kw))
    for dtype, D, H, Hkv in ((torch.bfloat16, 128, 8, 2), (torch.bfloat16, 64, 4, 4), (torch.float16, 128, 4, 1),
                             (torch.float16, 64, 8, 1)):
        for Sq, Sk in ((301, 517), (77, 3000), (4100, 4100))[:3 if dtype == torch.bfloat16 else 1]:
            q = torch.randn(2, Sq, H, D, device=dev).mul(1.5).to(dtype)
            k = torch.randn(2, Sk, Hkv, D, device=dev).mul(1.5).to(dtype)
            v = torch.randn(2, Sk, Hkv, D, device=dev).to(dtype)
            dout = torch.randn(2, Sq, H, D, device=dev).to(dtype)
            for causal, q_off, k_off in masks(Sq, Sk):
                kw = dict(softmax_scale=D ** -0.5, causal=causal, q_offset=q_off, k_offset=k_off)
                out, lse = attention_fwd(q, k, v, **kw)
                delta = attention_delta(out, dout)
                for acc in (False, True):
                    res = []
                    for use in (False, True):
                        with config.override(dkdv_gluon=use):
                            if acc:
                                bufs = [torch.ones(t.shape, dtype=torch.float32, device=dev) for t in (q, k, v)]
                                g = attention_bwd(q, k, v, out, dout, lse, delta, dq=bufs[0], dk=bufs[1],
                                                  dv=bufs[2], **kw)
                            else:
                                g = attention_bwd(q, k, v, out, dout, lse, delta, **kw)
                        res.append([x.clone() for x in g])
                    errs = []
                    for a, b in zip(res[0], res[1]):
                        scale = a.abs().max().clamp_min(1e-6)
                        errs.append(float((a - b).abs().max() / scale) if torch.isfinite(b).all() else float("nan"))
                    worst = max([worst] + [e if e == e else float("inf") for e in errs])
                    print(f"{str(dtype)[6:]} | {D} | {H}/{Hkv} | {Sq}x{Sk} | {causal}, {q_off}, {k_off} | {acc} | "
                          f"{errs[1]:.1e} | {errs[2]:.1e} | {errs[0]:.1e}", flush=True)
    gluon_bwd.launch = real
    print(f"worst relative difference: {worst:.2e}; Gluon launches: {len(launches)}", flush=True)


def speed(dev, seqlens, dims, configs, rounds, copies):
    bench = lambda f: triton.testing.do_bench(f, warmup=10, rep=50, return_mode="median")  # noqa: E731
    print("D | causal | S | mode | bwd TFLOP/s (median) | rounds")
    for D in dims:
        for S in seqlens:
            B, H = max(1, 32768 // S), 16
            q, k, v, dout = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
            for causal in (False, True):
                kw = dict(softmax_scale=D ** -0.5, causal=causal)
                out, lse = attention_fwd(q, k, v, **kw)
                delta = attention_delta(out, dout)
                flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
                modes = {"plain": dict(dkdv_gluon=False, dkdv_warp_spec=False),
                         "triton ws": dict(dkdv_warp_spec=True)}
                for cfg in configs.get(D, [gluon_bwd.CONFIG[D]]):
                    modes[f"gluon {cfg[0]}:{cfg[1]}:{cfg[2]}"] = dict(dkdv_gluon=True, _cfg=cfg)
                for name in copies:
                    modes[f"gluon, module {name}"] = dict(dkdv_gluon=True, _module=name)
                times = {m: [] for m in modes}
                saved, library_launch = dict(gluon_bwd.CONFIG), gluon_bwd.launch
                for _ in range(rounds):
                    for m, ov in modes.items():
                        ov = dict(ov)
                        cfg = ov.pop("_cfg", None)
                        if cfg:
                            gluon_bwd.CONFIG[D] = cfg
                        module = ov.pop("_module", None)
                        if module:   # (attention_bwd calls gluon_bwd.launch)
                            gluon_bwd.launch = copies[module].launch
                        with config.override(**ov):
                            times[m].append(bench(lambda: attention_bwd(q, k, v, out, dout, lse, delta, **kw)))
                        gluon_bwd.CONFIG.update(saved)
                        gluon_bwd.launch = library_launch
                for m, ts in times.items():
                    print(f"{D} | {causal} | {S} | {m} | {flops / statistics.median(ts) / 1e9:.0f} | "
                          f"{' '.join(f'{flops / t / 1e9:.0f}' for t in ts)}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="4096,32768")
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--configs", default="", help="D=block_m:stages:regs;... e.g. 128=64:2:240;128=64:3:240")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-values", action="store_true")
    ap.add_argument("--modules", default="", help="name=path,...: other copies of attention_bwd_gluon (their launch)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    configs = {}
    for item in filter(None, args.configs.split(";")):
        d, cfg = item.split("=")
        configs.setdefault(int(d), []).append(tuple(map(int, cfg.split(":"))))
    speed(dev, list(map(int, args.seqlens.split(","))), list(map(int, args.dims.split(","))), configs, args.rounds,
          load_copies(args.modules))
    if not args.skip_values:
        values(dev)


if __name__ == "__main__":
    main()
