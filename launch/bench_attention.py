"""Benchmark the Triton attention block kernels against SDPA (cuDNN, flash) and FlexAttention.

    python launch/bench_attention.py            # the full table: head_dim 64/128, 4K/16K/32K, causal or not
    python launch/bench_attention.py --quick    # 4K and 32K only
    python launch/bench_attention.py --sweep    # time tile variants of our kernels (tuning)

bf16, 16 heads, batch * seqlen = 32K tokens. TFLOP/s count 4*B*H*S^2*D for the forward (half of
it when causal) and 3.5x that for forward+backward. Ours is ``attention_fwd`` for the forward and
``attention_fwd + attention_delta + attention_bwd`` with bf16 gradients for forward+backward (what
``ringsoftmax.attention``'s autograd costs); peers run through autograd. Each cell is the median over
``--rounds`` rounds (every contestant timed once per round, in turn) of ``triton.testing.do_bench``'s
median (events). Peers that fail or are missing are printed as such.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ringsoftmax.kernels import attention_config as config  # noqa: E402
from ringsoftmax.kernels import attention_fwd as fwd_mod  # noqa: E402
from ringsoftmax.kernels.attention_bwd import attention_bwd, attention_delta  # noqa: E402
from ringsoftmax.kernels.attention_fwd import attention_fwd  # noqa: E402
from timing import interleaved_medians  # noqa: E402  (this folder)

HEADS, TOKENS, DTYPE = 16, 32768, torch.bfloat16


def bench(fn, warmup=25, rep=100):
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def fwd_flops(B, S, D, causal):
    return 4 * B * HEADS * S * S * D * (0.5 if causal else 1.0)


def make_inputs(B, S, D, seed=0):
    """(B, S, H, D) inputs for ours; SDPA/Flex get (B, H, S, D) contiguous copies of the same values."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(B, S, HEADS, D, device="cuda", dtype=DTYPE, generator=g) for _ in range(4))
    return q, k, v, do


# ----------------------------------------------------------------------------- ours
def ours_fwd(q, k, v, causal):
    return attention_fwd(q, k, v, softmax_scale=q.shape[-1] ** -0.5, causal=causal)


def ours_fwd_bwd(q, k, v, do, causal):
    scale = q.shape[-1] ** -0.5
    out, lse = attention_fwd(q, k, v, softmax_scale=scale, causal=causal)
    delta = attention_delta(out, do)
    dq, dk, dv = attention_bwd(q, k, v, out, do, lse, delta, softmax_scale=scale, causal=causal, grad_dtype=q.dtype)
    return out, dq, dk, dv


