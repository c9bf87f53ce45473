"""Softmax forward / backward: ringsoftmax's Triton kernels beside torch, torch.compile and Liger.

Run on a GPU:  python3 launch/bench_softmax.py [--quick | --sizes vocab | --sizes 50257,1000003]
                   [--peers torch,compile,liger] [--variants]

For every (N, M = 2^28 / N, dtype, direction) it prints each implementation's effective bandwidth
(forward 2 * bytes(x) / t: read x, write y; backward 3 * bytes(x) / t: read y and dy, write dx),
ours over the best peer, and ours as a % of a device-to-device copy measured in the same run.
"ours" is ``ringsoftmax.softmax``'s kernels (y only, like every peer); "ours+lse" adds the lse
``softmax_with_lse`` returns. A peer that is missing or raises is shown as such. ``--variants``
also times our kernels under other settings of their knobs (the numbers behind the config table).
Each cell is the median over ``--rounds`` rounds (every contestant timed once per round, in turn)
of ``triton.testing.do_bench``'s median.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import sys

import torch
import triton

from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F
from timing import interleaved_medians  # this folder

TOTAL = 1 << 28
SIZES = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26]
QUICK = [1 << 10, 1 << 14, 1 << 16, 1 << 20, 1 << 22, 1 << 24]
#: Row lengths models use (vocabularies: Llama 2 32000, GPT-2 50257, Llama 3 128256, Qwen 2 151936,
#: Gemma 256000) and lengths just past powers of two and odd ones, whose rows the TMA loads and the
#: 16-byte copies cannot take (a tail chunk, other paths): ``--sizes vocab``.
VOCAB = [1000, 4097, 32000, 50257, 65537, 100003, 128256, 151936, 256000, 1000003, 4194305]


def bench(fn) -> float:
    """Median milliseconds of fn()."""
    return triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median")


def say(*cols, log=None):
    line = " | ".join(str(c) for c in cols)
    print(line, flush=True)
    if log is not None:
        log.write(line + "\n")
        log.flush()


def copy_bandwidth() -> float:
    """GB/s of a 2 GiB float32 device-to-device copy, counting bytes read and written."""
    a = torch.empty(2 * 1024**3 // 4, device="cuda").normal_()
    b = torch.empty_like(a)
    t = bench(lambda: b.copy_(a))
    del a, b
    torch.cuda.empty_cache()
    return 2 * 2 * 1024**3 / t / 1e6


def make_peers(names):
    """name -> softmax(x) callable, or the reason it is missing."""
    peers = {}
    if "torch" in names:
        peers["torch"] = lambda x: torch.softmax(x, -1)
    if "compile" in names:
        # one compile per (N, dtype) and direction: past the recompile limit dynamo would run the peer
        # eagerly without a word (64 was hit by 19 lengths x 2 dtypes x 2 directions); where this torch
        # can, hitting the limit raises instead, and the table shows the peer as raising
        for knob, value in (("recompile_limit", 4096), ("accumulated_recompile_limit", 4096),
                            ("fail_on_recompile_limit_hit", True)):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, value)
        peers["compile"] = torch.compile(lambda x: torch.softmax(x, -1), dynamic=False)
    if "liger" in names:
        try:
            from liger_kernel.ops.softmax import LigerSoftmaxFunction
            peers["liger"] = LigerSoftmaxFunction.apply
        except Exception as e:  # noqa: BLE001 - report any import failure as "missing"
            peers["liger"] = f"missing ({type(e).__name__})"
    return peers


def peer_calls(fn, x, dy):
    """(forward callable, backward callable) of an autograd softmax, or an error string for each."""
    try:
        xx = x.detach().clone().requires_grad_()
        y = fn(xx)
        torch.autograd.grad(y, xx, dy, retain_graph=True)
        return (lambda: fn(x)), (lambda: torch.autograd.grad(y, xx, dy, retain_graph=True))
    except Exception as e:  # noqa: BLE001 - a peer that raises is reported, not fatal
        msg = f"error ({type(e).__name__})"
        return msg, msg


def max_err(x) -> tuple[float, float]:
    """Max abs error of our y and lse against float64 torch, on rows of x."""
    rows = x[: max(1, min(x.shape[0], 8))]
    y, lse = F.softmax_fwd(rows)
    ref = torch.softmax(rows.double(), -1)
    return (y.double() - ref).abs().max().item(), (lse.double() - torch.logsumexp(rows.double(), -1)).abs().max().item()


def gbs(nbytes, t):
    return nbytes / t / 1e6 if isinstance(t, float) else None


def fmt(v):
    return f"{v:.0f}" if isinstance(v, float) else str(v)


def run_table(args, copy, log):
    peers = make_peers(args.peers.split(","))
    names = list(peers)
    say("N", "M", "dtype", "dir", "ours GB/s", "ours+lse GB/s", *[f"{n} GB/s" for n in names], "ours/best peer",
        "ours % copy", "maxerr y / lse", log=log)
    summary = []
    for dtype in (torch.float32, torch.bfloat16):
        for n in args.size_list:
            m = TOTAL // n
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            dy = torch.randn_like(x)
            nb = x.numel() * x.element_size()
            y, _ = F.softmax_fwd(x)
            ey, el = max_err(x)
            # ours: softmax (y only, what ringsoftmax.softmax costs), softmax_with_lse, the backward
            calls = {("ours", "fwd"): lambda: F.softmax_fwd(x, with_lse=False),
                     ("ours+lse", "fwd"): lambda: F.softmax_fwd(x), ("ours", "bwd"): lambda: B.softmax_bwd(y, dy)}
            for k, v in peers.items():
                pf, pb = (v, v) if isinstance(v, str) else peer_calls(v, x, dy)
                calls[(k, "fwd")], calls[(k, "bwd")] = pf, pb
            t = interleaved_medians(calls, args.rounds, bench)
            for direction, mult in (("fwd", 2), ("bwd", 3)):
                g = gbs(mult * nb, t[("ours", direction)])
                g_lse = fmt(gbs(mult * nb, t[("ours+lse", direction)])) if direction == "fwd" else "-"
                pg = {k: gbs(mult * nb, t[(k, direction)]) for k in names}
                pg_fmt = [fmt(pg[k]) if pg[k] is not None else t[(k, direction)] for k in names]
                best = max([v for v in pg.values() if v is not None], default=None)
                ratio = f"{g / best:.2f}x" if best else "-"
                say(n, m, str(dtype)[6:], direction, fmt(g), g_lse, *pg_fmt, ratio, f"{g / copy:.0%}",
                    f"{ey:.1e} / {el:.1e}" if direction == "fwd" else "", log=log)
                summary.append((n, str(dtype)[6:], direction, g / copy, g / best if best else None))
            del x, dy, y, calls
            torch.cuda.empty_cache()
    return summary


@contextlib.contextmanager
def knobs(module, **values):
    """Set module-level knobs for the block, then restore them."""
    old = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


# name -> ([(module, {knob: value})], which rows it applies to: "rows" (N <= ROWS_MAX_N), "split",
# "all", or one N)
VARIANTS = {
    "default": ([], "all"),
    "two-pass": ([(F, dict(PERSISTENT=False))], "split"),
    "persistent": ([(F, dict(PERSISTENT_MAX_ROW_BYTES=None)), (B, dict(BWD_PERSISTENT_MAX_ROW_BYTES=None))], "split"),
    "no-hints": ([(F, dict(PERSISTENT_EVICT=("", "")))], "split"),
    "wave6": ([(F, dict(PERSISTENT_WAVE_BYTES=6 << 20))], "split"),
    "wave24": ([(F, dict(PERSISTENT_WAVE_BYTES=24 << 20))], "split"),
    "chunk-x2": ([(F, dict(SPLIT_CHUNK={4: (8192, 8), 2: (8192, 8)})),
                  (B, dict(BWD_SPLIT_CHUNK={4: (4096, 8), 2: (8192, 16)}))], "split"),
    "chunk-half": ([(F, dict(SPLIT_CHUNK={4: (2048, 2), 2: (2048, 2)})),
                    (B, dict(BWD_SPLIT_CHUNK={4: (1024, 2), 2: (2048, 4)}))], "split"),
    "rows16K": ([(F, dict(ROWS_MAX_N={4: 16384, 2: 16384})), (B, dict(BWD_ROWS_MAX_N=16384))], 32768),
    "tile-4K16": ([(F, dict(ROWS_TILE={4: 4096, 2: 8192}, ELEMS_PER_THREAD={4: 16, 2: 16}))], "rows"),
    "tile-4K32": ([(F, dict(ROWS_TILE={4: 4096, 2: 4096}, ELEMS_PER_THREAD={4: 32, 2: 32}))], "rows"),
    "tile-1K8": ([(F, dict(ROWS_TILE={4: 1024, 2: 1024}, ELEMS_PER_THREAD={4: 8, 2: 8}))], "rows"),
    "tile-8K32": ([(F, dict(ROWS_TILE={4: 8192, 2: 8192}, ELEMS_PER_THREAD={4: 32, 2: 32}))], "rows"),
    "bwd-ept8": ([(B, dict(BWD_ELEMS_PER_THREAD={4: 8, 2: 8}))], "rows"),
}
VARIANT_SIZES = [1 << 10, 1 << 12, 1 << 14, 1 << 15, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24]


def _applies(where, n: int) -> bool:
    if where == "all":
        return True
    if where == "rows":
        return n <= min(F.ROWS_MAX_N.values())
    if where == "split":
        return n > min(F.ROWS_MAX_N.values())
    return n == where


def run_variants(copy, log, sizes, dtypes, names):
    """Our kernels under other knob settings: % of copy per (N, dtype, direction, variant)."""
    say("variant", "N", "dtype", "fwd % copy", "bwd % copy", log=log)
    for dtype in dtypes:
        for n in sizes:
            m = TOTAL // n
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            dy = torch.randn_like(x)
            nb = x.numel() * x.element_size()
            for name, (settings, where) in VARIANTS.items():
                if not _applies(where, n) or (names and name not in names):
                    continue
                with contextlib.ExitStack() as stack:
                    for mod, vals in settings:
                        stack.enter_context(knobs(mod, **vals))
                    try:
                        y, _ = F.softmax_fwd(x)
                        ref_err = (y[:2].double() - torch.softmax(x[:2].double(), -1)).abs().max().item()
                        tf = bench(lambda: F.softmax_fwd(x))
                        tb = bench(lambda: B.softmax_bwd(y, dy))
                        say(name, n, str(dtype)[6:], f"{2 * nb / tf / 1e6 / copy:.1%}",
                            f"{3 * nb / tb / 1e6 / copy:.1%}", f"err {ref_err:.1e}", log=log)
                    except Exception as e:  # noqa: BLE001 - one failing variant must not stop the table
                        say(name, n, str(dtype)[6:], "error", repr(e)[:150], log=log)
            del x, dy
            torch.cuda.empty_cache()
    for key, programs in F._OCCUPANCY.items():
        say("resident programs", programs, str(key)[:160], log=log)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer row lengths")
    p.add_argument("--sizes", default=None, help="comma list of N for the table, or 'vocab' (see VOCAB)")
    p.add_argument("--peers", default="torch,compile,liger", help="comma list of torch,compile,liger")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per cell (medians)")
    p.add_argument("--variants", action="store_true", help="also time our kernels under other knob settings")
    p.add_argument("--vsizes", default=None, help="comma list of N for --variants")
    p.add_argument("--vdtypes", default="float32,bfloat16", help="comma list of dtypes for --variants")
    p.add_argument("--vnames", default=None, help="comma list of variant names (default: all)")
    p.add_argument("--variants-last", action="store_true", help="run the variants after the main table")
    p.add_argument("--no-table", action="store_true", help="skip the main table (with --variants)")
    p.add_argument("--log", default=None, help="also write the table to this file")
    args = p.parse_args()
    if args.sizes == "vocab":
        args.size_list = VOCAB
    elif args.sizes:
        args.size_list = [int(v) for v in args.sizes.split(",")]
    else:
        args.size_list = QUICK if args.quick else SIZES
    log = open(args.log, "w") if args.log else None
    say("# bench_softmax", datetime.datetime.now().isoformat(timespec="seconds"), " ".join(sys.argv[1:]), log=log)
    say("device", torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, log=log)
    copy = copy_bandwidth()
    say("copy", f"{copy:.0f} GB/s", log=log)
    sizes = [int(v) for v in args.vsizes.split(",")] if args.vsizes else VARIANT_SIZES
    dtypes = [getattr(torch, d) for d in args.vdtypes.split(",")]
    names = args.vnames.split(",") if args.vnames else None
    if args.variants and not args.variants_last:
        run_variants(copy, log, sizes, dtypes, names)
    if not args.no_table:
        summary = run_table(args, copy, log)
        short = [f"{n} {d} {dr} {pc:.0%}" + (f" {r:.2f}x" if r else "") for n, d, dr, pc, r in summary]
        say("summary (N dtype dir %copy ours/best)", "; ".join(short), log=log)
    if args.variants and args.variants_last:
        run_variants(copy, log, sizes, dtypes, names)
    say("persistent waits that gave up", F.sync_failures("cuda"), log=log)


if __name__ == "__main__":
    main()
