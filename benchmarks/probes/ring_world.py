"""Probe: every rank's block-pair calls of a ring_attention step sequence, on one GPU, checked.

Replays the forward and backward block calls that ``ring.py`` makes on each of ``world`` ranks
(zigzag, causal), without communication: out/lse merged per rank, dq per rank, dk/dv accumulated
per source shard as the travelling buffers would be. After every backward call it checks the
buffers for NaN/inf and prints the first call that made one; at the end it compares with float32
attention (torch SDPA). Kernel modes via attention_config.override.

    python benchmarks/probes/ring_world.py [--world 4] [--seqlen 16384] [--repeats 3]
"""
import argparse

import torch

from ringsoftmax.kernels import attention_config as config
from ringsoftmax.kernels.attention_bwd import attention_bwd, attention_delta
from ringsoftmax.kernels.attention_fwd import attention_fwd
from ringsoftmax.layouts import shard_for, unshard_from
from ringsoftmax.merge import merge_
from ringsoftmax.ring import _blocks, _mask_args, _visible_pairs

MODES = {"default": {}, "no WS": dict(fwd_warp_spec=False, bwd_warp_spec=False),
         "dkdv WS 1st": dict(dkdv_warp_spec=True, dkdv_ws=config.Tile(64, 128, 4, 1)),
         "dq WS only": dict(dkdv_warp_spec=False, dq_warp_spec=True)}


def reference(q, k, v, do, scale):
    """float32 causal attention (torch SDPA) and its gradients; q (B, S, H, D), k/v (B, S, Hkv, D)."""
    q32, k32, v32 = (t.float().transpose(1, 2).requires_grad_() for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, is_causal=True, scale=scale,
                                                           enable_gqa=True)
    out.backward(do.float().transpose(1, 2))
    return tuple(t.transpose(1, 2).detach() for t in (out, q32.grad, k32.grad, v32.grad))


def run(world, S, H, Hkv, D, layout, q, k, v, do, scale, label):
    n = S // world
    qs_, ks_, vs_, dos_ = ([shard_for(t, 1, r, world, layout) for r in range(world)] for t in (q, k, v, do))
    outs, dqs = [], []
    dks = [torch.zeros(ks_[0].shape, dtype=torch.float32, device="cuda") for _ in range(world)]
    dvs = [torch.zeros_like(dks[0]) for _ in range(world)]
    first_bad = None
    for r in range(world):
        out = torch.zeros(1, n, H, D, dtype=torch.float32, device="cuda")
        lse = torch.full((1, H, n), float("-inf"), dtype=torch.float32, device="cuda")
        q_segs = _blocks(layout, n, r, world, True)
        steps = [(src, _visible_pairs(q_segs, _blocks(layout, n, src, world, True), True))
                 for src in [(r - i) % world for i in range(world)]]
        for src, pairs in steps:
            for qs, ks in pairs:
                o, l = attention_fwd(qs_[r][:, qs.local], ks_[src][:, ks.local], vs_[src][:, ks.local],
                                     out_dtype=torch.float32, **_mask_args(qs, ks, True, scale))
                merge_(out[:, qs.local], lse[:, :, qs.local], o, l)
        out_lp = out.to(q.dtype)
        delta = attention_delta(out_lp, dos_[r])
        dq = torch.zeros(qs_[r].shape, dtype=torch.float32, device="cuda")
        for src, pairs in steps:
            for qs, ks in pairs:
                attention_bwd(qs_[r][:, qs.local], ks_[src][:, ks.local], vs_[src][:, ks.local],
                              out_lp[:, qs.local], dos_[r][:, qs.local], lse[:, :, qs.local],
                              delta[:, :, qs.local], dq=dq[:, qs.local], dk=dks[src][:, ks.local],
                              dv=dvs[src][:, ks.local], **_mask_args(qs, ks, True, scale))
                bad = [name for name, t in (("dq", dq), ("dk", dks[src]), ("dv", dvs[src]))
                       if not torch.isfinite(t).all()]
                if bad and first_bad is None:
                    first_bad = (f"rank {r} src {src} q {qs} k {ks}: {bad} "
                                 f"(q rows {qs.local.stop - qs.local.start}, keys {ks.local.stop - ks.local.start})")
        outs.append(out_lp)
        dqs.append(dq)
    got = [unshard_from(t, 1, layout) for t in (outs, dqs, dks, dvs)]
    return got, first_bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--heads", default="16,8")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    H, Hkv = map(int, args.heads.split(","))
    D, S, world, layout = args.head_dim, args.seqlen, args.world, "zigzag"
    torch.manual_seed(0)
    q = torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, S, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    scale = D ** -0.5
    want = reference(q, k, v, do, scale)
    print(f"world {world} S {S} heads {H}/{Hkv} D {D} bf16 zigzag causal", flush=True)
    for name in args.modes.split(","):
        with config.override(**MODES[name]):
            first, changed, nonfinite = None, 0, 0
            for rep in range(args.repeats):
                got, bad = run(world, S, H, Hkv, D, layout, q, k, v, do, scale, name)
                same = first is None or all(torch.equal(a, b) for a, b in zip(got, first))
                first = got if first is None else first
                changed += not same
                nonfinite += bad is not None
                if rep == 0 or bad or not same:
                    errs = " ".join(f"{n} {((g.float() - w).norm() / w.norm()).item():.2e}"
                                    for n, g, w in zip(("out", "dq", "dk", "dv"), got, want))
                    print(f"{name:<10} run {rep}: {errs}   same bits as run 0: {same}   first non-finite: {bad}",
                          flush=True)
            print(f"{name:<10} {args.repeats} runs: {nonfinite} with NaN/inf, {changed} not bit-identical to run 0",
                  flush=True)


if __name__ == "__main__":
    main()
