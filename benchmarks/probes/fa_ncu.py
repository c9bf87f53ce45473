"""Probe: run the library's attention forward on one shape for Nsight Compute (ncu) to profile.

Run on a GPU:  ncu --clock-control none -k regex:_gl_attn_fwd --launch-skip 1 --launch-count 1 \\
                   --section ComputeWorkloadAnalysis ... python3 benchmarks/probes/fa_ncu.py 64 32768 0

Arguments: head dim, tokens per sequence, causal (0/1); bf16, 16 heads, B * S = 32K. Calls the forward
twice (the first compiles and warms up).
"""
from __future__ import annotations

import sys

import torch
import triton


def main():
    from ringsoftmax.kernels.attention_fwd import attention_fwd
    D, S, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    B, H = max(1, 32768 // S), 16
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for _ in range(2):
        attention_fwd(q, k, v, softmax_scale=D ** -0.5, causal=causal)
    torch.cuda.synchronize()
    print("ran", D, S, causal)


if __name__ == "__main__":
    main()
