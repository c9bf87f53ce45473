"""Timeline of the Gluon attention forward's compute warpgroups, read from the multiprocessor's clock.

Writes a copy of ``attention_fwd_gluon.py`` whose key loop reads ``%clock`` (the SM's cycle counter)
at up to five points of each key tile j >= 1 of each program's first query tile (at most
TRACE_TILES of them), per compute warpgroup, and stores the readings into the PartML argument
(unused by launches that are not split):

    e0 S_j and P_{j-1} V_{j-1} issued, before the wait for K_{j+1}     e1 K_{j+1} ready
    e2 S_j ready (wgmma wait)       e3 the softmax's row sums done (the reading depends on l_q)
    e4 P_{j-1} V_{j-1} waited

(Until session 24's change the kernel waited for K_j at the top of tile j, before S_j's issue; the
session's first logs, ``logs/2026-11-23-h200-s24-fa-timeline*.log``, read e0 and e1 around that wait.)

``--events 012`` (the default) reads e0-e2 only: in the sm_90a SASS (triton 3.6, offline) that copy
keeps the committed kernel's schedule (the wait for P_{j-1} V_{j-1} at the softmax's start, P's
conversions among the exponentials), while e3 and e4 move the conversions after that wait (the
softmax then runs under P V: a different kernel). Prints, over the programs and tiles (the first 2
and last 2 traced tiles left out), medians and quartiles of the K wait (e1 - e0), S's wait after it
(e2 - e1), the rest of the tile (e0 of j+1 - e2: the softmax, the P V wait, the conversions, the next
issues), the period (e0 of j+1 - e0), and across the two warpgroups of a program the lag of warpgroup 1's
S_j ready after warpgroup 0's and how much of their softmax spans [e2, e0 of j+1] overlap (the
share of warpgroup 0's). Also times the traced copy beside the library kernel (the readings' cost).

Run on a GPU:  python3 benchmarks/probes/fa_timeline.py [--dims 64,128] [--seqlens 4096,32768] [--events 012]
                   [--block-m 192]
The clock readings are ordered with the wgmma and barrier waits around them (side-effecting asm);
arithmetic may be scheduled across them.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile

import torch
import triton

from ablations import KERNELS, edit  # same folder
from module_copies import load_copies  # same folder

TRACE_TILES = 64
EVENTS = 5


def traced_source(src: str, events: str = "012") -> str:
    """The kernel module with clock readings (``events``: a subset of "01234") in the compute
    warpgroups' key loop."""
    def at(e, dep="rows"):
        if str(e) not in events:
            return ""
        return f"                        _trace(PartML, c, j, part, {wgs}, {e}, rows, {dep})\n"
    wgs = "q_s.shape[0] // 2"
    src = edit(src, '''    @gluon.jit
    def _units(n_m, BH, causal):''', f'''    @gluon.jit
    def _trace(T, c, j, part, wgs, e: gl.constexpr, rows, dep):
        """Store the SM clock (read after ``dep`` is computed) at T[pid, part, j, e] on the first query tile."""
        t = gl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r,r", [dep], dtype=gl.int32, is_pure=False,
                                      pack=1)
        offs = ((gl.program_id(0) * wgs + part) * {TRACE_TILES} + j) * {EVENTS} + e
        gl.store(T + offs + rows * 0, t, mask=(rows == 0) & (c == 0) & (j < {TRACE_TILES}))

    @gluon.jit
    def _units(n_m, BH, causal):''')
    src = edit(src, '''                        if j + 1 < j_hi:  # (under the matmuls: off the tile's chain, see the module doc)
                            mbarrier.wait(k_ready.index((g + j + 1) % STAGES), ((g + j + 1) // STAGES) & 1)
''', at(0) + '''                        if j + 1 < j_hi:  # (under the matmuls: off the tile's chain, see the module doc)
                            mbarrier.wait(k_ready.index((g + j + 1) % STAGES), ((g + j + 1) // STAGES) & 1)
''' + at(1))
    src = edit(src, '''                        s = warpgroup_mma_wait(1, deps=[s_tok])
''', '''                        s = warpgroup_mma_wait(1, deps=[s_tok])
''' + at(2))
    src = edit(src, '''                                                           lim0 - j * BLOCK_N, cols, TREES)
                        o, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
''', '''                                                           lim0 - j * BLOCK_N, cols, TREES)
''' + at(3, "l_i") + '''                        o, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
''' + at(4))
    src = edit(src, '''        part_o = part_ml = counts = no_int32s(q.device)   # (not split: never read)
''', '''        part_o = part_ml = counts = no_int32s(q.device)   # (not split: never read)
        if TRACE is not None:
            part_ml = TRACE
''')
    return src + ("\n#: The probe's trace buffer (int32, grid x warpgroups x TRACE_TILES x EVENTS), passed as"
                  " PartML.\nTRACE = None\n")


def quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"{q[1]:6.0f} ({q[0]:.0f}-{q[2]:.0f})"


