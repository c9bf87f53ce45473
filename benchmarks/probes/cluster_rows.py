"""Probe: softmax rows of 32K-256K elements, each row on one thread-block cluster (Hopper), beside the library.

One program per row, launched with ``num_ctas = C``: Triton (3.7 and later; 3.6 fails to build these
layouts) spreads the program's [1, BLOCK] tile over the C CTAs of a cluster and reduces the row's
max and sum across them through distributed shared memory (``mapa`` / ``ld.shared::cluster`` and a
cluster barrier), so a row never waits on global memory for its statistic, unlike the staged
kernel's split rows. Rows need not be 16-byte aligned: the tile starts at the row's first element
rounded down to 16 bytes, so the loads and the stores of the row's interior are whole 16-byte
vectors; the up to 2 x (16 bytes - 1 element) at the row's ends are stored by a small second tile.

Run on a GPU (triton >= 3.7):
    python3 benchmarks/probes/cluster_rows.py [--sizes 50257,65537] [--dtypes bf16,fp32] [--rounds 3] \
        [--configs v2:4x8,v1:8x4]   (version:CTAs x warps)

Prints, per (N, M = 2^28 // N, dtype): the library's forward (``softmax_fwd(x, with_lse=False)``) and
each cluster config's % of a device-to-device copy (forward 2 * bytes(x) / t), medians of interleaved
rounds; each config is checked first against float64 (max error over the largest value), on rows with
-inf entries and an all -inf row, the output poisoned first.

Outcome (session 54, one H200, triton 3.9; benchmarks/RESULTS.md): right values, but slower than the
library at every length tried: bf16 30-71% of copy against its 78-88%, float32 42-85% against 87-98%.
Version 2's fewer instructions per element did not help, so the one-shot load / cluster wait / store
structure, not the arithmetic, holds it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from ringsoftmax.kernels import softmax_fwd as F  # noqa: E402
from softmax_staged import DTYPES, bench, copy_gbs  # noqa: E402  (same folder: the staged probe's helpers)


@triton.jit
def cluster_rows_fwd(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """y = softmax(x) over rows of N (>= 2 VEC) elements, one row per program, x and y alike aligned.

    x, y: (M, N) rows ``stride`` elements apart, float32 or 16-bit; float32 math. VEC: elements per
    16 bytes. BLOCK >= N + VEC - 1, a power of two."""
    # Stage 1: the row's place in whole 16-byte vectors: its first element is lane `lead` of the tile
    start = tl.program_id(0).to(tl.int64) * stride
    lead = (start % VEC).to(tl.int32)
    base = tl.multiple_of(start - lead, VEC)
    end = tl.multiple_of((lead + N + VEC - 1) // VEC * VEC, VEC)
    offs = tl.arange(0, BLOCK)[None, :]
    # Stage 2: load whole vectors, then drop the lanes outside the row
    x = tl.load(x_ptr + base + offs, mask=offs < end, other=-float("inf")).to(tl.float32)
    x = tl.where((offs >= lead) & (offs < lead + N), x, -float("inf"))
    # Stage 3: the row's max and sum (across the cluster's CTAs); an all -inf row gives 0
    m = tl.max(x, 1, keep_dims=True)
    m = tl.where(m == -float("inf"), 0.0, m)
    e = tl.exp2((x - m) * 1.4426950408889634)
    s = tl.sum(e, 1, keep_dims=True)
    inv = tl.where(s > 0, 1.0 / s, 0.0)
    # Stage 4: store the row's whole vectors
    lo = tl.multiple_of((lead + VEC - 1) // VEC * VEC, VEC)
    hi = tl.multiple_of((lead + N) // VEC * VEC, VEC)
    tl.store(y_ptr + base + offs, (e * inv).to(y_ptr.dtype.element_ty), mask=(offs >= lo) & (offs < hi))
    # Stage 5: the elements before lo and from hi on, at most VEC - 1 each
    j = tl.arange(0, 2 * VEC)[None, :]
    pos = tl.where(j < VEC, lead + j, hi + j - VEC)
    ok = tl.where(j < VEC, pos < lo, pos < lead + N)
    xe = tl.load(x_ptr + base + pos, mask=ok, other=-float("inf")).to(tl.float32)
    ye = tl.exp2((xe - m) * 1.4426950408889634) * inv
    tl.store(y_ptr + base + pos, ye.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def cluster_rows_fwd_v2(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """``cluster_rows_fwd`` with the row's whole vectors in the main tile from its lane 0 (one
    vector-uniform mask, no per-element lane test) and its ragged ends in the small tile throughout.
    BLOCK >= N."""
    # Stage 1: the row's whole vectors are [lo, hi) of the aligned block at `base`
    start = tl.program_id(0).to(tl.int64) * stride
    lead = (start % VEC).to(tl.int32)
    base = start - lead
    lo = (lead + VEC - 1) // VEC * VEC
    hi = (lead + N) // VEC * VEC
    body = tl.multiple_of(base + lo, VEC)
    width = tl.multiple_of(hi - lo, VEC)
    offs = tl.arange(0, BLOCK)[None, :]
    j = tl.arange(0, 2 * VEC)[None, :]
    pos = tl.where(j < VEC, lead + j, hi + j - VEC)
    ok = tl.where(j < VEC, pos < lo, pos < lead + N)
    # Stage 2: load the whole vectors and the ragged ends
    x = tl.load(x_ptr + body + offs, mask=offs < width, other=-float("inf")).to(tl.float32)
    xe = tl.load(x_ptr + base + pos, mask=ok, other=-float("inf")).to(tl.float32)
    # Stage 3: the row's max and sum (across the cluster's CTAs); an all -inf row gives 0
    m = tl.maximum(tl.max(x, 1, keep_dims=True), tl.max(xe, 1, keep_dims=True))
    ml = tl.where(m == -float("inf"), 0.0, m) * 1.4426950408889634
    e = tl.exp2(x * 1.4426950408889634 - ml)
    ee = tl.exp2(xe * 1.4426950408889634 - ml)
    s = tl.sum(e, 1, keep_dims=True) + tl.sum(ee, 1, keep_dims=True)
    inv = tl.where(s > 0, 1.0 / s, 0.0)
    # Stage 4: store both
    tl.store(y_ptr + body + offs, (e * inv).to(y_ptr.dtype.element_ty), mask=offs < width)
    tl.store(y_ptr + base + pos, (ee * inv).to(y_ptr.dtype.element_ty), mask=ok)


def cluster_softmax(x: torch.Tensor, y: torch.Tensor, ctas: int, warps: int, version: int = 2) -> torch.Tensor:
    """Launch ``cluster_rows_fwd`` (version 1) or ``_v2`` on (M, N) x with unit column stride into y of
    x's alignment."""
    m, n = x.shape
    vec = 16 // x.element_size()
    assert x.stride(1) == 1 and y.stride() == x.stride() and n >= 2 * vec
    assert x.data_ptr() % 16 == y.data_ptr() % 16
    kernel = cluster_rows_fwd if version == 1 else cluster_rows_fwd_v2
    block = triton.next_power_of_2(n + vec - 1 if version == 1 else n)
    kernel[(m,)](x, y, n, x.stride(0), BLOCK=block, VEC=vec, num_warps=warps, num_ctas=ctas)
    return y


