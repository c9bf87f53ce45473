"""Probe: split rows too long to keep on chip: the library (leading columns held by the staged
kernel, the rest two-pass: ``softmax_held``) against the two-pass path alone, the two-pass second
pass over the inputs in the first pass's order or reversed (``softmax_fwd.STREAM_SECOND_PASS_REVERSED``),
the forward's exponentials plain or flushed to zero (``STREAM_EXP_FTZ``), its exponents as a
subtraction and a multiply (``STREAM_FMA_EXP`` off) and its tiles masked where they cover the rows
exactly (``STREAM_EXACT`` off), beside torch.compile's softmax, all timed in turn for ``--rounds``
rounds (medians).

Run on a GPU:  python3 benchmarks/probes/softmax_two_pass.py [--sizes 4194304,16777216] [--rounds 5]
               [--variants library,two-pass,same order,plain exp]

M = 2^28 / N rows. Prints GB/s (forward 2 * bytes(x) / t, backward 3 * bytes(x) / t), % of a
device-to-device copy, ratios to torch.compile and each variant's largest error against float64 on
the first rows.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from softmax_staged import DTYPES, bench, copy_gbs  # same folder: the staged probe's helpers
from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F
from ringsoftmax.kernels import softmax_held as H

#: knob -> the module that holds it
KNOBS = {"STREAM_SECOND_PASS_REVERSED": F, "STREAM_EXP_FTZ": F, "STREAM_FMA_EXP": F, "STREAM_EXACT": F,
         "STREAM_TILE": F, "STREAM_ELEMS_PER_THREAD": F, "HELD_MIN_SHARE": H, "HELD_FILL": H, "HELD_MIN_BYTES": H}
NO_HELD = dict.fromkeys(H.HELD_MIN_SHARE)  # the held path off
LIBRARY = {k: getattr(mod, k) for k, mod in KNOBS.items()}
#: name -> the knobs it changes from the library's defaults
VARIANTS = {"library": {}, "two-pass": {"HELD_MIN_SHARE": NO_HELD},
            "held": {"HELD_MIN_SHARE": dict.fromkeys(H.HELD_MIN_SHARE, 0.0), "HELD_MIN_BYTES": 0},
            "same order": {"STREAM_SECOND_PASS_REVERSED": False, "HELD_MIN_SHARE": NO_HELD},
            "plain exp": {"STREAM_EXP_FTZ": False, "HELD_MIN_SHARE": NO_HELD},
            "sub-mul exponents": {"STREAM_FMA_EXP": False, "STREAM_EXACT": False, "HELD_MIN_SHARE": NO_HELD},
            "masked tiles": {"STREAM_EXACT": False, "HELD_MIN_SHARE": NO_HELD}}


def with_knobs(knobs: dict, fn):
    """fn run with the library's knobs changed by ``knobs``."""
    def run():
        for k, v in {**LIBRARY, **knobs}.items():
            setattr(KNOBS[k], k, v)
        return fn()
    return run


