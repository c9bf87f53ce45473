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
