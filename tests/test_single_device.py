"""Single-device softmax and attention (the torch reference path) against float64, with gradients; on a GPU,
that a varlen call with its lengths on the CPU does not wait for the GPU."""
import math
import time

import pytest
import torch

import ringsoftmax as rs
from ringsoftmax import reference

from helpers import assert_close, attention64, gpu_sleep, softmax64


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape,dim", [((7, 1000), -1), ((3, 129, 5), 1), ((1,), 0), ((4, 2), 0)])
def test_softmax_with_lse_matches_float64(shape, dim, dtype, tol):
    x = (torch.randn(shape, dtype=torch.float64) * 1e4).to(dtype)
    if x.shape[dim] > 2:
        x.movedim(dim, -1)[..., 1] = float("-inf")
    if x.dim() > 1:
        x.movedim(dim, -1)[0] = float("-inf")          # an all -inf row: y = 0, lse = -inf
    y, lse = rs.softmax_with_lse(x, dim)
    want_y, want_lse = softmax64(x, dim)
    assert y.dtype == dtype and lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert_close("y", y, want_y, tol)
    assert_close("lse", lse, want_lse, 1e-6 if dtype != torch.float64 else 1e-14)


def test_softmax_on_non_contiguous_input_and_empty_rows():
    x = torch.randn(6, 8, dtype=torch.float64).t()
    assert_close("y", rs.softmax(x, 0), softmax64(x, 0)[0], 1e-14)
    y, lse = rs.softmax_with_lse(torch.empty(3, 0))
    assert y.shape == (3, 0) and lse.isneginf().all()


def test_softmax_gradients_gradcheck():
    x = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rs.softmax_with_lse(t, 1), (x,))
    assert torch.autograd.gradcheck(lambda t: rs.softmax(t, 0), (x,))


@pytest.mark.parametrize("shape,dim", [((5, 33), -1), ((3, 17, 4), 1), ((2, 3, 9), -1), ((6, 2), 0)])
def test_softmax_without_autograd_is_the_autograd_result(shape, dim):
    """Inputs that need no gradient skip autograd (no graph attached) and get the same values and
    shapes as inputs that do; gradients come back shaped like x along any dim."""
    x = torch.randn(shape, dtype=torch.float64) * 30
    x.movedim(dim, -1)[0] = float("-inf")
    y_plain, lse_plain = rs.softmax_with_lse(x, dim)
    xg = x.clone().requires_grad_(True)
    y_graph, lse_graph = rs.softmax_with_lse(xg, dim)
    assert y_plain.grad_fn is None and lse_plain.grad_fn is None and y_graph.grad_fn is not None
    assert torch.equal(y_plain, y_graph.detach()) and torch.equal(lse_plain, lse_graph.detach())
    assert torch.equal(rs.softmax(x, dim), y_plain) and torch.equal(rs.softmax(xg, dim).detach(), y_plain)
    with torch.no_grad():
        assert rs.softmax(xg, dim).grad_fn is None
    want_y, want_lse = softmax64(x, dim)
    assert y_plain.shape == x.shape and lse_plain.shape == want_lse.shape
    assert_close("y", y_plain, want_y, 1e-12)
    xr = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rs.softmax_with_lse(t, dim), (xr,))


def _qkv(b, sq, sk, h, hkv, d, dtype=torch.float64):
    return (torch.randn(b, sq, h, d, dtype=dtype), torch.randn(b, sk, hkv, d, dtype=dtype),
            torch.randn(b, sk, hkv, d, dtype=dtype))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h,hkv", [(4, 4), (4, 2), (6, 1)])
def test_attention_matches_float64_with_gradients(causal, h, hkv):
    q, k, v = (t.requires_grad_() for t in _qkv(2, 37, 45, h, hkv, 16))
    out, lse = rs.attention(q, k, v, causal=causal, softmax_scale=0.2)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    want, want_lse = attention64(qr, kr, vr, causal=causal, scale=0.2)
    (want * g).sum().backward()
    assert_close("out", out, want, 1e-12)
    assert_close("lse", lse, want_lse, 1e-12)
    for n, a, b in (("dq", q, qr), ("dk", k, kr), ("dv", v, vr)):
        assert_close(n, a.grad, b.grad, 1e-11)


