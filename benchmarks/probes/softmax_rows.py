"""Probe: tile shapes of the in-register rows kernels (short rows) beside torch.compile, in one run.

Run on a GPU:  python3 benchmarks/probes/softmax_rows.py [--sizes 1024,16384] [--dtypes bf16,fp32]
                   [--tiles all|table] [--exact 1,0] [--evicts ,evict_first] [--rounds 3] [--rows-max-n N]

For each (N, M = 2^28 / N, dtype, direction) it times the rows kernel with every (tile elements,
elements per thread, most warps) entry below, with and without masks where the tiles fit
(``ROWS_EXACT``) and each load eviction policy given, checks it against float64, and prints GB/s
and % of a device-to-device copy (forward 2 * bytes(x) / t, backward 3 * bytes(x) / t) beside
torch.compile's softmax (its backward through autograd, as launch/bench_softmax.py times it).
With ``--rounds`` every contestant is timed once per round, in turn, and the medians printed.
``--rows-max-n`` lets rows up to N take the rows kernels (longer than the library's table does) and
times the library's own choice for them beside it ("library").
"""
from __future__ import annotations

import argparse
import statistics

import torch

from softmax_staged import DTYPES, bench, copy_gbs  # same folder: the staged probe's helpers
from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F
from ringsoftmax.kernels import softmax_staged as S

