"""Input validation of the single-device API (softmax, attention, attention_varlen, merge, the
reference path's empty problems) and of launch/ring_demo.py's arguments; tiny tensors only.

Tests marked with the ``backend`` fixture run on both backends: the plain-torch reference and the
Triton kernels (``RINGSOFTMAX_BACKEND=triton``: on CUDA tensors where there is a GPU, else in Triton's
interpreter on CPU tensors, which conftest.py switches on before triton is imported).
"""
import importlib.util
import math
import os

import pytest
import torch

import ringsoftmax as rs
from ringsoftmax import reference
from ringsoftmax.attention import MAX_SCALE, default_scale

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    monkeypatch.setenv("RINGSOFTMAX_BACKEND", request.param)
    return request.param


def _qkv(b=1, s=4, h=2, hkv=1, d=8, dtype=torch.float32, device="cpu", grad=False):
    shapes = ((b, s, h, d), (b, s, hkv, d), (b, s, hkv, d))
    return [torch.randn(shape, dtype=dtype, device=device).requires_grad_(grad) for shape in shapes]


# ------------------------------------------------------------------ #3 double backward raises
DOUBLE = "double backward is not supported"


def test_softmax_double_backward_raises(backend):
    x = torch.randn(3, 4, device=DEVICE, requires_grad=True)
    w = torch.randn(3, 4, device=DEVICE)
    g = torch.autograd.grad((rs.softmax(x) * w).sum(), x, create_graph=True)[0]
    want = torch.autograd.grad((torch.softmax(x, -1) * w).sum(), x)[0]
    assert torch.allclose(g, want, atol=1e-6)  # the first-order gradient itself is right
    with pytest.raises(RuntimeError, match=f"softmax: {DOUBLE}"):
        torch.autograd.grad(g.pow(2).sum(), x)
    # a gradient penalty mixes in a first-order term: still an error, not silently missing terms
    g = torch.autograd.grad((rs.softmax(x) * w).sum(), x, create_graph=True)[0]
    with pytest.raises(RuntimeError, match=f"softmax: {DOUBLE}"):
        torch.autograd.grad(g.pow(2).sum() + (rs.softmax(x) * w).sum(), x)
    g = torch.autograd.grad(rs.softmax_with_lse(x, 0)[1].sum(), x, create_graph=True)[0]
    with pytest.raises(RuntimeError, match=f"softmax: {DOUBLE}"):
        torch.autograd.grad(g.pow(2).sum(), x)


def test_attention_double_backward_raises(backend):
    q, k, v = _qkv(device=DEVICE, grad=True)
    out, lse = rs.attention(q, k, v, causal=True)
    g = torch.autograd.grad(out.sum() + lse.sum(), (q, k, v), create_graph=True)
    with pytest.raises(RuntimeError, match=f"attention: {DOUBLE}"):
        torch.autograd.grad(sum(t.pow(2).sum() for t in g), q)
    cu = torch.tensor([0, 1, 4], dtype=torch.int32, device=DEVICE)
    out, _ = rs.attention_varlen(q[0], k[0], v[0], cu, causal=True)
    g = torch.autograd.grad(out.pow(2).sum(), k, create_graph=True)[0]
    with pytest.raises(RuntimeError, match=f"attention: {DOUBLE}"):
        torch.autograd.grad(g.pow(2).sum(), k)


def test_create_graph_without_a_second_backward_still_works(backend):
    x = torch.randn(2, 5, device=DEVICE, requires_grad=True)
    g = torch.autograd.grad(rs.softmax(x)[:, 0].sum(), x, create_graph=True)[0]
    want = torch.autograd.grad(torch.softmax(x, -1)[:, 0].sum(), x)[0]
    assert torch.allclose(g.detach(), want, atol=1e-6)


# ------------------------------------------------------------------ softmax_scale (#4, #7)
def test_softmax_scale_tensor_that_requires_grad_is_rejected():
    q, k, v = _qkv()
    scale = torch.tensor(0.3, requires_grad=True)
    for call in (lambda: rs.attention(q, k, v, softmax_scale=scale),
                 lambda: rs.attention_varlen(q[0], k[0], v[0], torch.tensor([0, 4]), softmax_scale=scale)):
        with pytest.raises(TypeError, match="softmax_scale must be a Python number.*requires grad"):
            call()