def test_attention_gradcheck_including_lse():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 5, 6, 2, 1, 3))
    assert torch.autograd.gradcheck(lambda a, b, c: rs.attention(a, b, c, causal=True), (q, k, v))


def test_attention_block_positions_rows_without_visible_keys_and_chunking():
    q, k, v = _qkv(1, 23, 31, 2, 1, 8)
    qpos, kpos = 40 + 3 * torch.arange(23), 70 + 2 * torch.arange(31)  # queries below 70 see nothing
    out, lse = reference.attention_fwd(q, k, v, softmax_scale=0.3, causal=True, q_offset=40, q_stride=3,
                                       k_offset=70, k_stride=2, chunk=7)
    want, want_lse = attention64(q, k, v, causal=True, scale=0.3, q_pos=qpos, k_pos=kpos)
    assert lse[..., :10].isneginf().all() and (out[:, :10] == 0).all()
    assert_close("out", out, want, 1e-12)
    assert_close("lse", lse, want_lse, 1e-12)


def test_attention_varlen_matches_each_sequence():
    lens = [1, 7, 13]
    cu = torch.tensor([0, 1, 8, 21], dtype=torch.int32)
    q = torch.randn(21, 4, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(21, 2, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(21, 2, 8, dtype=torch.float64, requires_grad=True)
    out, lse = rs.attention_varlen(q, k, v, cu, causal=True)
    assert out.shape == (21, 4, 8) and lse.shape == (4, 21)
    start = 0
    for n in lens:
        sl = slice(start, start + n)
        want, want_lse = attention64(q[None, sl], k[None, sl], v[None, sl], causal=True)
        assert_close("out", out[sl], want[0], 1e-12)
        assert_close("lse", lse[:, sl], want_lse[0], 1e-12)
        start += n


@pytest.mark.gpu
def test_attention_varlen_lengths_on_the_cpu_do_not_wait_gpu():
    """cu_seqlens on the CPU (int64 here): the call queues its work behind a 200 ms GPU sleep without waiting for
    it, the caller may change them right after the call, and the output equals the call with them on the GPU."""
    torch.manual_seed(5)
    cu = torch.tensor([0, 300, 300, 1300, 1377])                              # (an empty sequence too)
    q, k, v = (torch.randn(1377, h, 64, device="cuda", dtype=torch.bfloat16) for h in (8, 2, 2))
    want, want_lse = rs.attention_varlen(q, k, v, cu.cuda(), causal=True)   # (also compiles the kernels)
    torch.cuda.synchronize()
    gpu_sleep(0.2)
    start = time.perf_counter()
    out, lse = rs.attention_varlen(q, k, v, cu, causal=True)
    host = time.perf_counter() - start
    cu[1:] = 0
    torch.cuda.synchronize()
    assert host < 0.1, f"the call took {host * 1e3:.1f} ms of host time: it waited for the GPU's 200 ms sleep"
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_attention_varlen_gradcheck():
    cu = torch.tensor([0, 1, 4, 6], dtype=torch.int32)
    q, k, v = (torch.randn(6, h, 3, dtype=torch.float64, requires_grad=True) for h in (2, 1, 1))
    assert torch.autograd.gradcheck(lambda a, b, c: rs.attention_varlen(a, b, c, cu, causal=True), (q, k, v))


def test_ring_functions_without_a_process_group_are_single_device():
    q, k, v = _qkv(1, 12, 12, 2, 2, 4)
    assert torch.equal(rs.ring_attention(q, k, v, causal=True), rs.attention(q, k, v, causal=True)[0])
    x = torch.randn(3, 9, dtype=torch.float64)
    assert torch.equal(rs.ring_softmax(x, 1), rs.softmax(x, 1))
    assert torch.equal(rs.shard(x, 1), x) and torch.equal(rs.unshard(x, 1), x)


def test_default_softmax_scale_is_inverse_sqrt_head_dim():
    q, k, v = _qkv(1, 4, 4, 1, 1, 9)
    assert torch.allclose(rs.attention(q, k, v)[0], rs.attention(q, k, v, softmax_scale=1 / math.sqrt(9))[0])