TILES = {  # direction: [(tile elements, elements per thread, most warps)] per element size; the table's first
    "fwd": {4: [(1024, 8, 16), (1024, 32, 16), (1024, 16, 16), (2048, 8, 16), (4096, 16, 16)],
            2: [(1024, 32, 16), (4096, 32, 16), (2048, 32, 16), (1024, 16, 16), (8192, 32, 16)]},
    "bwd": {4: [(4096, 8, 32), (4096, 16, 16), (4096, 16, 32), (2048, 8, 16), (8192, 16, 16), (1024, 8, 16)],
            2: [(4096, 8, 32), (4096, 16, 16), (8192, 16, 16), (8192, 16, 32), (2048, 16, 16), (16384, 16, 32),
                (1024, 8, 16)]},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--dirs", default="fwd,bwd")
    ap.add_argument("--tiles", default="all",
                    help="all: every tile of TILES; table: the library's only; or 'tile:per:warps,...'")
    ap.add_argument("--exact", default="1", help="comma list of ROWS_EXACT values (1: no masks where tiles fit)")
    ap.add_argument("--evicts", default="", help="comma list of load eviction policies ('' = default)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (medians)")
    ap.add_argument("--lse", default="1", help="forward: comma list of with_lse values (0: y only)")
    ap.add_argument("--chunks", default="", help="backward: comma list of BWD_ROWS_CHUNK values ('' = whole rows)")
    ap.add_argument("--rows-max-n", type=int, default=0,
                    help="rows up to this length take the rows kernels; the library's default path is timed too")
    args = ap.parse_args()
    table_max = (dict(F.ROWS_MAX_N), B.BWD_ROWS_MAX_N)
    copy = copy_gbs()
    print(f"copy {copy:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__}")
    print("dir | dtype | N | M | variant | GB/s | % copy | max err")
    peer_fwd = torch.compile(lambda x: torch.softmax(x, -1), dynamic=False)
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        elem = torch.finfo(dtype).bits // 8
        for n in map(int, args.sizes.split(",")):
            m = (1 << 28) // n
            x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
            mode = {"extra": True}
            for direction in args.dirs.split(","):
                if direction == "fwd":
                    ref = torch.softmax(x.double(), -1)
                    nbytes = 2 * x.numel() * elem
                    ours = lambda: F.softmax_fwd(x, with_lse=mode["extra"])[0]  # noqa: E731
                    peer = lambda: peer_fwd(x)  # noqa: E731
                    knobs = (F, "ROWS_TILE", "ELEMS_PER_THREAD", "ROWS_MAX_WARPS", "ROWS_LOAD_EVICT")
                    extras, extra_name = [bool(int(v)) for v in args.lse.split(",")], "lse"
                else:   # the peer's backward through autograd, as launch/bench_softmax.py times it
                    xx = x.detach().clone().requires_grad_()
                    yy = peer_fwd(xx)
                    y = yy.detach()
                    dy = torch.randn_like(y)
                    ref = y.double() * (dy.double() - (y.double() * dy.double()).sum(-1, keepdim=True))
                    nbytes = 3 * x.numel() * elem
                    ours = lambda: B.softmax_bwd(y, dy)  # noqa: E731
                    peer = lambda: torch.autograd.grad(yy, xx, dy, retain_graph=True)  # noqa: E731
                    knobs = (B, "BWD_ROWS_TILE", "BWD_ELEMS_PER_THREAD", "BWD_ROWS_MAX_WARPS", "BWD_ROWS_LOAD_EVICT")
                    extras, extra_name = [int(v) if v else None for v in args.chunks.split(",")], "chunk"
                scale = ref.abs().max().item()
                module, tile_name, per_name, warps_name, evict_name = knobs
                saved = (dict(getattr(module, tile_name)), dict(getattr(module, per_name)), getattr(module, warps_name),
                         getattr(module, evict_name), F.ROWS_EXACT, dict(B.BWD_ROWS_CHUNK))

                def setup(tile, per, most, exact, evict, extra):
                    getattr(module, tile_name)[elem], getattr(module, per_name)[elem] = tile, per
                    setattr(module, warps_name, most)
                    setattr(module, evict_name, evict)
                    F.ROWS_EXACT = exact
                    mode["extra"] = extra
                    if direction == "bwd":
                        B.BWD_ROWS_CHUNK[elem] = extra

                if args.tiles in ("all", "table"):
                    tiles = TILES[direction][elem][:1 if args.tiles == "table" else None]
                else:
                    tiles = [tuple(map(int, t.split(":"))) for t in args.tiles.split(",")]
                variants = [(t, bool(int(ex)), ev, xt) for t in tiles for ex in args.exact.split(",")
                            for ev in args.evicts.split(",") for xt in extras]
                times = {i: [] for i in range(-2 if args.rows_max_n else -1, len(variants))}
                errs = {}
                for _ in range(args.rounds):
                    times[-1].append(bench(peer))
                    if args.rows_max_n:   # the library's table, then rows up to --rows-max-n
                        F.ROWS_MAX_N.update(table_max[0])
                        B.BWD_ROWS_MAX_N, S.STAGED = table_max[1], True
                        times[-2].append(bench(ours))
                        F.ROWS_MAX_N.update({e: max(v, args.rows_max_n) for e, v in table_max[0].items()})
                        B.BWD_ROWS_MAX_N, S.STAGED = max(table_max[1], args.rows_max_n), False
                    for i, ((tile, per, most), exact, evict, extra) in enumerate(variants):
                        setup(tile, per, most, exact, evict, extra)
                        if i not in errs:
                            errs[i] = (ours().double() - ref).abs().max().item() / scale
                        times[i].append(bench(ours))
                setup(saved[0][elem], saved[1][elem], saved[2], saved[4], saved[3], True)
                B.BWD_ROWS_CHUNK.update(saved[5])
                F.ROWS_MAX_N.update(table_max[0])
                B.BWD_ROWS_MAX_N, S.STAGED = table_max[1], True
                for i in times:
                    t = statistics.median(times[i])
                    if i == -2:
                        name, err = "library", "-"
                    elif i < 0:
                        name, err = "torch.compile", "-"
                    else:
                        (tile, per, most), exact, evict, extra = variants[i]
                        name = f"tile {tile} x{per} <={most}w exact={int(exact)} evict={evict or '-'} {extra_name}={extra}"
                        err = f"{errs[i]:.1e}"
                    print(f"{direction} | {dname} | {n} | {m} | {name} | {nbytes / t / 1e6:.0f} | "
                          f"{100 * nbytes / t / 1e6 / copy:.1f} | {err}", flush=True)
                del ref
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
