"""Probe: variants of the Gluon attention forward against the library forward (with and without it) and cuDNN.

Run on a GPU:  python3 benchmarks/probes/fa_gluon_probe.py [--seqlens 4096,8192,32768] [--dims 128,64]
                   [--configs 128:2:232:1,128:2:232:0]
                   (block_n:stages:compute registers[:persistent[:split[:block_m]]], block_m 128 unless given)
                   [--causal 0,1]
``--modules name=path,...`` also times other copies of the kernel module (e.g. a commit's version),
each with its own defaults; ``--rounds R`` times the variants in turn R times and prints medians;
``--inputs rising`` makes every key tile raise each row's max (the worst case for a lazy rescale).
bf16, 16 heads, B * S = 32K tokens. Prints TFLOP/s (causal counts half) and each output's largest
difference from cuDNN's, and lse's from the library's Triton kernels.
"""
from __future__ import annotations

import argparse
import functools
import statistics

import torch
import triton

from module_copies import load_copies  # same folder


def main():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ringsoftmax.kernels.attention_fwd import attention_fwd
    from ringsoftmax.kernels import attention_config
    from ringsoftmax.kernels import attention_fwd_gluon as gluon_fwd
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="4096,8192,32768")
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--configs", default="128:2:232:1,128:2:232:0")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--causal", default="0,1", help="causal values to run (0, 1 or both)")
    ap.add_argument("--modules", default="")
    ap.add_argument("--rounds", type=int, default=1, help="timing rounds, variants in turn (medians)")
    ap.add_argument("--inputs", default="randn", choices=("randn", "rising"),
                    help="rising: scores grow along the keys, every key tile raises each row's max")
    args = ap.parse_args()
    others = load_copies(args.modules)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    bench = lambda f: triton.testing.do_bench(f, warmup=10, rep=60, return_mode="median")  # noqa: E731
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    print("D | causal | S | variant | TFLOP/s | out err vs cuDNN | lse err vs library")
    for D in map(int, args.dims.split(",")):
        for S in map(int, args.seqlens.split(",")):
            B, H = max(1, 32768 // S), args.heads
            q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            if args.inputs == "rising":   # q ~ 20, k_j ~ 20 j / S: each row max rises > 2^15 per 128 keys (4K-32K)
                ramp = torch.arange(S, device="cuda", dtype=torch.float32) * (20.0 / S)
                q = (q.float() * 0.1 + 20.0).to(torch.bfloat16)
                k = (k.float() * 0.1 + ramp[None, :, None, None]).to(torch.bfloat16)
            for causal in (bool(int(c)) for c in args.causal.split(",")):
                flops = 4 * B * H * S * S * D / (2 if causal else 1)
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    sd = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
                    ref = sd().transpose(1, 2).float()
                    t = bench(sd)
                print(f"{D} | {causal} | {S} | cudnn | {flops / t / 1e9:.0f} | - | -", flush=True)
                lib = lambda: attention_fwd(q, k, v, softmax_scale=D ** -0.5, causal=causal)  # noqa: E731
                for name, use in (("library", None), ("library, Triton kernels", False)):
                    with attention_config.override(**({} if use is None else dict(fwd_gluon=use))):
                        t = bench(lib)
                        out, lse_ref = lib()
                    print(f"{D} | {causal} | {S} | {name} | {flops / t / 1e9:.0f} | "
                          f"{(out.float() - ref).abs().max().item():.1e} | -", flush=True)
                out, lse = torch.empty_like(q), torch.empty(B, H, S, device="cuda")
                qk_scale = D ** -0.5 * 1.4426950408889634
                variants = [(f"module {mname}", functools.partial(mod.launch, q, k, v, out, lse, qk_scale=qk_scale,
                                                                   causal=causal))
                            for mname, mod in others.items()]
                for cfg in filter(None, args.configs.split(",")):
                    bn, st, regs, pers, split, bm = (list(map(int, cfg.split(":"))) + [1, 1, 128][cfg.count(":") - 2:])
                    variants.append((f"gluon {bm}x{bn} st{st} r{regs}" + (" persistent" if pers else " grid of units")
                                     + (" split" if split and pers else ""),
                                     functools.partial(gluon_fwd.launch, q, k, v, out, lse, qk_scale=qk_scale,
                                                       causal=causal, block_m=bm, block_n=bn, stages=st,
                                                       consumer_regs=regs, persistent=bool(pers),
                                                       split=bool(split))))
                # check each variant once, then time them in turn for --rounds rounds (medians)
                ok, times = {}, {}
                for name, f in variants:
                    try:
                        f()
                        torch.cuda.synchronize()
                        ok[name] = (f"{(out.float() - ref).abs().max().item():.1e} | "
                                    f"{(lse - lse_ref).abs().max().item():.1e}")
                        times[name] = []
                    except Exception as e:  # noqa: BLE001 - report and go on
                        print(f"{D} | {causal} | {S} | {name} | error {type(e).__name__}: {str(e)[:300]}", flush=True)
                for _ in range(args.rounds):
                    for name, f in variants:
                        if name in times:
                            times[name].append(bench(f))
                for name in times:
                    t = statistics.median(times[name])
                    print(f"{D} | {causal} | {S} | {name} | {flops / t / 1e9:.0f} | {ok[name]}", flush=True)

if __name__ == "__main__":
    main()
