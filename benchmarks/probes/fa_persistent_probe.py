"""Probe (issue 4): a persistent warp-specialized attention forward beside the library's and cuDNN's.

Question: does a persistent grid (one program per multiprocessor walking query tiles, the key loop
warp-specialized inside) gain at short sequences, where the library's one-tile-per-program kernel
pays its prologue and epilogue once per 4K/128 = 32 key tiles? Triton 3.6 compiles this kernel
with Hopper warp specialization (a load warp and two compute groups, checked offline).

Dense, non-causal only (no masks, no GQA): a measurement, not a library path. Layout (B*H*S, D)
bf16 contiguous; writes out (bf16) and lse (float32, log2 units) like the library's forward.

    PYTHONPATH=$PWD python3 benchmarks/probes/fa_persistent_probe.py --seqlens 4096,32768 --dims 128,64
"""
import argparse

import torch
import triton
import triton.language as tl
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from ringsoftmax.kernels.attention_fwd import attention_fwd, descriptor_scratch


@triton.jit
def _keys(acc, l_i, m_i, q, desc_k, desc_v, row0, Sk, qk_scale, BLOCK_N: tl.constexpr, WS: tl.constexpr):
    """Online softmax over every key tile of one (batch, head), warp-specialized if WS."""
    for start_n in tl.range(0, Sk, BLOCK_N, warp_specialize=WS):
        k = desc_k.load([row0 + start_n, 0])
        s = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = desc_v.load([row0 + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _persistent_fwd(Q, K, V, O, L, Sq, Sk, BH, qk_scale, D: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, WS: tl.constexpr):
    """Program p takes query tiles p, p + P, ... of the (BH x Sq/BLOCK_M) tiles, in order."""
    desc_q = tl.make_tensor_descriptor(Q, shape=[BH * Sq, D], strides=[D, 1], block_shape=[BLOCK_M, D])
    desc_k = tl.make_tensor_descriptor(K, shape=[BH * Sk, D], strides=[D, 1], block_shape=[BLOCK_N, D])
    desc_v = tl.make_tensor_descriptor(V, shape=[BH * Sk, D], strides=[D, 1], block_shape=[BLOCK_N, D])
    desc_o = tl.make_tensor_descriptor(O, shape=[BH * Sq, D], strides=[D, 1], block_shape=[BLOCK_M, D])
    tiles_m = tl.cdiv(Sq, BLOCK_M)
    for tile in tl.range(tl.program_id(0), tiles_m * BH, tl.num_programs(0)):
        bh = tile // tiles_m
        row = bh * Sq + (tile % tiles_m) * BLOCK_M
        q = desc_q.load([row, 0])
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        acc, l_i, m_i = _keys(acc, l_i, m_i, q, desc_k, desc_v, bh * Sk, Sk, qk_scale, BLOCK_N, WS)
        desc_o.store([row, 0], (acc / l_i[:, None]).to(O.dtype.element_ty))
        tl.store(L + row + tl.arange(0, BLOCK_M), m_i + tl.log2(l_i))  # scalar base + bare arange


def persistent_fwd(q, k, v, block_n=128, ws=True, warps=4, stages=2, programs=None):
    """q, k, v (BH, S, D) bf16 contiguous -> out (BH, S, D), lse (BH, S) in log2 units."""
    bh, s, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(bh, s, device=q.device, dtype=torch.float32)
    grid = (programs or torch.cuda.get_device_properties(q.device).multi_processor_count,)
    with descriptor_scratch():
        _persistent_fwd[grid](q, k, v, out, lse, s, s, bh, d ** -0.5 * 1.4426950408889634, D=d, BLOCK_M=128,
                              BLOCK_N=block_n, WS=ws, num_warps=warps, num_stages=stages)
    return out, lse


VARIANTS = {"pers 128x128 ws": dict(), "pers 128x64 ws": dict(block_n=64), "pers 128x128 plain w8":
            dict(ws=False, warps=8), "pers 2/SM 128x64 ws": dict(block_n=64, programs=-2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="4096,32768")
    ap.add_argument("--dims", default="128,64")
    args = ap.parse_args()
    H = 16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          "fwd TFLOP/s, dense non-causal bf16, B*S = 32K, 16 heads (err vs cuDNN)")
    print("D | S | cuDNN | library | " + " | ".join(VARIANTS) + " | best persistent / library, / cuDNN", flush=True)
    for D in map(int, args.dims.split(",")):
        for S in map(int, args.seqlens.split(",")):
            B = max(1, 32768 // S)
            g = torch.Generator(device="cuda").manual_seed(S + D)
            q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            flops = 4 * B * H * S * S * D
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                sd = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)  # noqa: E731
                ref = sd().float()
                cudnn = flops / triton.testing.do_bench(sd, rep=200) / 1e9
            lib = lambda: attention_fwd(q, k, v, softmax_scale=D ** -0.5)  # noqa: E731
            lib_tf = flops / triton.testing.do_bench(lib, rep=200) / 1e9
            cells, best = [], 0.0
            flat = [x.reshape(B * H, S, D) for x in (qt, kt, vt)]
            for name, kw in VARIANTS.items():
                kw = dict(kw)
                if kw.get("programs", 0) < 0:
                    kw["programs"] = -kw["programs"] * sms
                try:
                    fn = lambda: persistent_fwd(*flat, **kw)  # noqa: E731
                    out = fn()[0].reshape(B, H, S, D).float()
                    err = ((out - ref).norm() / ref.norm()).item()
                    tf = flops / triton.testing.do_bench(fn, rep=200) / 1e9
                except Exception as e:  # noqa: BLE001 - a variant that does not compile is shown
                    cells.append(f"{type(e).__name__}: {str(e)[:80]}")
                    continue
                best = max(best, tf) if err < 1e-2 else best
                cells.append(f"{tf:.0f} ({err:.0e})")
            print(f"{D} | {S} | {cudnn:.0f} | {lib_tf:.0f} | " + " | ".join(cells)
                  + f" | {best / lib_tf:.2f}, {best / cudnn:.2f}", flush=True)


if __name__ == "__main__":
    main()