# ----------------------------------------------------------------------------- peers
def sdpa_fn(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def run(q, k, v, causal):
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


_FLEX = {}


def flex_fn():
    """FlexAttention compiled (dynamic=False, as the anchors); the block mask is built per shape.

    Every shape recompiles; past dynamo's recompile limit (8 by default) flex_attention would run
    eagerly and materialize the scores (seen: 64 GiB allocations at 32K), so raise the limit and
    make hitting it an error rather than a silent fallback."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cfg = torch._dynamo.config
    for name, value in (("recompile_limit", 64), ("cache_size_limit", 64), ("accumulated_recompile_limit", 4096),
                        ("fail_on_recompile_limit_hit", True)):
        if hasattr(cfg, name):
            setattr(cfg, name, value)
    if "fn" not in _FLEX:
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)

    def run(q, k, v, causal):
        S = q.shape[2]
        key = (S, causal)
        if key not in _FLEX:
            _FLEX[key] = (create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, S, S, device="cuda")
                          if causal else None)
        return _FLEX["fn"](q, k, v, block_mask=_FLEX[key])
    return run


def peer_calls(fn, q, k, v, do, causal):
    """(forward callable, forward+backward callable, (out, dq, dk, dv) in (B, S, H, D), seconds of the
    first call) of an autograd attention taking (B, H, S, D)."""
    qt, kt, vt = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    dot = do.transpose(1, 2).contiguous()
    t0 = time.time()
    out = fn(qt, kt, vt, causal)
    grads = torch.autograd.grad(out, (qt, kt, vt), dot)
    torch.cuda.synchronize()
    first_s = time.time() - t0
    return (lambda: fn(qt, kt, vt, causal), lambda: torch.autograd.grad(fn(qt, kt, vt, causal), (qt, kt, vt), dot),
            tuple(x.detach().transpose(1, 2) for x in (out, *grads)), first_s)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# ----------------------------------------------------------------------------- the table
def table(seqs, dims, budget_s, choice=None, rounds=3):
    """One row per (D, causal, S); ``choice[(D, causal)]`` overrides our tiles (from a sweep). Each
    cell is the median over ``rounds`` interleaved rounds (``timing.interleaved_medians``)."""
    t0 = time.time()
    peers = {"cudnn": sdpa_fn("cudnn"), "flash": sdpa_fn("flash"), "flex": None}
    try:
        peers["flex"] = flex_fn()
    except Exception as e:  # noqa: BLE001
        print(f"flex: unavailable: {e!r}"[:200])
    rows = []
    for D in dims:
        for causal in (False, True):
            for S in seqs:
                B = TOKENS // S
                q, k, v, do = make_inputs(B, S, D)
                fl = fwd_flops(B, S, D, causal)
                calls = {}
                ref = None
                for name, fn in peers.items():
                    if fn is None:
                        continue
                    if name == "flex" and time.time() - t0 > budget_s:
                        print(f"flex D={D} causal={causal} S={S}: skipped (time budget)")
                        continue
                    try:
                        f, fb, outs, first_s = peer_calls(fn, q, k, v, do, causal)
                        calls[name] = (f, fb)
                        if name == "flex":
                            print(f"flex D={D} causal={causal} S={S}: first call (compile) {first_s:.1f} s", flush=True)
                        if name == "cudnn":
                            ref = outs
                        del outs
                    except Exception as e:  # noqa: BLE001
                        print(f"{name} D={D} causal={causal} S={S}: FAIL {e!r}"[:300])
                ov = (choice or {}).get((D, causal), {})
                with config.override(**ov):
                    mine = ours_fwd_bwd(q, k, v, do, causal)
                    calls["ours"] = (lambda: ours_fwd(q, k, v, causal), lambda: ours_fwd_bwd(q, k, v, do, causal))
                    t = interleaved_medians({(name, i): f for name, pair in calls.items() for i, f in enumerate(pair)},
                                            rounds, bench)
                    res = {name: (t[(name, 0)], t[(name, 1)]) for name in calls}
                # agreement with cuDNN (both bf16): out, and the worst of dq, dk, dv
                err = (float("nan"),) * 2 if ref is None else (rel(mine[0], ref[0]),
                                                               max(rel(a, b) for a, b in zip(mine[1:], ref[1:])))
                del mine, ref, calls
                rows.append((D, causal, B, S, fl, res, err))
                print_row(rows[-1], flush=True)
                del q, k, v, do
                torch.cuda.empty_cache()
    return rows


def tf(fl, ms, mult=1.0):
    return mult * fl / ms / 1e9


def fmt(x):
    return "   -" if x is None else f"{x:4.0f}"


def ratio(a, b):
    return "   -" if (a is None or b is None) else f"{a / b:4.2f}"


def print_row(row, flush=False):
    D, causal, B, S, fl, res, err = row
    cells = {}
    for name in ("ours", "cudnn", "flash", "flex"):
        r = res.get(name)
        cells[name] = (None, None) if r is None else (tf(fl, r[0]), tf(fl, r[1], 3.5))
    f = " ".join(fmt(cells[n][0]) for n in ("ours", "cudnn", "flash", "flex"))
    fb = " ".join(fmt(cells[n][1]) for n in ("ours", "cudnn", "flash", "flex"))
    print(f"d{D:<3} {'causal' if causal else 'full  '} b{B:<2} s{S:<5} | fwd {f} | "
          f"{ratio(cells['ours'][0], cells['cudnn'][0])} {ratio(cells['ours'][0], cells['flex'][0])} | "
          f"fwd+bwd {fb} | {ratio(cells['ours'][1], cells['cudnn'][1])} {ratio(cells['ours'][1], cells['flex'][1])}"
          f" | {err[0]:.1e} {err[1]:.1e}", flush=flush)


HEADER = ("D    mask   B   S      | fwd TFLOP/s: ours cudnn flash flex | ours/cudnn ours/flex | "
          "fwd+bwd TFLOP/s: ours cudnn flash flex | ours/cudnn ours/flex | rel. diff from cudnn: out, grads")


# ----------------------------------------------------------------------------- tile sweep
T = config.Tile
# Variants: (kind, tile). "fwd" times attention_fwd; the others time the whole attention_bwd with
# one kernel's tile overridden (the other kernel on the table's tile): "dkdv" and "dkdv+split"
# (the dK/dV kernel without / with the separate loop for the last partial query tile), "dq", and
# "dkdv+atomic" (dQ by atomics in the dK/dV kernel, no dQ kernel).
SWEEP = {
    64: [("fwd", T(128, 64, 8, 3)),
         ("dkdv", T(32, 64, 4, 3)), ("dkdv", T(64, 64, 4, 3)),
         ("dkdv+split", T(32, 64, 4, 3)), ("dkdv+split", T(64, 64, 4, 3)), ("dkdv+split", T(64, 128, 8, 3)),
         ("dkdv+split", T(64, 128, 8, 2)),
         ("dq", T(128, 64, 8, 3)), ("dq", T(64, 64, 4, 3))],
    128: [("fwd", T(128, 128, 8, 3)),
          ("dkdv", T(64, 128, 8, 3)),
          ("dkdv+split", T(64, 128, 8, 3)), ("dkdv+split", T(64, 128, 8, 2)), ("dkdv+split", T(32, 128, 8, 3)),
          ("dkdv+split", T(32, 64, 4, 3)),
          ("dq", T(128, 128, 8, 2)), ("dq", T(128, 64, 8, 3))],
}


def _overrides(kind, tile):
    """config.override arguments for one variant (other settings stay on the table)."""
    if kind == "fwd":
        return {"fwd": tile}
    if kind == "dq":
        return {"dq": tile, "dq_atomic": False}
    return {"dkdv": tile, "dq_atomic": kind == "dkdv+atomic", "dkdv_split_tail": kind == "dkdv+split"}


def run_variant(D, causal, kind, tile, B, S, time_it=True):
    """(ms, the tile that ran) of one variant; ms = 0 when not timed (compile only)."""
    scale = D ** -0.5
    q, k, v, do = make_inputs(B, S, D, seed=1)
    with config.override(**_overrides(kind, tile)):
        if kind == "fwd":
            fn = lambda: attention_fwd(q, k, v, softmax_scale=scale, causal=causal)  # noqa: E731
        else:
            out, lse = attention_fwd(q, k, v, softmax_scale=scale, causal=causal)
            delta = attention_delta(out, do)
            fn = lambda: attention_bwd(q, k, v, out, do, lse, delta, softmax_scale=scale, causal=causal)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        ms = bench(fn) if time_it else 0.0
    if kind.startswith("dkdv"):
        key = ("dkdv", kind == "dkdv+atomic", kind == "dkdv+split")
    else:
        key = (kind,)
    key += ("cuda", triton.next_power_of_2(D), DTYPE, causal, tile)
    return ms, fwd_mod._FALLBACK_CHOICE.get(key, tile)


def _warm_one(job):
    """Compile one variant at a small shape (same specialization) so the timed run finds it cached."""
    D, causal, kind, tile = job
    try:
        run_variant(D, causal, kind, tile, 1, 1024, time_it=False)
        return None
    except Exception as e:  # noqa: BLE001
        return f"{job}: {e!r}"[:300]


def kernel_times(fn, reps=5):
    """Mean device time per call of each kernel fn launches (torch.profiler), as 'name ms' pairs."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    tot = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            tot[e.name] = tot.get(e.name, 0.0) + e.device_time / 1e3 / reps
    return ", ".join(f"{n[:28]} {ms:.3f}" for n, ms in sorted(tot.items(), key=lambda x: -x[1]) if ms > 0.01)


def sweep(dims, S, workers):
    """Time the variants of SWEEP at B*S = TOKENS; returns the best override per (D, causal)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    jobs = [(D, c, kind, t) for D in dims for c in (False, True) for kind, t in SWEEP[D]]
    t0 = time.time()
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        for msg in ex.map(_warm_one, jobs):
            if msg:
                print("compile:", msg)
    print(f"sweep: compiled {len(jobs)} variants in {time.time() - t0:.0f} s", flush=True)
    B = TOKENS // S
    best = {}
    for D in dims:
        for c in (False, True):
            fl = fwd_flops(B, S, D, c)
            times = {}
            for kind, t in SWEEP[D]:
                try:
                    ms, used = run_variant(D, c, kind, t, B, S)
                except Exception as e:  # noqa: BLE001
                    print(f"sweep d{D} causal={c} {kind} {t}: FAIL {e!r}"[:300])
                    continue
                if used != t:
                    print(f"sweep d{D} causal={c} {kind} {t}: fell back to {used}; not counted")
                    continue
                mult = 1.0 if kind == "fwd" else 2.5  # TFLOP/s as counted: backward = 2.5x forward
                print(f"sweep d{D} {'causal' if c else 'full'} s{S} {kind:11} bm{t.block_m:<3} bn{t.block_n:<3} "
                      f"w{t.num_warps} st{t.num_stages}: {ms:7.3f} ms {tf(fl, ms, mult):4.0f} TFLOP/s", flush=True)
                times[(kind, t)] = ms
            pick = lambda kinds: min(((ms, kt) for kt, ms in times.items() if kt[0] in kinds), default=None)  # noqa
            f, kv, qq, at = pick({"fwd"}), pick({"dkdv", "dkdv+split"}), pick({"dq"}), pick({"dkdv+atomic"})
            choice = {"fwd": f[1][1]}
            sep_ms = min(kv[0], qq[0]) if kv and qq else float("inf")
            if at and at[0] < sep_ms:
                choice.update(dkdv=at[1][1], dq_atomic=True, dkdv_split_tail=False)
            else:
                choice.update(dkdv=kv[1][1], dq=qq[1][1], dq_atomic=False, dkdv_split_tail=kv[1][0] == "dkdv+split")
            best[(D, c)] = choice
            print(f"sweep best d{D} causal={c}: fwd {f[0]:.3f} ms, separate-dQ bwd {sep_ms:.3f} ms, "
                  f"atomic-dQ bwd {at[0] if at else float('nan'):.3f} ms -> {choice}", flush=True)
            q, k, v, do = make_inputs(B, S, D, seed=2)
            with config.override(**choice):
                print(f"  kernels d{D} causal={c} fwd+bwd:", kernel_times(lambda: ours_fwd_bwd(q, k, v, do, c)),
                      flush=True)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4K and 32K tokens per sequence only")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--sweep", action="store_true", help="time tile variants of our kernels first")
    ap.add_argument("--table", action="store_true", help="with --sweep: then the table, on the sweep's best tiles")
    ap.add_argument("--sweep-seq", type=int, default=8192)
    ap.add_argument("--workers", type=int, default=12, help="processes compiling sweep variants")
    ap.add_argument("--flex-budget", type=float, default=1e9, help="seconds after which Flex cells are skipped")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per cell (medians)")
    args = ap.parse_args()
    dims = [int(d) for d in args.dims.split(",")]
    print(f"# bench_attention {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC | "
          f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
          f"{' '.join(sys.argv)}", flush=True)
    choice = None
    if args.sweep:
        choice = sweep(dims, args.sweep_seq, args.workers)
        if not args.table:
            return
        print("table on the sweep's choice:", {f"d{d} causal={c}": v for (d, c), v in choice.items()}, flush=True)
    seqs = (4096, 32768) if args.quick else (4096, 16384, 32768)
    print(HEADER, flush=True)
    rows = table(seqs, dims, args.flex_budget, choice, args.rounds)
    print("\n" + HEADER)
    for r in rows:
        print_row(r)


if __name__ == "__main__":
    main()
