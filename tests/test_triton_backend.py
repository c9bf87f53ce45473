"""The public API on the Triton kernels: in the interpreter on CPU tensors (CI), on CUDA with -m gpu.

RINGSOFTMAX_BACKEND=triton routes every block through ringsoftmax/kernels; the spawned ring
processes inherit it. Regime thresholds are lowered so the split-row paths run at small sizes.
"""
import os

import pytest
import torch

import ringsoftmax as rs
from ringsoftmax.kernels import softmax_bwd as B
from ringsoftmax.kernels import softmax_fwd as F

from dist_utils import run_world
from helpers import assert_close, softmax64
from test_ring import _ring_softmax_cases

interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


@pytest.fixture
def triton_backend(monkeypatch):
    monkeypatch.setenv("RINGSOFTMAX_BACKEND", "triton")


@pytest.fixture
def split_rows(monkeypatch):
    """Rows longer than 64 elements take the split (two-pass) paths."""
    monkeypatch.setattr(F, "ROWS_MAX_N", {4: 64, 2: 64})
    monkeypatch.setattr(F, "STREAM_TILE", {4: 64, 2: 64})
    monkeypatch.setattr(B, "BWD_ROWS_MAX_N", 64)


@interpreter
@pytest.mark.parametrize("rows_regime", ["rows", "split"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 2e-3)])
def test_softmax_api_on_kernels(triton_backend, request, rows_regime, dtype, tol):
    if rows_regime == "split":
        request.getfixturevalue("split_rows")
    # magnitudes 1e4 for the forward; 3 for the gradient (at 1e4 y is one-hot and dx ~ 0)
    for scale, check_grad in ((1e4, False), (3.0, True)):
        x = (torch.randn(3, 200, 5, dtype=torch.float64) * scale).to(dtype)
        x[:, :7] = float("-inf")
        x[1] = float("-inf")                              # all -inf rows along dim 1
        xr = x.double().requires_grad_()
        want_y, want_lse = softmax64(xr, 1)
        g = torch.randn_like(want_y)
        (want_y * g).sum().backward()
        xk = x.clone().requires_grad_()
        y, lse = rs.softmax_with_lse(xk, dim=1)           # dim 1 of 3: rows are strided views
        (y.double() * g).sum().backward()
        assert y.dtype == dtype and lse.dtype == torch.float32
        assert_close(f"y at {scale}", y, want_y, tol)
        assert_close(f"lse at {scale}", lse, want_lse, 1e-6)
        if check_grad:
            assert_close("dx", xk.grad, xr.grad, tol)


@interpreter
def test_ring_softmax_on_kernels(triton_backend):
    run_world(3, _ring_softmax_cases, ((torch.float32, 1e-5),), (100, 0, 37))


def _attention_grads(q, k, v, g, causal, **kw):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = kw.pop("fn", rs.attention)(q, k, v, causal=causal, **kw)
    (out.double() * g).sum().backward()
    return out, lse, q.grad, k.grad, v.grad


@interpreter
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 5e-3)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_api_on_kernels(triton_backend, dtype, tol, causal):
    torch.manual_seed(3)
    q = torch.randn(1, 19, 4, 16).to(dtype)
    k, v = torch.randn(1, 23, 2, 16).to(dtype), torch.randn(1, 23, 2, 16).to(dtype)
    g = torch.randn(1, 19, 4, 16, dtype=torch.float64)
    got = _attention_grads(q, k, v, g, causal)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RINGSOFTMAX_BACKEND", "torch")
        want = _attention_grads(q.double(), k.double(), v.double(), g, causal)
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert_close(name, a, b, tol)


@interpreter
def test_attention_varlen_api_on_kernels(triton_backend):
    cu = torch.tensor([0, 1, 8, 21], dtype=torch.int32)
    q, k, v = torch.randn(21, 2, 16), torch.randn(21, 1, 16), torch.randn(21, 1, 16)
    g = torch.randn(21, 2, 16, dtype=torch.float64)
    got = _attention_grads(q, k, v, g, True, fn=lambda *a, **kw: rs.attention_varlen(*a, cu_seqlens_q=cu, **kw))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RINGSOFTMAX_BACKEND", "torch")
        want = _attention_grads(q.double(), k.double(), v.double(), g, True,
                                fn=lambda *a, **kw: rs.attention_varlen(*a, cu_seqlens_q=cu, **kw))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert_close(name, a, b, 1e-5)


def _ring_attention_on_kernels(rank, world):
    from test_ring import _ring_attention_case
    for layout in ("zigzag", "stripe"):
        _ring_attention_case(rank, world, layout, True, 4, 2, 6, torch.float32, 1e-5, d=16)
    _ring_attention_case(rank, world, "contiguous", False, 2, 1, 5, torch.float32, 1e-5, d=16)


@interpreter
def test_ring_attention_on_kernels(triton_backend):
    run_world(2, _ring_attention_on_kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 2e-2), (torch.float32, 1e-5)])
def test_public_api_on_cuda_default_dispatch(dtype, tol):
    """CUDA tensors take the kernels by default: softmax and attention with autograd vs float64."""
    torch.manual_seed(5)
    x = (torch.randn(37, 70001, device="cuda") * 3).to(dtype)
    x[3] = float("-inf")
    xr = x.double().requires_grad_()
    want_y, want_lse = softmax64(xr, 1)
    g = torch.randn_like(want_y)
    (want_y * g).sum().backward()
    xk = x.clone().requires_grad_()
    y, lse = rs.softmax_with_lse(xk, 1)
    (y.double() * g).sum().backward()
    assert_close("y", y, want_y, tol)
    assert_close("lse", lse, want_lse, 1e-6)
    assert_close("dx", xk.grad, xr.grad, tol)

    q = torch.randn(2, 1000, 8, 128, device="cuda").to(dtype)
    k, v = (torch.randn(2, 777, 2, 128, device="cuda").to(dtype) for _ in range(2))
    g = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.float64)
    got = _attention_grads(q, k, v, g, True)
    want = _attention_grads(q.double(), k.double(), v.double(), g, True)     # float64: the torch reference
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert_close(name, a, b, tol if name != "lse" else 1e-5)