def analyse(trace: torch.Tensor, tiles: int, events: str) -> list[str]:
    """Lines of the summary from trace (grid, WG, TRACE_TILES, EVENTS) int32 clock readings."""
    t = trace.to(torch.int64) & 0xFFFFFFFF
    grid, wgs = t.shape[:2]
    lo, hi = 3, min(tiles, TRACE_TILES) - 2   # traced tiles are 1 .. tiles-1; leave out both ends

    def d(a, b):   # cycles from reading b to reading a, through the 32-bit wrap, signed
        x = (a - b) & 0xFFFFFFFF
        return x - (1 << 32) if x >= (1 << 31) else x
    spans = [("K wait (e1-e0)", 1, 0), ("S wait after it (e2-e1)", 2, 1)]
    if "3" in events:
        spans += [("softmax (e3-e2)", 3, 2), ("P V wait (e4-e3)", 4, 3), ("to next tile (e0'-e4)", 5, 4)]
    else:
        spans += [("softmax, P V wait, P, issues (e0'-e2)", 5, 2)]
    spans += [("period (e0'-e0)", 5, 0)]
    cols = {n: [] for n, _, _ in spans}
    lag, overlap = [], []
    for p in range(grid):
        for w in range(wgs):
            for j in range(lo, hi):
                e = t[p, w, j].tolist() + [int(t[p, w, j + 1, 0])]   # e0..e4, then the next tile's e0
                for n, x, y in spans:
                    cols[n].append(d(e[x], e[y]))
        if wgs >= 2:
            for j in range(lo, hi):
                a, b = t[p, 0, j].tolist(), t[p, 1, j].tolist()
                a_end, b_end = int(t[p, 0, j + 1, 0]), int(t[p, 1, j + 1, 0])
                lag.append(d(b[2], a[2]))
                # warpgroup 0's span [a2, next a0] against warpgroup 1's [b2, next b0] (cycles from a2)
                b2, b_e, a_e = d(b[2], a[2]), d(b_end, a[2]), d(a_end, a[2])
                inter = max(0, min(a_e, b_e) - max(0, b2))
                overlap.append(inter / a_e if a_e > 0 else 0.0)
    out = [f"  {n:32s} {quartiles(v)} cycles" for n, v in cols.items()]
    if lag:
        out.append(f"  {'S ready, warpgroup 1 after 0':32s} {quartiles(lag)} cycles")
        out.append(f"  {'their softmax spans overlap':32s} {quartiles([100 * x for x in overlap])} % of warpgroup 0's")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seqlens", default="4096,32768")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--events", default="012", help="clock readings: 012 (the kernel's schedule) or 01234")
    ap.add_argument("--block-m", type=int, default=0, help="query rows per tile (0: the table's; 192: 3 warpgroups)")
    args = ap.parse_args()
    from ringsoftmax.kernels import attention_fwd_gluon as base
    tmp = pathlib.Path(tempfile.mkdtemp())
    (tmp / "fa_traced.py").write_text(traced_source((KERNELS / "attention_fwd_gluon.py").read_text(),
                                                                 args.events))
    traced = load_copies(f"traced={tmp / 'fa_traced.py'}")["traced"]
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    bench = lambda f: triton.testing.do_bench(f, warmup=10, rep=60, return_mode="median")  # noqa: E731
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for D in map(int, args.dims.split(",")):
        for S in map(int, args.seqlens.split(",")):
            B, H = max(1, 32768 // S), args.heads
            q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            out, lse = torch.empty_like(q), torch.empty(B, H, S, device="cuda")
            qk_scale = D ** -0.5 * 1.4426950408889634
            block_m, block_n = base.TILES[(D, False)][:2]
            block_m = args.block_m or block_m
            grid = base.grid_size(q, False, block_m=block_m)
            traced.TRACE = torch.zeros(grid * (block_m // 64) * TRACE_TILES * EVENTS, dtype=torch.int32,
                                       device="cuda")
            runs = {name: (lambda m=m: m.launch(q, k, v, out, lse, qk_scale=qk_scale, causal=False, split=False,
                                                block_m=block_m))
                    for name, m in (("library", base), ("traced", traced))}
            times = {name: [] for name in runs}
            for _ in range(args.rounds):
                for name, f in runs.items():
                    times[name].append(bench(f))
            flops = 4 * B * H * S * S * D
            tf = {name: flops / statistics.median(ts) / 1e9 for name, ts in times.items()}
            traced.TRACE.zero_()
            runs["traced"]()
            torch.cuda.synchronize()
            ref = out.clone()
            runs["library"]()
            same = torch.equal(ref, out)
            print(f"D={D} S={S} B={B} non-causal, {block_m}-row tiles, grid {grid}: "
                  f"library {tf['library']:.0f} TFLOP/s, traced "
                  f"{tf['traced']:.0f}; traced out == library out: {same}")
            tr = traced.TRACE.view(grid, block_m // 64, TRACE_TILES, EVENTS).cpu()
            for line in analyse(tr, triton.cdiv(S, block_n), args.events):
                print(line)
            p0 = (tr[0].to(torch.int64) & 0xFFFFFFFF)
            base_t = int(p0[0, 4, 0])
            print("  program 0, tiles 4-7, cycles from warpgroup 0's e0 of tile 4 (e0..e4 per warpgroup):")
            for j in range(4, 8):
                row = " | ".join(" ".join(f"{(int(x) - base_t) & 0xFFFFFFFF:6d}" for x in p0[w, j])
                                 for w in range(p0.shape[0]))
                print(f"    j={j}: {row}")


if __name__ == "__main__":
    main()
