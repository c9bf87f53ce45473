"""Probe: tile shapes of the in-register rows kernels (short rows) beside torch.compile, in one run.

Run on a GPU:  python3 benchmarks/probes/softmax_rows.py [--sizes 1024,16384] [--dtypes bf16,fp32]

For each (N, M = 2^28 / N, dtype, direction) it times the rows kernel with every (tile elements,
elements per thread) pair below, checks it against float64, and prints GB/s and % of a
device-to-device copy (forward 2 * bytes(x) / t, backward 3 * bytes(x) / t) beside the
torch.compile'd peer.
"""
from __future__ import annotations

import argparse

import torch

from softmax_staged import DTYPES, bench, copy_gbs  # same folder: the staged probe's helpers
from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F

TILES = {  # direction: [(tile elements, elements per thread)] per element size
    "fwd": {4: [(1024, 8), (2048, 8), (4096, 16), (2048, 4)], 2: [(4096, 32), (2048, 16), (8192, 32), (4096, 16)]},
    "bwd": {4: [(4096, 16), (2048, 8), (8192, 16)], 2: [(8192, 16), (4096, 16), (8192, 32), (16384, 32)]},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--dirs", default="fwd,bwd")
    args = ap.parse_args()
    copy = copy_gbs()
    print(f"copy {copy:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__}")
    print("dir | dtype | N | M | variant | GB/s | % copy | max err")
    peer_fwd = torch.compile(lambda x: torch.softmax(x, -1))
    peer_bwd = torch.compile(lambda y, dy: (y.float() * (dy.float() - (y.float() * dy.float()).sum(-1, True)))
                             .to(dy.dtype))
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        elem = torch.finfo(dtype).bits // 8
        for n in map(int, args.sizes.split(",")):
            m = (1 << 28) // n
            x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
            for direction in args.dirs.split(","):
                if direction == "fwd":
                    ref = torch.softmax(x.double(), -1)
                    nbytes = 2 * x.numel() * elem
                    ours, peer = (lambda: F.softmax_fwd(x)[0]), (lambda: peer_fwd(x))
                    knobs = (F, "ROWS_TILE", "ELEMS_PER_THREAD")
                else:
                    y = torch.softmax(x.float(), -1).to(dtype)
                    dy = torch.randn_like(y)
                    ref = y.double() * (dy.double() - (y.double() * dy.double()).sum(-1, keepdim=True))
                    nbytes = 3 * x.numel() * elem
                    ours, peer = (lambda: B.softmax_bwd(y, dy)), (lambda: peer_bwd(y, dy))
                    knobs = (B, "BWD_ROWS_TILE", "BWD_ELEMS_PER_THREAD")
                scale = ref.abs().max().item()
                t = bench(peer)
                print(f"{direction} | {dname} | {n} | {m} | torch.compile | {nbytes / t / 1e6:.0f} | "
                      f"{100 * nbytes / t / 1e6 / copy:.1f} | -", flush=True)
                module, tile_name, per_name = knobs
                saved = dict(getattr(module, tile_name)), dict(getattr(module, per_name))
                for tile, per in TILES[direction][elem]:
                    getattr(module, tile_name)[elem], getattr(module, per_name)[elem] = tile, per
                    err = (ours().double() - ref).abs().max().item() / scale
                    t = bench(ours)
                    print(f"{direction} | {dname} | {n} | {m} | tile {tile} x{per} | {nbytes / t / 1e6:.0f} | "
                          f"{100 * nbytes / t / 1e6 / copy:.1f} | {err:.1e}", flush=True)
                getattr(module, tile_name).update(saved[0])
                getattr(module, per_name).update(saved[1])
                del ref
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
