"""Probe (issue 4): the attention forward's load modes side by side, one GPU, one run.

Modes of ``attention_fwd``: pointer loads, TMA descriptor loads, TMA + warp specialization (used
only where every key is visible). Cells: head_dim 64/128; full, causal (diagonal block) and
"past" (causal, every key before every query: a ring step); 4K/16K/32K tokens, B*S = 32K, 16 heads,
bf16. SDPA cuDNN in the same run. Prints TFLOP/s and each mode's error against cuDNN.
"""
import torch
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from ringsoftmax.kernels import attention_config as config
from ringsoftmax.kernels.attention_fwd import attention_fwd

MODES = {"ptr": dict(fwd_tma=False, fwd_warp_spec=False), "tma": dict(fwd_tma=True, fwd_warp_spec=False),
         "ptr+ws": dict(fwd_tma=False, fwd_warp_spec=True),
         "tma+ws": dict(fwd_tma=True, fwd_warp_spec=True)}


def main():
    H = 16
    print("D  S      mask   | cudnn | " + " | ".join(MODES) + " | best/cudnn")
    for D in (64, 128):
        for S in (4096, 16384, 32768):
            B = 32768 // S
            for mask in ("full", "causal", "past"):
                g = torch.Generator(device="cuda").manual_seed(S + D)
                q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
                causal = mask != "full"
                q_off = S if mask == "past" else 0   # keys 0..S-1, queries S..2S-1: all visible
                flops = 4 * B * H * S * S * D * (0.5 if mask == "causal" else 1.0)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    sd = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=mask == "causal")  # noqa: E731
                    ref = sd().transpose(1, 2).float()
                    t_ref = triton.testing.do_bench(sd, rep=200)
                cells, best = [], 0.0
                for name, ov in MODES.items():
                    with config.override(**ov):
                        fn = lambda: attention_fwd(q, k, v, softmax_scale=D ** -0.5, causal=causal, q_offset=q_off)  # noqa: E731
                        out = fn()[0].float()
                        err = ((out - ref).norm() / ref.norm()).item()
                        t = triton.testing.do_bench(fn, rep=200)
                    tf = flops / t / 1e9
                    best = max(best, tf)
                    cells.append(f"{tf:4.0f} ({err:.0e})")
                print(f"{D:<3}{S:<7}{mask:<7}| {flops / t_ref / 1e9:4.0f} | " + " | ".join(cells)
                      + f" | {best / (flops / t_ref / 1e9):.2f}", flush=True)


if __name__ == "__main__":
    main()