def tile_variants(spec: str, bases=("library",)) -> dict:
    """'2:4096:16,...' (element size, tile elements, elements per thread) -> streaming tile variants,
    each on top of the knobs of every variant named in ``bases``."""
    out = {}
    for base in bases:
        for c in spec.split(","):
            elem, tile, per = map(int, c.split(":"))
            out[f"tile {tile} x {per}/thread ({elem} B)" + ("" if base == "library" else f", {base}")] = {
                **VARIANTS[base], "STREAM_TILE": {**LIBRARY["STREAM_TILE"], elem: tile},
                "STREAM_ELEMS_PER_THREAD": {**LIBRARY["STREAM_ELEMS_PER_THREAD"], elem: per}}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4194304,16777216,67108864")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tiles", default="", help="streaming tile variants, 'elem:tile:per_thread,...'")
    ap.add_argument("--tile-bases", default="library", help="the variants the tile variants start from")
    ap.add_argument("--variants", default="library,two-pass", help="names from VARIANTS, comma-separated")
    ap.add_argument("--fills", default="", help="held-path variants by HELD_FILL, e.g. 0.8,0.9")
    ap.add_argument("--no-peer", action="store_true", help="leave torch.compile out (no compile per shape)")
    args = ap.parse_args()
    chosen = {name: VARIANTS[name] for name in args.variants.split(",")}
    chosen.update({f"fill {f}": {"HELD_FILL": {"fwd": float(f), "bwd": float(f)},
                                 "HELD_MIN_SHARE": dict.fromkeys(H.HELD_MIN_SHARE, 0.0), "HELD_MIN_BYTES": 0}
                   for f in filter(None, args.fills.split(","))})
    if args.tiles:
        chosen.update(tile_variants(args.tiles, args.tile_bases.split(",")))
    VARIANTS.clear()
    VARIANTS.update(chosen)
    torch._dynamo.config.cache_size_limit = 64
    peer = torch.compile(lambda x: torch.softmax(x, -1), dynamic=False)
    copy = copy_gbs()
    print(f"copy {copy:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__}")
    print("N | M | dtype | dir | variant | GB/s | % copy | / torch.compile (--no-peer: / the first variant) | "
          "max err (first rows) | rounds' range")
    for dname in args.dtypes.split(","):
        for n in map(int, args.sizes.split(",")):
            m = max(1, (1 << 28) // n)
            x = torch.randn(m, n, device="cuda").mul_(3).to(DTYPES[dname])
            dy = torch.randn_like(x)
            y = F.softmax_fwd(x, with_lse=False)[0]
            xx = x.detach().clone().requires_grad_()
            if args.no_peer:  # ratios to the first variant
                calls = {}
            else:
                py = peer(xx)
                calls = {("fwd", "compile"): lambda: peer(x),
                         ("bwd", "compile"): lambda: torch.autograd.grad(py, xx, dy, retain_graph=True)}
            errs = {}
            rows = slice(0, min(m, 2))
            ref_y = torch.softmax(x[rows].double(), -1)
            yd, dyd = y[rows].double(), dy[rows].double()
            ref_dx = yd * (dyd - (yd * dyd).sum(-1, keepdim=True))
            for name, knobs in VARIANTS.items():
                calls[("fwd", name)] = with_knobs(knobs, lambda: F.softmax_fwd(x, with_lse=False))
                calls[("bwd", name)] = with_knobs(knobs, lambda: B.softmax_bwd(y, dy))
                out = calls[("fwd", name)]()[0]
                errs[("fwd", name)] = (out[rows].double() - ref_y).abs().max().item()
                out = calls[("bwd", name)]()
                errs[("bwd", name)] = (out[rows].double() - ref_dx).abs().max().item()
            times = {k: [] for k in calls}
            for _ in range(args.rounds):
                for k, f in calls.items():
                    times[k].append(bench(f))
            nb = x.numel() * x.element_size()
            for direction, mult in (("fwd", 2), ("bwd", 3)):
                base = "compile" if (direction, "compile") in times else next(iter(VARIANTS))
                peer_t = statistics.median(times[(direction, base)])
                for name in ("compile", *VARIANTS) if base == "compile" else VARIANTS:
                    t = statistics.median(times[(direction, name)])
                    g = mult * nb / t / 1e6
                    err = f"{errs[(direction, name)]:.1e}" if (direction, name) in errs else "-"
                    spread = f"{min(times[(direction, name)]):.3f}-{max(times[(direction, name)]):.3f} ms"
                    print(f"{n} | {m} | {dname} | {direction} | {name} | {g:.0f} | {100 * g / copy:.1f} | "
                          f"{peer_t / t:.3f}x | {err} | {spread}", flush=True)
            print(f"waits given up so far: {F.sync_failures('cuda')}", flush=True)
            del x, dy, y, xx
            torch.cuda.empty_cache()
    with_knobs({}, lambda: None)()


if __name__ == "__main__":
    main()
