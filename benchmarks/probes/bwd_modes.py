"""Probe (issue 4): the attention backward's modes side by side, one GPU, one run.

Modes of ``attention_bwd``: the plain kernels, and the warp-specialized kernels (every visible
tile in one loop, each tile masked) with a few tile choices. Cells: head_dim
64/128; full, causal (diagonal block) and "past" (causal, every key before every query: a ring
step); B*S = 32K tokens, 16 heads, bf16. Prints the backward's TFLOP/s (2.5x the forward's FLOPs),
which kernels ran, and each mode's largest relative difference (dq, dk, dv) from the plain mode;
then forward+backward of the default modes against SDPA cuDNN in the same run.

    PYTHONPATH=$PWD python3 benchmarks/probes/bwd_modes.py [seqlens [dims [modes]]]
    e.g. ... bwd_modes.py 4096,32768 64 "default,kvws 128x128,kvws dq128x64w8"
"""
import sys

import torch
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from ringsoftmax.kernels import attention_bwd as bwd_module
from ringsoftmax.kernels import attention_config as config
from ringsoftmax.kernels.attention_bwd import attention_bwd, attention_delta
from ringsoftmax.kernels.attention_fwd import attention_fwd

T = config.Tile
MODES = {
    "plain": dict(bwd_warp_spec=False),
    "default": {},
    "ws both": dict(bwd_warp_spec=True),
    "ws kv only": dict(dkdv_warp_spec=True, dq_warp_spec=False),
}
# extra modes, picked by name with the third argument (comma-separated, from MODES and these)
EXTRA = {
    "kvws 128x128": dict(dkdv_warp_spec=True, dq_warp_spec=False, dkdv_ws=T(128, 128, 4, 2)),
    "kvws 64x64": dict(dkdv_warp_spec=True, dq_warp_spec=False, dkdv_ws=T(64, 64, 4, 2)),
    "kvws dq128x64w8": dict(dkdv_warp_spec=True, dq_warp_spec=False, dq=T(128, 64, 8, 3)),
    "kvws dq64x64w4": dict(dkdv_warp_spec=True, dq_warp_spec=False, dq=T(64, 64, 4, 3)),
    "kvws dq64x32w4": dict(dkdv_warp_spec=True, dq_warp_spec=False, dq=T(64, 32, 4, 3)),
}


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    global MODES
    H = 16
    seqlens = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [8192, 32768]
    dims = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [128, 64]
    if len(sys.argv) > 3:
        MODES = {name: (MODES | EXTRA)[name] for name in sys.argv[3].split(",")}
    paths, real = [], bwd_module.launch

    def recording(kernel, grid, args, kwargs, tile, *rest, **kw):
        tag = "ws" if kwargs.get("WARP_SPEC") else "plain"
        paths.append(f"{'kv' if kernel is bwd_module._attn_bwd_dkdv_kernel else 'q'}:{tag}")
        return real(kernel, grid, args, kwargs, tile, *rest, **kw)

    bwd_module.launch = recording
    print("D   S      mask   | " + " | ".join(f"{m:>18}" for m in MODES))
    for D in dims:
        for S in seqlens:
            B = 32768 // S
            for mask in ("full", "causal", "past"):
                g = torch.Generator(device="cuda").manual_seed(S + D)
                q, k, v, do = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
                               for _ in range(4))
                causal = mask != "full"
                q_off = S if mask == "past" else 0
                flops = 2.5 * 4 * B * H * S * S * D * (0.5 if mask == "causal" else 1.0)
                kw = dict(softmax_scale=D ** -0.5, causal=causal, q_offset=q_off)
                with config.override(fwd_warp_spec=True):
                    out, lse = attention_fwd(q, k, v, **kw)
                delta = attention_delta(out, do)
                cells, ref = [], None
                for name, ov in MODES.items():
                    with config.override(**ov):
                        fn = lambda: attention_bwd(q, k, v, out, do, lse, delta, **kw)  # noqa: E731
                        paths.clear()
                        try:
                            grads = fn()
                        except Exception as e:  # a tile that does not fit: show it, go on
                            cells.append(f"{type(e).__name__}")
                            continue
                        ran = ",".join(dict.fromkeys(paths))
                        if ref is None:
                            ref = grads
                        err = max(rel(x, r) for x, r in zip(grads, ref))
                        t = triton.testing.do_bench(fn, rep=150)
                    cells.append(f"{flops / t / 1e9:4.0f} {err:.0e} {ran}")
                print(f"{D:<4}{S:<7}{mask:<7}| " + " | ".join(cells), flush=True)

    print("\nforward+backward (default modes) vs SDPA cuDNN, TFLOP/s (3.5x forward FLOPs)")
    for D in dims:
        for S in seqlens:
            B = 32768 // S
            for causal in (False, True):
                q, k, v, do = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                               for _ in range(4))
                flops = 3.5 * 4 * B * H * S * S * D * (0.5 if causal else 1.0)

                def ours():
                    o, lse = attention_fwd(q, k, v, softmax_scale=D ** -0.5, causal=causal)
                    return attention_bwd(q, k, v, o, do, lse, attention_delta(o, do), softmax_scale=D ** -0.5,
                                         causal=causal)
                qt, kt, vt, dot = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v, do))

                def cudnn():
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    return torch.autograd.grad(o, (qt, kt, vt), dot)
                t_ours = triton.testing.do_bench(ours, rep=200)
                t_ref = triton.testing.do_bench(cudnn, rep=200)
                print(f"D={D} S={S} causal={causal}: ours {flops / t_ours / 1e9:4.0f}  cuDNN {flops / t_ref / 1e9:4.0f}"
                      f"  ratio {t_ref / t_ours:.2f}", flush=True)


if __name__ == "__main__":
    main()