def test_softmax_scale_numbers_and_constant_tensors_still_work():
    q, k, v = _qkv()
    want = rs.attention(q, k, v, softmax_scale=0.5)[0]
    for scale in (torch.tensor(0.5), torch.tensor(0.5, dtype=torch.float64), 0.5):
        assert torch.equal(rs.attention(q, k, v, softmax_scale=scale)[0], want)
    assert default_scale(q, 2) == 2.0
    assert default_scale(q, None) == 1 / math.sqrt(8)
    with pytest.raises(TypeError, match="softmax_scale must be a Python number or None, got list"):
        default_scale(q, [0.5])


@pytest.mark.parametrize("scale", [1e39, 3e38, MAX_SCALE * 1.001])
def test_softmax_scale_beyond_float32_is_rejected(scale):
    with pytest.raises(ValueError, match="softmax_scale must be a positive finite number at most"):
        rs.attention(*_qkv(), softmax_scale=scale)
    from ringsoftmax.kernels.attention_fwd import check_scale
    with pytest.raises(ValueError, match="softmax_scale must be a positive finite number at most"):
        check_scale(scale)


def test_largest_softmax_scale_is_accepted():
    from ringsoftmax.kernels.attention_fwd import check_scale
    assert default_scale(_qkv()[0], MAX_SCALE) == check_scale(MAX_SCALE) == MAX_SCALE


# ------------------------------------------------------------------ #5 causal must be a bool
@pytest.mark.parametrize("causal", ["False", 1, None])
def test_causal_must_be_a_bool(causal):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="attention: causal must be a bool"):
        rs.attention(q, k, v, causal=causal)
    with pytest.raises(TypeError, match="attention_varlen: causal must be a bool"):
        rs.attention_varlen(q[0], k[0], v[0], torch.tensor([0, 4]), causal=causal)


# ------------------------------------------------------------------ #9 empty batch or heads
@pytest.mark.parametrize("b,h,hkv", [(0, 2, 1), (1, 0, 2), (0, 0, 1)])
def test_empty_batch_or_heads(backend, b, h, hkv):
    q, k, v = _qkv(b=b, s=3, h=h, hkv=hkv, device=DEVICE, grad=True)
    for causal in (False, True):
        out, lse = rs.attention(q, k, v, causal=causal)
        assert out.shape == (b, 3, h, 8) and lse.shape == (b, h, 3)
        dq, dk, dv = torch.autograd.grad(out.sum() + lse.sum(), (q, k, v))
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
        assert not dk.any() and not dv.any()


def test_reference_attention_of_empty_batch_or_heads():
    for b, h, hkv in ((0, 2, 1), (1, 0, 2)):
        q, k, v = _qkv(b=b, s=3, h=h, hkv=hkv)
        out, lse = reference.attention_fwd(q, k, v, softmax_scale=0.5, causal=True)
        assert out.shape == q.shape and lse.shape == (b, h, 3)
        delta = reference.attention_delta(out, out)
        grads = reference.attention_bwd(q, k, v, out, out, lse, delta, softmax_scale=0.5, causal=True)
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    q, k, v = (t[0] for t in _qkv(s=5, h=0, hkv=2, grad=True))
    out, lse = rs.attention_varlen(q, k, v, torch.tensor([0, 2, 5]))
    assert out.shape == (5, 0, 8) and lse.shape == (0, 5)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


# ------------------------------------------------------------------ #10, #14 head_dim
def test_head_dim_zero_is_rejected():
    with pytest.raises(ValueError, match=r"attention: head_dim must be >= 1, got q of shape \(1, 4, 2, 0\)"):
        rs.attention(*_qkv(d=0))
    with pytest.raises(ValueError, match="attention_varlen: head_dim must be >= 1"):
        rs.attention_varlen(*(t[0] for t in _qkv(d=0)), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="ring_attention: head_dim must be >= 1"):
        rs.ring_attention(*_qkv(d=0))


