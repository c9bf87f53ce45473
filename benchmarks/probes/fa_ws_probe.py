"""Probe (issue 4): does Triton's Hopper warp specialization speed up the attention forward?

Standalone kernel, dense (B, S, H, D) bf16, on-device TMA descriptors, one key loop:
MASK=False: unmasked loop (Sk % BLOCK_N == 0); MASK=True: branch-free per-row key limit in the
same loop (what a causal / ragged step needs, since Triton 3.6's Hopper WS pass fails on two loops).
Compares WS on/off with our kernel and SDPA cuDNN. Prints a table.

Outcome (logs/2026-11-22-h200-attention-ws-probe.log): unmasked WS 128x128, 4 warps, 2 stages ran
548-553 TFLOP/s at D=128 against 450-459 for our kernel then, with the right output; the masked WS
variants were wrong, because triton 3.6's Hopper warp specialization, splitting the 128 rows over
two compute groups, offsets a ``start + arange`` row vector twice (seen in the TTGIR). The kernel
in ringsoftmax/kernels/attention_fwd.py therefore uses WS only where no tile needs a mask, and
stores out and lse through descriptors (scalar offsets).
"""
import sys
import torch
import triton
import triton.language as tl
import triton.testing


@triton.jit
def fa_probe(Q, K, V, Out, Lse, Sq, Sk, stride_s, H, qk_scale, causal_shift,
             D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr,
             MASK: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    base = b.to(tl.int64) * Sq * stride_s + h * D
    kbase = b.to(tl.int64) * Sk * stride_s + h * D
    dq = tl.make_tensor_descriptor(Q + base, shape=[Sq, D], strides=[stride_s, 1], block_shape=[BLOCK_M, D])
    dk = tl.make_tensor_descriptor(K + kbase, shape=[Sk, D], strides=[stride_s, 1], block_shape=[BLOCK_N, D])
    dv = tl.make_tensor_descriptor(V + kbase, shape=[Sk, D], strides=[stride_s, 1], block_shape=[BLOCK_N, D])
    start_m = pid_m * BLOCK_M
    q = dq.load([start_m, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    if MASK:
        # keys j < lim[row] are visible (causal_shift < 0: no causal limit)
        lim = tl.where(causal_shift >= 0, tl.minimum(offs_m + causal_shift + 1, Sk), Sk)
        hi = tl.minimum(tl.max(lim, 0), Sk)
    else:
        hi = Sk
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
        k = dk.load([start_n, 0])
        s = tl.dot(q, k.T)
        if MASK:
            s = tl.where((start_n + offs_n)[None, :] < lim[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_sub = m_new
        p = tl.math.exp2(s * qk_scale - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = dv.load([start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(Lse + pid_bh.to(tl.int64) * Sq + offs_m, (m_i + tl.math.log2(l_i)) * 0.6931471805599453,
             mask=offs_m < Sq)
    do = tl.make_tensor_descriptor(Out + base, shape=[Sq, D], strides=[stride_s, 1], block_shape=[BLOCK_M, D])
    do.store([start_m, 0], out.to(Out.dtype.element_ty))


def run_probe(q, k, v, causal, bm, bn, w, st, ws, mask):
    B, S, H, D = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(B, H, S, device=q.device, dtype=torch.float32)
    fa_probe[(triton.cdiv(S, bm), B * H)](q, k, v, out, lse, S, S, H * D, H, D ** -0.5 * 1.4426950408889634,
                                         0 if causal else -1, D=D, BLOCK_M=bm, BLOCK_N=bn, WS=ws,
                                         MASK=mask or causal, num_warps=w, num_stages=st)
    return out


def main():
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    from ringsoftmax.kernels.attention_fwd import attention_fwd
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for D in (64, 128):
        for S, B in ((8192, 4), (32768, 1)):
            for causal in (False, True):
                H = 16
                torch.manual_seed(0)
                q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    ref = torch.nn.functional.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
                    t_cudnn = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal), rep=300)
                t_ours = triton.testing.do_bench(lambda: attention_fwd(q, k, v, softmax_scale=D ** -0.5, causal=causal), rep=300)
                line = [f"D={D} S={S} {'causal' if causal else 'full'}", f"cudnn {flops / t_cudnn / 1e9:.0f}",
                        f"ours {flops / t_ours / 1e9:.0f}"]
                variants = [(128, 128, 4, 2, True, False), (128, 64, 4, 2, True, False), (128, 128, 4, 3, True, False),
                            (128, 128, 4, 2, True, True), (128, 128, 8, 3, False, False), (128, 64, 8, 3, False, False)]
                for bm, bn, w, st, ws, mask in variants:
                    if causal and not ws and not mask and False:
                        continue
                    name = f"{bm}x{bn}w{w}s{st}{'WS' if ws else ''}{'M' if mask else ''}"
                    try:
                        o = run_probe(q, k, v, causal, bm, bn, w, st, ws, mask)
                        err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
                        t = triton.testing.do_bench(lambda: run_probe(q, k, v, causal, bm, bn, w, st, ws, mask), rep=300)
                        line.append(f"{name} {flops / t / 1e9:.0f} (err {err:.1e})")
                    except Exception as e:  # noqa: BLE001
                        line.append(f"{name} FAIL {type(e).__name__}: {str(e)[:80]}")
                print(" | ".join(line), flush=True)
                rows.append(line)


if __name__ == "__main__":
    sys.exit(main())
