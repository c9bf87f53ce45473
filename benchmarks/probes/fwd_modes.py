"""Probe (issue 4): the attention forward's modes and tiles side by side, one GPU, one run.

Modes of ``attention_fwd`` (``attention_config.override``):
  plain      the two-loop kernel (TMA loads where the table says so), no warp specialization;
             plain-tma, plain-ptr: loads through descriptors, through pointers;
  ws-resume  warp-specialized over the unmasked tiles, then (if any tile needs a mask) a launch
             for the masked ones resuming from a float32 (out, lse), at any length;
  pers       warp-specialized and persistent (one program per multiprocessor walking the query
             tiles), with resume from the table's key count; pers-resume: at any length;
  table      what the table picks (warp-specialized with resume only from 16K keys);
and, per ``--tiles``, a mode per extra tile: ``fwd:M,N,W,S`` (the plain kernel in that tile) or
``fws:M,N,W,S`` (warp-specialized in that tile, with resume).
(A third mode, one warp-specialized loop over every visible tile with each tile masked, measured
2-10% below the better of plain and ws-resume for causal D=128 at 4K-32K, and was removed:
logs/2026-11-22-h200-attention-s4-callA.log; persistent, it did no better in session 7:
logs/2026-11-22-h200-attention-s7-fwd-modes-repeat3.log, modes ws-all and pers-all. The plain
kernel persistent, 1 or 2 programs per multiprocessor: D=128 full +1-3% at 4K-8K (far below the
warp-specialized table), causal 2-7% slower, D=64 25-30% slower:
logs/2026-11-22-h200-attention-s7-fwd-persistent-plain.log; not kept.)
Cells: head dims x masks (full, causal = the diagonal block, past = causal with every key before
every query: a ring step) x tokens per sequence, B*S = 32K tokens, 16 heads, bf16. SDPA cuDNN in
the same run. Prints TFLOP/s (causal counts half the work), each mode's error against cuDNN, and
the best mode's ratio to cuDNN. ``--repeat R`` times every mode R times in rotation (cuDNN too)
and prints the medians, so that slow drifts of the clock hit all modes alike.

    PYTHONPATH=$PWD python3 benchmarks/probes/fwd_modes.py --seqlens 4096,32768 --dims 64,128 \\
        --masks full,causal --tiles fwd:128,128,8,3 fws:128,64,4,3
"""
import argparse

import torch
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from ringsoftmax.kernels import attention_config as config
from ringsoftmax.kernels.attention_fwd import attention_fwd

MODES = {"plain": dict(fwd_warp_spec=False, fwd_persistent=False),
         "plain-tma": dict(fwd_warp_spec=False, fwd_persistent=False, fwd_tma=True),
         "plain-ptr": dict(fwd_warp_spec=False, fwd_persistent=False, fwd_tma=False),
         "ws-resume": dict(fwd_warp_spec=True, fwd_persistent=False, fwd_resume_min_keys=0),
         "pers": dict(fwd_persistent=True),
         "pers-resume": dict(fwd_persistent=True, fwd_resume_min_keys=0),
         "table": {}}


def tile_modes(specs):
    """Extra modes from ``fwd:M,N,W,S`` / ``fws:M,N,W,S`` strings."""
    modes = {}
    for spec in specs:
        kind, numbers = spec.split(":")
        tile = config.Tile(*map(int, numbers.split(",")))
        if kind == "fwd":
            modes[spec] = dict(fwd_warp_spec=False, fwd=tile)
        elif kind == "fws":
            modes[spec] = dict(fwd_warp_spec=True, fwd_resume_min_keys=0, fwd_ws=tile)
        else:
            raise SystemExit(f"--tiles: unknown kind {kind!r} in {spec!r} (fwd or fws)")
    return modes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", default="4096,16384,32768")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--masks", default="full,causal,past")
    ap.add_argument("--modes", default="plain,ws-resume,pers,pers-resume,table")
    ap.add_argument("--tiles", nargs="*", default=[])
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    modes = {m: MODES[m] for m in args.modes.split(",") if m} | tile_modes(args.tiles)
    H = 16
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; TFLOP/s (err vs cuDNN)")
    print("D   S      mask   | cudnn | " + " | ".join(modes) + " | best/cudnn (mode)", flush=True)
    for D in map(int, args.dims.split(",")):
        for S in map(int, args.seqlens.split(",")):
            B = max(1, 32768 // S)
            for mask in args.masks.split(","):
                g = torch.Generator(device="cuda").manual_seed(S + D)
                q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
                causal = mask != "full"
                q_off = S if mask == "past" else 0   # keys 0..S-1, queries S..2S-1: all visible
                flops = 4 * B * H * S * S * D * (0.5 if mask == "causal" else 1.0)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    ref = torch.nn.functional.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=mask == "causal").transpose(1, 2).float()

                def cudnn():
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=mask == "causal")

                def ours(ov):
                    with config.override(**ov):
                        return attention_fwd(q, k, v, softmax_scale=D ** -0.5, causal=causal, q_offset=q_off)

                fns, cells = {"cudnn": cudnn}, {}
                for name, ov in modes.items():
                    try:
                        out = ours(ov)[0].float()
                    except Exception as e:  # a tile that does not compile or fit: show it, go on
                        cells[name] = f"{type(e).__name__}"
                        continue
                    cells[name] = f"({((out - ref).norm() / ref.norm()).item():.0e})"
                    fns[name] = (lambda ov=ov: ours(ov))
                times = {name: [] for name in fns}
                for _ in range(args.repeat):
                    for name, fn in fns.items():
                        times[name].append(triton.testing.do_bench(fn, rep=200))
                tf = {name: flops / sorted(t)[len(t) // 2] / 1e9 for name, t in times.items()}
                ref_tf = tf.pop("cudnn")
                best_mode = max(tf, key=tf.get)
                best = tf[best_mode]
                cells = [f"{tf[name]:4.0f} {cells[name]}" if name in tf else cells[name] for name in modes]
                print(f"{D:<4}{S:<7}{mask:<7}| {ref_tf:4.0f} | " + " | ".join(cells)
                      + f" | {best / ref_tf:.2f} ({best_mode})", flush=True)


if __name__ == "__main__":
    main()
