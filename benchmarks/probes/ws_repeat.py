"""Probe: do the warp-specialized backward kernels give the same bits on every run? One GPU.

The backward has no atomics, so repeated runs on the same inputs must agree bit for bit; a
pipeline race shows up as NaN or as gradients that change from run to run. For each shape below
and each dK/dV pipeline depth, every ring-step mask of the GPU tests (block pairs 1000x256,
128x517, 4096x4096) runs REPS times. Prints, per line, how many runs were bad and the first few
(Sq, Sk, mask case, "nan" | "diff").

    PYTHONPATH=$PWD python3 benchmarks/probes/ws_repeat.py 20 [block_m [stages,...]]

(block_m: the dK/dV tile's query rows, default 64; stages: default 3,2.)
"""
import sys

import torch

sys.path.insert(0, "tests")
from test_attention_kernels import MODES, all_visible, gpu_masks, rand  # noqa: E402

from ringsoftmax.kernels import attention_config  # noqa: E402
from ringsoftmax.kernels.attention_bwd import attention_bwd, attention_delta  # noqa: E402
from ringsoftmax.kernels.attention_fwd import attention_fwd  # noqa: E402


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    block_m = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    depths = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 else [3, 2]
    dev = torch.device("cuda")
    for D, H, Hkv, dtype in ((128, 8, 2, torch.bfloat16), (128, 4, 1, torch.float16), (64, 8, 2, torch.bfloat16)):
        if block_m > 64 and D > 64:   # 128 query rows: a D=64 tile only (D=128 does not fit)
            continue
        for stages in depths:
            n_bad, n, where = 0, 0, set()
            for Sq, Sk in ((1000, 256), (128, 517), (4096, 4096)):
                cases = [all_visible(Sk, c) for c in range(3)] + gpu_masks(Sq, Sk)
                for case, (causal, q_pos, k_pos) in enumerate(cases):
                    torch.manual_seed(case)
                    q = rand(2, Sq, H, D, dtype=dtype, device=dev, scale=1.5)
                    k = rand(2, Sk, Hkv, D, dtype=dtype, device=dev, scale=1.5)
                    v = rand(2, Sk, Hkv, D, dtype=dtype, device=dev)
                    dout = rand(2, Sq, H, D, dtype=dtype, device=dev)
                    kw = dict(softmax_scale=D ** -0.5, causal=causal, q_offset=q_pos[0], q_stride=q_pos[1],
                              k_offset=k_pos[0], k_stride=k_pos[1])
                    with attention_config.override(**MODES["tma+ws"]):
                        out, lse = attention_fwd(q, k, v, **kw)
                        delta = attention_delta(out, dout)
                    tile = attention_config.Tile(block_m, 128, 4, stages)
                    with attention_config.override(**MODES["tma+ws"], dkdv_ws=tile):
                        first = None
                        for _ in range(reps):
                            grads = attention_bwd(q, k, v, out, dout, lse, delta, **kw)
                            n += 1
                            nan = not all(torch.isfinite(g).all() for g in grads)
                            if first is None and not nan:
                                first = grads
                            diff = not nan and first is not None and not all(
                                torch.equal(a, b) for a, b in zip(first, grads))
                            if nan or diff:
                                n_bad += 1
                                where.add((Sq, Sk, case, "nan" if nan else "diff"))
            print(f"D={D} H={H} Hkv={Hkv} {dtype} dkdv_ws {block_m}x128 stages={stages}: {n_bad}/{n} runs bad "
                  f"{sorted(where)[:8]}", flush=True)


if __name__ == "__main__":
    main()