def max_err(x: torch.Tensor, y: torch.Tensor) -> float:
    want = torch.softmax(x.double(), -1).nan_to_num(0.0)
    return ((y.double() - want).abs().max() / want.abs().max()).item()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="32000,50257,65537,100003,128256,151936")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--configs", default="v2:4x8,v2:8x4,v1:8x4", help="version:CTAsxwarps, comma-separated")
    args = p.parse_args()
    copy = copy_gbs()
    print(f"device | {torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | copy {copy:.0f} GB/s")
    configs = [(int(c[1]), *(int(v) for v in c[3:].split("x"))) for c in args.configs.split(",")]
    print("N | M | dtype | lib %copy | " + " | ".join(f"v{v}:{c}x{w} %copy (err)" for v, c, w in configs) + " | best / lib")
    for name in args.dtypes.split(","):
        dtype = DTYPES[name]
        for n in (int(s) for s in args.sizes.split(",")):
            m = (1 << 28) // n
            x = (torch.randn(m, n, device="cuda") * 30).to(dtype)
            x[0] = float("-inf")
            x[1, ::3] = float("-inf")
            gb = 2 * x.numel() * x.element_size() / 1e9
            calls, cells = {"lib": lambda: F.softmax_fwd(x, with_lse=False)}, {}
            for cfg in configs:
                v, c, w = cfg
                y = torch.full_like(x, float("nan"))
                per_thread = triton.next_power_of_2(n + 16 // x.element_size() - 1) // (c * w * 32)
                if per_thread > 128 or per_thread < 4:
                    cells[cfg] = "-"
                    continue
                try:
                    cluster_softmax(x, y, c, w, v)
                    torch.cuda.synchronize()
                    err = max_err(x, y)
                except Exception as ex:  # a build that this triton cannot make
                    cells[cfg] = f"error: {type(ex).__name__}"
                    continue
                cells[cfg] = f"err {err:.1e}"
                calls[cfg] = (lambda c=c, w=w, v=v, y=y: cluster_softmax(x, y, c, w, v))
            times = {k: [] for k in calls}
            for _ in range(args.rounds):
                for k, f in calls.items():
                    times[k].append(bench(f))
            pct = {k: 100 * gb / (statistics.median(v) * 1e-3) / copy for k, v in times.items()}
            row = [n, m, name, f"{pct['lib']:.1f}"]
            for cfg in configs:
                row.append(f"{pct[cfg]:.1f} ({cells[cfg]})" if cfg in pct else cells[cfg])
            best = max((v for k, v in pct.items() if k != "lib"), default=float("nan"))
            row.append(f"{best / pct['lib']:.3f}")
            print(" | ".join(str(v) for v in row), flush=True)
            del x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
