"""Probe: the library's softmax with its module knobs set per variant, side by side with torch.compile.

Run on a GPU:
    python3 benchmarks/probes/knobs.py --sizes 300,4097 --dtypes bf16 --dirs fwd,bwd --rounds 3 \
        --variant 'lib=' --variant 'edges16=F.WHOLE_VECTOR_MIN_BYTES = dict(fwd=None, bwd=None)' \
        --variant 'tile8k=B.BWD_ROWS_TILE[2] = 8192; B.BWD_ROWS_CHUNK[2] = None'

A variant is ``name=statements``: Python run with ``F`` (``softmax_fwd``), ``B`` (``softmax_bwd``),
``S`` (``softmax_staged``) and ``H`` (``softmax_held``) in scope before each of its timings (not inside
the timed calls). Every upper-case knob of the four modules, and any of their functions a variant replaced, is restored
after each timing, so variants do not leak into each other.

For each (N, M = 2^28 // N, dtype, direction) each variant is checked once against float64 (max
error over the largest reference value), then timed once per round, in turn with torch.compile's
softmax (its backward through autograd, as ``launch/bench_softmax.py`` times it; ``--peer 0``:
without it). The medians are printed as GB/s and % of a device-to-device copy (forward 2 * bytes(x)
/ t, backward 3 * bytes(x) / t). The forward is ``softmax_fwd(x, with_lse=False)``, what
``ringsoftmax.softmax`` costs (``--lse 1``: with the lse).
"""
from __future__ import annotations

import argparse
import copy
import statistics

import torch

from softmax_staged import DTYPES, bench, copy_gbs  # same folder: the staged probe's helpers
from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F
from ringsoftmax.kernels import softmax_held as H
from ringsoftmax.kernels import softmax_staged as S

MODULES = (F, B, S, H)


def is_knob(name: str, value) -> bool:
    """Public upper-case settings: plain values and containers (not modules, classes, functions)."""
    return name.isupper() and not name.startswith("_") and isinstance(
        value, (bool, int, float, str, tuple, list, dict, set, frozenset, type(None)))


def snapshot() -> list:
    """Copies of every upper-case attribute of the kernel modules (their knobs and tables), and their
    plain functions as they are (a variant may replace one, e.g. ``F.row_layout = ...``)."""
    return [{k: v if callable(v) else copy.deepcopy(v) for k, v in vars(m).items()
             if is_knob(k, v) or (callable(v) and not isinstance(v, type) and not k.startswith("__"))}
            for m in MODULES]


def restore(saved: list) -> None:
    for module, knobs in zip(MODULES, saved):
        for k, v in knobs.items():
            setattr(module, k, v if callable(v) else copy.deepcopy(v))


class knobs_set:
    """Context: ``statements`` applied to the knobs inside, every knob restored on leaving (applied once
    per timing, so the timed calls pay nothing for it)."""

    def __init__(self, statements: str, saved: list):
        self.code, self.saved = compile(statements or "pass", "<variant>", "exec"), saved

    def __enter__(self):
        exec(self.code, {"F": F, "B": B, "S": S, "H": H})

    def __exit__(self, *exc):
        restore(self.saved)


def off_boundary(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous copy of ``t`` that starts ``offset`` elements past a 16-byte boundary (``t`` if 0)."""
    if not offset:
        return t
    flat = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    out = flat[offset:].view(t.shape)
    out.copy_(t)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="300,4097")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--dirs", default="fwd,bwd")
    ap.add_argument("--variant", action="append", default=[], help="name=statements (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--elements", type=int, default=1 << 28, help="M * N (about)")
    ap.add_argument("--lse", type=int, default=0, help="forward: 1 times softmax_with_lse, 0 softmax (y only)")
    ap.add_argument("--peer", type=int, default=1, help="0: no torch.compile (saves its compile time)")
    ap.add_argument("--scale", type=float, default=3.0, help="x = randn * scale")
    ap.add_argument("--offset", type=int, default=0,
                    help="inputs (x; y and dy) start this many elements past a 16-byte boundary")
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in (args.variant or ["lib="]))
    saved = snapshot()
    copy_ = copy_gbs()
    print(f"copy {copy_:.0f} GB/s; {torch.cuda.get_device_name()} torch {torch.__version__}")
    for name, stmts in variants.items():
        print(f"variant {name}: {stmts or '(library)'}")
    print("dir | dtype | N | M | variant | GB/s | % copy | vs compile | max err")
    # (one compile per N: past dynamo's default limit of 8 the peer would silently run eager)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):  # (and past it, raise)
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    peer_fwd = torch.compile(lambda x: torch.softmax(x, -1), dynamic=False)
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        for n in map(int, args.sizes.split(",")):
            m = max(1, args.elements // n)
            x = off_boundary((torch.randn(m, n, device="cuda") * args.scale).to(dtype), args.offset)
            for direction in args.dirs.split(","):
                if direction == "fwd":
                    ref = torch.softmax(x.double(), -1)
                    nbytes = 2 * x.numel() * x.element_size()
                    ours = lambda: F.softmax_fwd(x, with_lse=bool(args.lse))[0]  # noqa: E731
                    peer = lambda: peer_fwd(x)  # noqa: E731
                else:
                    xx = x.detach().clone().requires_grad_()
                    yy = peer_fwd(xx) if args.peer else torch.softmax(xx, -1)
                    y, dy = off_boundary(yy.detach(), args.offset), off_boundary(torch.randn_like(yy), args.offset)
                    ref = y.double() * (dy.double() - (y.double() * dy.double()).sum(-1, keepdim=True))
                    nbytes = 3 * x.numel() * x.element_size()
                    ours = lambda: B.softmax_bwd(y, dy)  # noqa: E731
                    peer = lambda: torch.autograd.grad(yy, xx, dy, retain_graph=True)  # noqa: E731
                scale = ref.abs().max().item()
                errs = {}
                for name, stmts in variants.items():
                    with knobs_set(stmts, saved):
                        errs[name] = (ours().double() - ref).abs().max().item() / scale
                del ref
                times = {name: [] for name in ["torch.compile"] * args.peer + [*variants]}
                for _ in range(args.rounds):
                    if args.peer:
                        times["torch.compile"].append(bench(peer))
                    for name, stmts in variants.items():
                        with knobs_set(stmts, saved):
                            times[name].append(bench(ours))
                t_peer = statistics.median(times["torch.compile"]) if args.peer else float("nan")
                for name, ts in times.items():
                    t = statistics.median(ts)
                    err = f"{errs[name]:.1e}" if name in errs else "-"
                    print(f"{direction} | {dname} | {n} | {m} | {name} | {nbytes / t / 1e6:.0f} | "
                          f"{100 * nbytes / t / 1e6 / copy_:.1f} | {f'{t_peer / t:.2f}x' if args.peer else '-'} | {err}",
                          flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
