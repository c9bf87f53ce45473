"""Probe: host microseconds per small call of two library trees, side by side in one process.

Host time varies up to 2x between processes on the lent machines (sessions 48-50), more than most host
changes save, so two trees are compared in one process: the base tree's package is copied under another
name (its custom-op namespace renamed with it), both are imported, and each call is timed in rounds that
alternate between them. A batch is timed with the GPU held busy behind a sleep (``softmax_host.host_us``), so
no call waits on it; the table gives each call's median over the rounds per tree and their ratio.

    PYTHONPATH=$PWD python3 benchmarks/probes/host_ab.py --base DIR [--rounds 15] [--batch 100]

DIR: the base tree's ``ringsoftmax`` package directory (e.g. from ``git archive REV ringsoftmax | tar -x -C
/tmp/base``, then ``--base /tmp/base/ringsoftmax``).
"""
from __future__ import annotations

import argparse
import importlib
import os
import shutil
import statistics
import sys
import tempfile

import torch
from softmax_host import host_us  # same folder

import ringsoftmax


def load_copy(package_dir: str, name: str):
    """Import the package at ``package_dir`` as ``name`` (copied; its custom ops' namespace renamed too)."""
    root = tempfile.mkdtemp()
    target = os.path.join(root, name)
    shutil.copytree(package_dir, target, ignore=shutil.ignore_patterns("__pycache__"))
    for folder, _, files in os.walk(target):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(folder, file)
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(text.replace('"ringsoftmax::', f'"{name}::'))
    sys.path.insert(0, root)
    return importlib.import_module(name)


def calls_of(rs, x, xg, dy, y):
    """name -> call of one tree's public functions and kernel launchers."""
    F = importlib.import_module(rs.__name__ + ".kernels.softmax_fwd")
    B = importlib.import_module(rs.__name__ + ".kernels.softmax_bwd")

    def fwd_bwd():
        rs.softmax(xg).backward(dy)

    mx, sx = F.row_stats(x)

    return {
        "softmax": lambda: rs.softmax(x),
        "softmax_with_lse": lambda: rs.softmax_with_lse(x),
        "kernels softmax_fwd": lambda: F.softmax_fwd(x),
        "kernels row_stats": lambda: F.row_stats(x),
        "kernels normalize": lambda: F.normalize(x, mx, sx),
        "kernels softmax_bwd": lambda: B.softmax_bwd(y, dy),
        "kernels row_dot": lambda: B.row_dot(y, dy),
        "softmax forward + backward": fwd_bwd,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the base tree's ringsoftmax package directory")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--shapes", default="64x1024:bf16,8x4096:fp32")
    a = ap.parse_args()
    base = load_copy(a.base, "ringsoftmax_base")
    trees = {"base": base, "this": ringsoftmax}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; base {a.base}; this {ringsoftmax.__file__}; "
          f"median host us per call over {a.rounds} alternating rounds of {a.batch} calls")
    print("shape | call | base | this | this / base")
    for spec in a.shapes.split(","):
        shape, dtype = spec.split(":")
        m, n = map(int, shape.split("x"))
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dt)
        xg = x.clone().requires_grad_(True)
        dy = torch.randn_like(x)
        y = torch.softmax(x.float(), -1).to(dt)
        calls = {tree: calls_of(rs, x, xg, dy, y) for tree, rs in trees.items()}
        for tree in trees:  # warm: compile, plan, cache
            for fn in calls[tree].values():
                fn()
        # the trees agree (values), so the timings compare the same work
        for name in ("kernels softmax_fwd", "kernels softmax_bwd"):
            got = [calls[tree][name]() for tree in trees]
            got = [g[0] if isinstance(g, tuple) else g for g in got]
            assert torch.equal(got[0], got[1]), f"{name}: the trees disagree"
        for name in calls["this"]:
            times = {tree: [] for tree in trees}
            for _ in range(a.rounds):
                for tree in trees:
                    times[tree].append(host_us(calls[tree][name], a.batch, sleep_ms=50))
            med = {tree: statistics.median(v) for tree, v in times.items()}
            print(f"{spec} | {name} | {med['base']:.1f} | {med['this']:.1f} | {med['this'] / med['base']:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
