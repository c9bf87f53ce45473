"""Probe: the staged (shared-memory) split-row softmax kernel against the current default, side by side.

Run on a GPU:  python3 benchmarks/probes/softmax_staged.py [--sizes 65536,1048576] [--dtypes fp32,bf16]
                   [--modules name=path,...] [--tma 0,1] [--claims 0,1] [--folds 0,1] [--rounds R]

``--modules`` also times other copies of ``softmax_staged.py`` (e.g. a commit's version) with their own
table configs, against the library's, in turn for ``--rounds`` rounds (medians); ``--tma`` the same
for loads by cp.async or TMA in the table's configs, ``--claims`` for units taken from a counter (1:
at every row length, 0: never; the library's rule decides in between), ``--folds`` for the 16-bit
forward's division folded into its exponent or not.

For each (N, M = 2^28 / N, dtype, direction) it checks every staged configuration against float64
(max error, and the fraction of the grid that works) and prints % of a device-to-device copy
measured in the same run: forward 2 * bytes(x) / t, backward 3 * bytes(x) / t.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import triton

from module_copies import load_copies  # same folder
from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F
from ringsoftmax.kernels import softmax_staged as S

CONFIGS = {  # (chunk, warps, stages, ahead, lag, loads by TMA)
    ("fwd", 4): [(8192, 4, 3, 1, 1, False), (8192, 4, 3, 1, 2, False), (4096, 8, 4, 1, 2, True)],
    ("fwd", 2): [(8192, 4, 3, 1, 1, True), (16384, 4, 3, 1, 1, True), (8192, 4, 4, 1, 2, True)],
    ("bwd", 4): [(4096, 4, 3, 1, 1, False), (4096, 4, 3, 2, 2, False), (8192, 8, 3, 1, 1, False)],
    ("bwd", 2): [(8192, 4, 3, 1, 1, False), (8192, 4, 3, 2, 2, False), (16384, 8, 3, 1, 1, False)],
}
DEFAULT_EVICTS = (S.LOAD_EVICT, S.STORE_EVICT)
DEFAULT_FOLD = (S.FOLD_DIVISION_16BIT, S.FOLD_MIN_LAG)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median")


def copy_gbs() -> float:
    a = torch.empty(1 << 29, device="cuda").normal_()
    b = torch.empty_like(a)
    t = bench(lambda: b.copy_(a))
    del a, b
    torch.cuda.empty_cache()
    return 2 * 4 * (1 << 29) / t / 1e6


def compare(variants, direction, dname, n, m, inputs, ref, scale, nbytes, copy, rounds):
    """Time variants of the staged launch in turn for ``rounds`` rounds (medians), each checked first.

    ``variants``: name -> launch(direction, a, b, out, lse) (returns False where a row is too long)."""
    if direction == "fwd":
        a = b = inputs
        out, lse = torch.empty_like(a), torch.empty(m, device="cuda")
    else:
        a, b = inputs
        out = lse = torch.empty_like(b)
    runs = {name: (lambda launch=launch: launch(direction, a, b, out, lse)) for name, launch in variants.items()}
    errs, times = {}, {}
    for name, run in runs.items():
        out.fill_(float("nan"))
        before = F.sync_failures("cuda")
        if not run():
            print(f"{direction} | {dname} | {n} | {m} | {name} | row too long | - | - | - | -")
            continue
        torch.cuda.synchronize()
        errs[name], times[name] = (out.double() - ref).abs().max().item() / scale, []
        errs[name] = (errs[name], F.sync_failures("cuda") - before)
    timed_fails = dict.fromkeys(times, 0)
    for _ in range(rounds):
        for name in times:
            before = F.sync_failures("cuda")
            times[name].append(bench(runs[name]))
            timed_fails[name] += F.sync_failures("cuda") - before
    for name in times:
        t = statistics.median(times[name])
        print(f"{direction} | {dname} | {n} | {m} | {name} | - | {nbytes / t / 1e6:.0f} | "
              f"{100 * nbytes / t / 1e6 / copy:.1f} | {errs[name][0]:.1e} | {errs[name][1]} / {timed_fails[name]}",
              flush=True)


def module_variants(others):
    """The library's staged launch and each other copy's (its own table config and occupancy cache)."""
    caches = {}

    def variant(name, mod):
        def launch(*args):
            F._OCCUPANCY = caches.setdefault(name, {})
            return mod.launch(*args)
        return launch

    return {f"module {name}": variant(name, mod) for name, mod in [("library", S)] + list(others.items())}


def tma_variants(choices):
    """The library's staged launch (table config) with loads by TMA or not, for each of ``choices``
    ('0,1')."""
    def variant(load):
        def launch(direction, a, b, out, lse):
            elem = max(a.element_size(), b.element_size())
            return S.launch(direction, a, b, out, lse, S.staged_config(direction, elem, a.shape[1])[:5] + (load,))
        return launch

    loads = [bool(int(c)) for c in choices.split(",")]
    return {f"load {'tma' if ld else 'cp.async'}": variant(ld) for ld in loads}


def with_knobs(knobs: dict):
    """The library's staged launch with ``softmax_staged``'s knobs set to ``knobs`` while it runs."""
    def launch(*args):
        saved = {k: getattr(S, k) for k in knobs}
        for k, v in knobs.items():
            setattr(S, k, v)
        try:
            return S.launch(*args)
        finally:
            for k, v in saved.items():
                setattr(S, k, v)
    return launch


def claim_variants(choices):
    """The library's staged launch with units claimed from the counter at every row length (1) or
    never (0: whole rows per group of programs)."""
    return {f"claim {'always' if c == '1' else 'never'}":
            with_knobs({"CLAIM": c == "1", "CLAIM_MAX_ROW_SHARE": dict.fromkeys(S.CLAIM_MAX_ROW_SHARE, 1.0)})
            for c in choices.split(",")}


def fold_variants(choices):
    """The library's staged launch with the 16-bit forward's division folded into its exponent in
    every ring (1) or in none (0) (``FOLD_DIVISION_16BIT``, ``FOLD_MIN_LAG``)."""
    return {f"fold {'on' if c == '1' else 'off'}": with_knobs({"FOLD_DIVISION_16BIT": c == "1", "FOLD_MIN_LAG": 0})
            for c in choices.split(",")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="32768,65536,262144,1048576,2097152")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--total", type=int, default=1 << 28)
    ap.add_argument("--dirs", default="fwd,bwd")
    ap.add_argument("--configs", default="",
                    help="replace the configs of some (direction, element size): "
                         "'fwd/4=4096:4:3:1:1:0,8192:8:3:1:1:1 bwd/2=...' (chunk:warps:stages:ahead:lag:tma; the ring "
                         "is one of softmax_staged.RINGS: 3:1:1, 3:2:2, L:1:L (L = 3..7), L+1:1:L or L+2:1:L for L = 2..6)")
    ap.add_argument("--max-programs", type=int, default=S.MAX_PROGRAMS_PER_ROW,
                    help="most programs per row (the kernel reads a row's partial words as one block)")
    ap.add_argument("--modules", default="", help="name=path,... other copies of softmax_staged.py")
    ap.add_argument("--tma", default="",
                    help="time the table's configs with loads by cp.async (0) and TMA (1) side by side: 0,1")
    ap.add_argument("--claims", default="",
                    help="time units claimed from a counter (1) and whole rows per group (0) side by side: 0,1")
    ap.add_argument("--folds", default="",
                    help="time the 16-bit forward's division folded into the exponent (1) or not (0): 0,1")
    ap.add_argument("--rounds", type=int, default=3,
                    help="timing rounds of the --modules / --tma / --claims / --folds comparisons")
    ap.add_argument("--no-configs", action="store_true", help="skip the table of configurations")
    ap.add_argument("--configs-module", default="",
                    help="run the table of configurations through this --modules copy instead of the library "
                         "(e.g. an ablation: what the data path alone reaches in each config)")
    ap.add_argument("--evicts", default="",
                    help="cache policies to run each config with, 'load:store,...' ('' = default policy), "
                         "e.g. 'evict_first:evict_first,:'")
    args = ap.parse_args()
    others = load_copies(args.modules)
    target = others[args.configs_module] if args.configs_module else S
    S.MAX_PROGRAMS_PER_ROW = args.max_programs
    for group in args.configs.split():
        key, cfgs = group.split("=")
        direction, elem = key.split("/")
        CONFIGS[(direction, int(elem))] = [tuple(map(int, c.split(":")[:5])) + (c.split(":")[5] == "1",)
                                           for c in cfgs.split(",")]
    F.SPIN_MAX = 1 << 16  # a grid that is not resident gives up fast instead of stalling the run
    copy = copy_gbs()
    print(f"copy {copy:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    print("dir | dtype | N | M | variant | grid use | GB/s | % copy | max err | "
          "waits given up (checked launch / timed launches)")
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        elem = torch.finfo(dtype).bits // 8
        for n in map(int, args.sizes.split(",")):
            m = max(1, args.total // n)
            x = torch.randn(m, n, device="cuda", dtype=torch.float32).mul_(3)
            x[0, ::7] = float("-inf")
            if m > 2:
                x[1] = float("-inf")
            x = x.to(dtype)
            for direction in args.dirs.split(","):
                if direction == "fwd":
                    ref = torch.softmax(x.double(), -1).nan_to_num_(0.0)
                    nbytes = 2 * x.numel() * elem
                    default = lambda: F.softmax_fwd(x)[0]  # noqa: E731
                    out = torch.empty_like(x)
                    lse = torch.empty(m, device="cuda")
                    run = lambda cfg: target.launch("fwd", x, x, out, lse, cfg)  # noqa: E731
                else:
                    y = torch.softmax(x.float(), -1).nan_to_num_(0.0).to(dtype)
                    dy = torch.randn_like(y)
                    yd, dyd = y.double(), dy.double()
                    ref = yd * (dyd - (yd * dyd).sum(-1, keepdim=True))
                    del yd, dyd
                    nbytes = 3 * x.numel() * elem
                    default = lambda: B.softmax_bwd(y, dy)  # noqa: E731
                    out = torch.empty_like(y)
                    run = lambda cfg: target.launch("bwd", y, dy, out, out, cfg)  # noqa: E731
                scale = ref.abs().max().item()
                for name, staged in (("default", True), ("no staged", False)):
                    S.STAGED = staged
                    t = bench(default)
                    err = (default().double() - ref).abs().max().item() / scale
                    print(f"{direction} | {dname} | {n} | {m} | {name} | - | {nbytes / t / 1e6:.0f} | "
                          f"{100 * nbytes / t / 1e6 / copy:.1f} | {err:.1e} | -", flush=True)
                S.STAGED = True
                for variants in ([module_variants(others)] if others else []) + (
                        [tma_variants(args.tma)] if args.tma else []) + (
                        [claim_variants(args.claims)] if args.claims else []) + (
                        [fold_variants(args.folds)] if args.folds else []):
                    compare(variants, direction, dname, n, m, x if direction == "fwd" else (y, dy), ref, scale,
                            nbytes, copy, args.rounds)
                if args.no_configs:
                    continue
                if target is not S:  # its own occupancy cache (the kernels share a name)
                    F._OCCUPANCY = {}
                folds = (True, False) if direction == "fwd" and elem == 2 else (S.FOLD_DIVISION_16BIT,)
                evicts = [tuple(e.split(":")) for e in args.evicts.split(",")] if args.evicts else [None]
                for cfg, fold, ev in [(c, f, e) for c in CONFIGS[(direction, elem)] for f in folds for e in evicts]:
                    S.FOLD_DIVISION_16BIT, S.FOLD_MIN_LAG = fold, 0  # as labelled, in every ring
                    if ev is not None:
                        S.LOAD_EVICT, S.STORE_EVICT = ev
                    label = f"{cfg}{' fold' if fold and len(folds) > 1 else ''}"
                    if ev is not None:
                        label += f" load {ev[0] or 'default'} store {ev[1] or 'default'}"
                    before = F.sync_failures("cuda")
                    out.fill_(float("nan"))
                    try:
                        if not run(cfg):
                            print(f"{direction} | {dname} | {n} | {m} | {label} | row too long | - | - | - | -")
                            continue
                    except Exception as e:  # noqa: BLE001 - a config that fails to compile is reported
                        print(f"{direction} | {dname} | {n} | {m} | {label} | error {type(e).__name__}: {str(e)[-400:]}")
                        continue
                    torch.cuda.synchronize()
                    err = (out.double() - ref).abs().max().item() / scale
                    fails = F.sync_failures("cuda") - before
                    key = [k for k in F._OCCUPANCY if k[0][0] == "softmax_staged"]
                    before = F.sync_failures("cuda")
                    t = bench(lambda: run(cfg))
                    timed = F.sync_failures("cuda") - before
                    q = triton.cdiv(n, cfg[0])
                    programs = max(F._OCCUPANCY[k][0] for k in key if dict(k[2]).get("CHUNK") == cfg[0]
                                   and dict(k[2]).get("STAGES") == cfg[2] and dict(k[2]).get("LAG") == cfg[4]
                                   and k[3] == cfg[1] and dict(k[2]).get("BWD") == (direction == "bwd"))
                    use = S.grid_plan(direction, m, q, programs, lag=cfg[4])[0] / programs
                    print(f"{direction} | {dname} | {n} | {m} | {label} | {use:.2f} of {programs} | "
                          f"{nbytes / t / 1e6:.0f} | {100 * nbytes / t / 1e6 / copy:.1f} | {err:.1e} | {fails} / {timed}",
                          flush=True)
                S.FOLD_DIVISION_16BIT, S.FOLD_MIN_LAG = DEFAULT_FOLD
                S.LOAD_EVICT, S.STORE_EVICT = DEFAULT_EVICTS
                del ref, out
                torch.cuda.empty_cache()
    print("sync failures in total:", F.sync_failures("cuda"))


if __name__ == "__main__":
    main()
