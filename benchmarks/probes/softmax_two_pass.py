"""Probe: the two-pass split rows (rows too long to keep on chip) with the second pass over the inputs
in the first pass's order or reversed (``softmax_fwd.STREAM_SECOND_PASS_REVERSED``), beside
torch.compile's softmax, all timed in turn for ``--rounds`` rounds (medians).

Run on a GPU:  python3 benchmarks/probes/softmax_two_pass.py [--sizes 4194304,16777216] [--rounds 5]

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


def with_order(reversed_: bool, fn):
    """fn run with the second pass in the given order."""
    def run():
        F.STREAM_SECOND_PASS_REVERSED = reversed_
        return fn()
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4194304,16777216,67108864")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch._dynamo.config.cache_size_limit = 64
    peer = torch.compile(lambda x: torch.softmax(x, -1), dynamic=False)
    copy = copy_gbs()
    print(f"copy {copy:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__}")
    print("N | M | dtype | dir | variant | GB/s | % copy | / torch.compile | max err (first rows)")
    for dname in args.dtypes.split(","):
        for n in map(int, args.sizes.split(",")):
            m = max(1, (1 << 28) // n)
            x = torch.randn(m, n, device="cuda").mul_(3).to(DTYPES[dname])
            dy = torch.randn_like(x)
            y = F.softmax_fwd(x, with_lse=False)[0]
            xx = x.detach().clone().requires_grad_()
            py = peer(xx)
            calls = {("fwd", "compile"): lambda: peer(x),
                     ("bwd", "compile"): lambda: torch.autograd.grad(py, xx, dy, retain_graph=True)}
            errs = {}
            rows = slice(0, min(m, 2))
            ref_y = torch.softmax(x[rows].double(), -1)
            yd, dyd = y[rows].double(), dy[rows].double()
            ref_dx = yd * (dyd - (yd * dyd).sum(-1, keepdim=True))
            for order, name in ((True, "reversed"), (False, "same order")):
                calls[("fwd", name)] = with_order(order, lambda: F.softmax_fwd(x, with_lse=False))
                calls[("bwd", name)] = with_order(order, lambda: B.softmax_bwd(y, dy))
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
                peer_t = statistics.median(times[(direction, "compile")])
                for name in ("compile", "reversed", "same order"):
                    t = statistics.median(times[(direction, name)])
                    g = mult * nb / t / 1e6
                    err = f"{errs[(direction, name)]:.1e}" if (direction, name) in errs else "-"
                    print(f"{n} | {m} | {dname} | {direction} | {name} | {g:.0f} | {100 * g / copy:.1f} | "
                          f"{peer_t / t:.3f}x | {err}", flush=True)
            del x, dy, y, xx, py
            torch.cuda.empty_cache()
    F.STREAM_SECOND_PASS_REVERSED = True


if __name__ == "__main__":
    main()