def test_head_dim_over_the_kernels_limit(backend):
    q, k, v = _qkv(s=2, h=1, d=300, device=DEVICE)
    if backend == "torch":  # the plain-torch path has no limit
        assert rs.attention(q, k, v)[0].shape == q.shape
        return
    with pytest.raises(ValueError, match=r"attention: head_dim is 300, but the Triton attention kernels .* 1\.\.256"):
        rs.attention(q, k, v)
    from ringsoftmax.kernels.attention_fwd import attention_fwd
    with pytest.raises(ValueError, match=r"attention kernels \(Triton\): head_dim must be in 1\.\.256, got 300"):
        attention_fwd(q, k, v, softmax_scale=0.1)


# ------------------------------------------------------------------ #12 softmax dim type
@pytest.mark.parametrize("dim,name", [(None, "NoneType"), (1.5, "float"), (1.0, "float"), ("1", "str")])
def test_softmax_dim_must_be_an_int(dim, name):
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match=f"softmax: dim must be an int, got {name}"):
        rs.softmax(x, dim=dim)
    with pytest.raises(TypeError, match=f"softmax_with_lse: dim must be an int, got {name}"):
        rs.softmax_with_lse(x, dim=dim)


def test_softmax_dim_int_like_still_works():
    x = torch.randn(2, 3)
    assert torch.equal(rs.softmax(x, dim=torch.tensor(0)), rs.softmax(x, dim=0))
    assert torch.equal(rs.softmax(x, dim=-1), rs.softmax(x, dim=1))


# ------------------------------------------------------------------ #13 merge
def test_merge_rejects_non_float_outs_and_non_tensors():
    o, lse = torch.randn(2, 5, 3, 4), torch.randn(2, 3, 5)
    for bad in (o.int(), o.bool(), o.to(torch.complex64)):
        with pytest.raises(TypeError, match=f"merge: out_a must be a floating-point tensor .*got {bad.dtype}"):
            rs.merge(bad, lse, o, lse)
        with pytest.raises(TypeError, match="merge: out_b must be a floating-point tensor"):
            rs.merge(o, lse, bad, lse)
    with pytest.raises(TypeError, match="merge: out_a must be a torch.Tensor, got list"):
        rs.merge(o.tolist(), lse, o, lse)
    with pytest.raises(TypeError, match="merge: lse_b must be a torch.Tensor, got float"):
        rs.merge(o, lse, o, 0.0)
    out, merged = rs.merge(o.half(), lse, o, lse)  # any float dtype still works
    assert out.dtype == torch.float32 and merged.shape == lse.shape


# ------------------------------------------------------------------ #15 varlen without cu_seqlens_k
def test_varlen_missing_cu_seqlens_k():
    q, _, _ = (t[0] for t in _qkv(s=8))
    _, k, v = (t[0] for t in _qkv(s=6))
    with pytest.raises(ValueError, match="cu_seqlens_k was not given.*k has 6 tokens and q has 8: pass cu_seqlens_k"):
        rs.attention_varlen(q, k, v, torch.tensor([0, 3, 8]))
    out, _ = rs.attention_varlen(q, k, v, torch.tensor([0, 3, 8]), torch.tensor([0, 2, 6]))
    assert out.shape == q.shape


# ------------------------------------------------------------------ #17 launch/ring_demo.py arguments
def _ring_demo():
    path = os.path.join(os.path.dirname(__file__), "..", "launch", "ring_demo.py")
    spec = importlib.util.spec_from_file_location("ring_demo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flag", ["--kv-heads", "--heads", "--iters", "--seqlen", "--batch", "--head-dim"])
@pytest.mark.parametrize("value", ["0", "-4"])
def test_ring_demo_rejects_sizes_below_one(capsys, flag, value):
    demo = _ring_demo()
    with pytest.raises(SystemExit) as exit_info:
        demo.parse_args([flag, value])
    assert exit_info.value.code == 2
    assert f"argument {flag}: must be >= 1, got {value}" in capsys.readouterr().err


def test_ring_demo_accepts_valid_sizes():
    args = _ring_demo().parse_args(["--heads", "4", "--kv-heads", "2", "--seqlen", "8", "--iters", "1"])
    assert (args.heads, args.kv_heads, args.seqlen, args.iters) == (4, 2, 8, 1)
