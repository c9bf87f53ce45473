"""Probe: run one split-row softmax launch for Nsight Compute (ncu) to profile.

Run on a GPU:  ncu --clock-control none -k regex:_staged_kernel --launch-skip 1 --launch-count 1 \\
                   --section SpeedOfLight ... python3 benchmarks/probes/softmax_ncu.py fwd bf16 262144

Calls the library's default path twice (the first compiles and warms up), M = 2^28 / N rows.
"""
from __future__ import annotations

import sys

import torch

from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main():
    direction, dname, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    total = int(sys.argv[4]) if len(sys.argv) > 4 else 1 << 28
    m = max(1, total // n)
    x = torch.randn(m, n, device="cuda").to(DTYPES[dname])
    if direction == "copy":
        y = torch.empty_like(x)
        run = lambda: y.copy_(x)  # noqa: E731
    elif direction == "fwd":
        run = lambda: F.softmax_fwd(x)  # noqa: E731
    else:
        y = torch.softmax(x.float(), -1).to(x.dtype)
        dy = torch.randn_like(y)
        run = lambda: B.softmax_bwd(y, dy)  # noqa: E731
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    print("ran", direction, dname, n, m)


if __name__ == "__main__":
    main()
