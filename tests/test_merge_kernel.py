"""The fused Triton merge kernel (kernels/merge.py) against the float64 LSE rule.

CPU tests run it in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py without CUDA);
GPU tests (``-m gpu``) add bfloat16 and larger shapes. Accumulators are strided views into bigger
buffers, and the parts of those buffers outside the view must stay untouched.
"""
import os

import pytest
import torch

from helpers import rel_err
from ringsoftmax.kernels.merge import merge_

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERP, reason="interpreter tests: TRITON_INTERPRET=1 (set without CUDA)")
NEG_INF = float("-inf")


def merge64(out_a, lse_a, out_b, lse_b):
    """The rule in float64: lse = logaddexp(a, b); out = exp(a - lse) out_a + exp(b - lse) out_b."""
    a, b = lse_a.double(), lse_b.double()
    lse = torch.logaddexp(a, b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.where(torch.isneginf(lse), 0, torch.exp(a - safe)).transpose(1, 2)[..., None]
    wb = torch.where(torch.isneginf(lse), 0, torch.exp(b - safe)).transpose(1, 2)[..., None]
    return wa * out_a.double() + wb * out_b.double(), lse


def make_case(b, s, h, d, dtype_b, device, scale=1e4):
    """Strided accumulators inside bigger buffers, a transposed out_b, lse with -inf and +-scale."""
    acc_buf = torch.randn(b, s + 5, h, d, device=device)
    acc_lse_buf = torch.randn(b, h, s + 9, device=device) * scale
    acc_out, acc_lse = acc_buf[:, 2:2 + s], acc_lse_buf[:, :, 4:4 + s]
    out_b = torch.randn(b, h, s, d, device=device).to(dtype_b).transpose(1, 2)  # (B, S, H, D), strided
    lse_b = (torch.randn(b, s, h, device=device) * scale).transpose(1, 2)       # (B, H, S), strided
    lse_b[:, :, 0] = NEG_INF                    # b empty
    acc_lse[:, :, min(1, s - 1)] = NEG_INF      # a empty
    acc_lse[:, 0, -1] = NEG_INF                 # both empty
    lse_b[:, 0, -1] = NEG_INF
    if s > 3:
        lse_b[:, :, 3] = acc_lse[:, :, 3]       # equal lse: weights 1/2
        lse_b[:, :, 2] = acc_lse[:, :, 2] + 0.5
    return acc_buf, acc_lse_buf, acc_out, acc_lse, out_b, lse_b


def run_case(b, s, h, d, dtype_b, device, tol):
    acc_buf, acc_lse_buf, acc_out, acc_lse, out_b, lse_b = make_case(b, s, h, d, dtype_b, device)
    # where a side is empty its out is 0, as the (out, lse) contract says
    acc_out.mul_(torch.isfinite(acc_lse).transpose(1, 2)[..., None])
    want_out, want_lse = merge64(acc_out, acc_lse, out_b, lse_b)
    buf0, lse_buf0 = acc_buf.clone(), acc_lse_buf.clone()
    merge_(acc_out, acc_lse, out_b, lse_b)
    assert not torch.isnan(acc_out).any() and not torch.isnan(acc_lse).any()
    assert rel_err(acc_out, want_out) <= tol, f"out: {rel_err(acc_out, want_out):.2e}"
    assert rel_err(acc_lse, want_lse) <= 1e-6, f"lse: {rel_err(acc_lse, want_lse):.2e}"
    assert (acc_out[:, -1, 0] == 0).all() and torch.isneginf(acc_lse[:, 0, -1]).all()
    # the rest of the buffers is untouched
    assert torch.equal(acc_buf[:, :2], buf0[:, :2]) and torch.equal(acc_buf[:, 2 + s:], buf0[:, 2 + s:])
    assert torch.equal(acc_lse_buf[..., :4], lse_buf0[..., :4])
    assert torch.equal(acc_lse_buf[..., 4 + s:], lse_buf0[..., 4 + s:])


@cpu_only
@pytest.mark.parametrize("dtype_b", [torch.float32, torch.float16])
@pytest.mark.parametrize("d", [1, 16, 40, 200])
def test_merge_cpu(d, dtype_b):
    run_case(2, 5, 3, d, dtype_b, "cpu", 1e-6 if dtype_b == torch.float32 else 1e-6)


@cpu_only
def test_merge_both_empty_stays_identity_cpu():
    acc_out = torch.zeros(1, 4, 2, 8)
    acc_lse = torch.full((1, 2, 4), NEG_INF)
    out_b = torch.full((1, 4, 2, 8), float("nan"))  # garbage under lse = -inf must not leak
    lse_b = torch.full((1, 2, 4), NEG_INF)
    merge_(acc_out, acc_lse, out_b, lse_b)
    assert (acc_out == 0).all() and torch.isneginf(acc_lse).all()


@cpu_only
def test_merge_bad_inputs_cpu():
    acc, lse = torch.zeros(1, 4, 2, 8), torch.zeros(1, 2, 4)
    with pytest.raises(ValueError):
        merge_(acc, lse.transpose(1, 2), acc, lse)                   # lse not (B, H, S)
    with pytest.raises(TypeError):
        merge_(acc.half(), lse, acc, lse)                            # accumulator not float32
    with pytest.raises(ValueError):
        merge_(acc, lse, torch.zeros(1, 4, 2, 16)[..., ::2], lse)    # head_dim stride != 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_b", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b, s, h, d", [(2, 1000, 8, 64), (1, 4097, 3, 128), (3, 77, 5, 200)])
def test_merge_gpu(b, s, h, d, dtype_b):
    run_case(b, s, h, d, dtype_b, "cuda", 1e-6)
