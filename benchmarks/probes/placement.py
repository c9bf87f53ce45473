"""Probe: how much the backward's speed depends on where y and dy lie in memory, per knob variant.

Run on a GPU:
    python3 benchmarks/probes/placement.py --sizes 65537 --dtypes fp32 --pads 0,4,68,1024,-68 \
        --variant 'new=' --variant 'old=S.STAGED_CONFIG_SHIFTED = ...'

For each (N, M = 2^28 // N, dtype) and each pad P (KiB), y and dy are cut from one buffer with P KiB
between them (y first; a negative P: dy first; separate allocations of large tensors land 1 GiB apart
whatever lies between them, so the buffer sets the distance), filled (y a softmax of randn rows, dy randn), and every
variant (``name=statements`` as in ``knobs.py``) is checked against float64 and timed in turn for
``--rounds`` rounds (medians). Printed per placement: the distance dy - y in bytes (and modulo 2 MiB),
and each variant's % of a device-to-device copy (3 * bytes(y) / t).
"""
from __future__ import annotations

import argparse
import statistics

import torch

from knobs import knobs_set, snapshot  # same folder
from softmax_staged import DTYPES, bench, copy_gbs
from ringsoftmax.kernels import softmax_bwd as B


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="65537")
    ap.add_argument("--dtypes", default="fp32")
    ap.add_argument("--pads", default="0,4,68,1024,-68", help="KiB between y and dy (negative: dy first)")
    ap.add_argument("--variant", action="append", default=[], help="name=statements (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--elements", type=int, default=1 << 28)
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant) or {"library": ""}
    saved = snapshot()
    copy_ = copy_gbs()
    print(f"copy {copy_:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__}")
    print("dtype | N | M | pad KiB | dy - y bytes | mod 2 MiB | " + " | ".join(f"{v} % copy" for v in variants)
          + " | max err")
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        for n in map(int, args.sizes.split(",")):
            m = max(1, args.elements // n)
            for pad in map(int, args.pads.split(",")):
                size = m * n * torch.finfo(dtype).bits // 8
                gap = -(-size // 256) * 256 + (abs(pad) << 10)  # (the second tensor starts on 256 bytes too)
                buf = torch.empty(gap + size, dtype=torch.uint8, device="cuda")
                first = buf[:size].view(dtype).view(m, n)
                second = buf[gap:].view(dtype).view(m, n)
                y, dy = (first, second) if pad >= 0 else (second, first)
                y.copy_(torch.softmax(torch.randn(m, n, device="cuda"), -1))
                dy.normal_()
                ref = y.double() * (dy.double() - (y.double() * dy.double()).sum(-1, keepdim=True))
                scale = ref.abs().max().item()
                err = 0.0
                for stmts in variants.values():
                    with knobs_set(stmts, saved):
                        err = max(err, (B.softmax_bwd(y, dy).double() - ref).abs().max().item() / scale)
                del ref
                times = {name: [] for name in variants}
                for _ in range(args.rounds):
                    for name, stmts in variants.items():
                        with knobs_set(stmts, saved):
                            times[name].append(bench(lambda: B.softmax_bwd(y, dy)))
                nbytes = 3 * y.numel() * y.element_size()
                dist = dy.data_ptr() - y.data_ptr()
                cells = " | ".join(f"{100 * nbytes / statistics.median(ts) / 1e6 / copy_:.1f}" for ts in times.values())
                print(f"{dname} | {n} | {m} | {pad} | {dist} | {dist % (2 << 20)} | {cells} | {err:.1e}", flush=True)
                del first, second, buf, y, dy
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
