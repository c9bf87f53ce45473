"""Bad input gets a clear error naming the argument; across ranks, every rank raises and none hangs."""

import pytest
import torch

import ringsoftmax as rs

from dist_utils import run_world


def _qkv(b=1, s=8, h=4, hkv=2, d=8, dtype=torch.float32):
    return torch.randn(b, s, h, d, dtype=dtype), torch.randn(b, s, hkv, d, dtype=dtype), torch.randn(b, s, hkv, d, dtype=dtype)


def test_softmax_bad_inputs():
    with pytest.raises(IndexError, match="dim=2 is out of range"):
        rs.softmax(torch.zeros(3, 4), dim=2)
    with pytest.raises(TypeError, match="float16, bfloat16, float32 or float64"):
        rs.softmax(torch.zeros(3, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        rs.softmax([1.0, 2.0])
    with pytest.raises(ValueError, match="scalar"):
        rs.softmax(torch.tensor(1.0), 0)


@pytest.mark.parametrize("change,error,match", [
    (lambda q, k, v: (q[0], k, v), ValueError, r"q must be \(batch, seqlen, heads, head_dim\)"),
    (lambda q, k, v: (q, k.double(), v), TypeError, "one dtype"),
    (lambda q, k, v: (q, k, v[:, :5]), ValueError, "k and v must have one shape"),
    (lambda q, k, v: (q[:, :, :3], k, v), ValueError, r"multiple of k/v's heads"),
    (lambda q, k, v: (q[..., :4], k, v), ValueError, "head_dim"),
    (lambda q, k, v: (q.int(), k.int(), v.int()), TypeError, "float16, bfloat16"),
    (lambda q, k, v: (torch.cat([q, q]), k, v), ValueError, "batch"),
])
def test_attention_bad_inputs(change, error, match):
    with pytest.raises(error, match=match):
        rs.attention(*change(*_qkv()))


@pytest.mark.parametrize("scale", [0.0, -0.5, float("nan"), float("inf")])
def test_attention_bad_softmax_scale(scale):
    with pytest.raises(ValueError, match="softmax_scale must be a positive finite number"):
        rs.attention(*_qkv(), softmax_scale=scale)
    with pytest.raises(ValueError, match="softmax_scale must be a positive finite number"):
        rs.ring_attention(*_qkv(), softmax_scale=scale)


def test_attention_varlen_bad_cu_seqlens():
    q, k, v = (t[0] for t in _qkv())
    with pytest.raises(ValueError, match="rise from 0 to 8"):
        rs.attention_varlen(q, k, v, torch.tensor([0, 5, 7], dtype=torch.int32))
    with pytest.raises(ValueError, match="1-D integer tensor"):
        rs.attention_varlen(q, k, v, torch.tensor([0.0, 8.0]))


def test_unknown_layout_and_uninitialized_group():
    with pytest.raises(ValueError, match="layout='ring' is unknown"):
        rs.ring_attention(*_qkv(), layout="ring")
    with pytest.raises(RuntimeError, match="init_process_group"):
        rs.ring_softmax(torch.zeros(2, 3), group=object())
    with pytest.raises(ValueError, match="multiple of 4"):
        from ringsoftmax.layouts import shard_for
        shard_for(torch.zeros(1, 10), 1, 0, 2, "zigzag")


def test_backend_switch_is_checked(monkeypatch):
    monkeypatch.setenv("RINGSOFTMAX_BACKEND", "cuda")
    with pytest.raises(ValueError, match="not a backend"):
        rs.softmax(torch.zeros(2, 3))
    monkeypatch.setenv("RINGSOFTMAX_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        rs.softmax(torch.zeros(2, 3))


def _expect(error, match, fn, *args, **kw):
    with pytest.raises(error, match=match):
        fn(*args, **kw)


def _distributed_errors(rank, world):
    other = RuntimeError, r"rank\(s\) \[1\] rejected their input"
    q, k, v = _qkv(s=6)
    # one rank's bad input: it raises its own error, the others a pointer to it; nobody hangs
    bad_k = k[:, :, :1].expand(1, 6, 3, 8) if rank == 1 else k
    err = (ValueError, "multiple of k/v's heads") if rank == 1 else other
    _expect(*err, rs.ring_attention, q, bad_k, v if rank != 1 else bad_k)
    err = (ValueError, "layout='nope' is unknown") if rank == 1 else other
    _expect(*err, rs.ring_attention, q, k, v, layout="nope" if rank == 1 else "zigzag")
    err = (IndexError, "dim=5 is out of range") if rank == 1 else other
    _expect(*err, rs.ring_softmax, torch.zeros(2, 3), dim=5 if rank == 1 else 1)
    # shards that disagree across ranks
    _expect(ValueError, "ranks disagree on q's shape", rs.ring_attention, *_qkv(s=6 + 2 * rank))
    _expect(ValueError, "ranks disagree on dtype", rs.ring_attention,
            *_qkv(s=6, dtype=torch.float64 if rank else torch.float32))
    _expect(ValueError, "ranks disagree on causal", rs.ring_attention, q, k, v, causal=bool(rank))
    err = (ValueError, "softmax_scale must be a positive") if rank == 1 else other
    _expect(*err, rs.ring_attention, q, k, v, softmax_scale=-1.0 if rank == 1 else None)
    _expect(ValueError, "ranks disagree on x's shape", rs.ring_softmax, torch.zeros(2 + rank, 3), dim=1)
    # a length the layout can't split, on every rank
    _expect(ValueError, "multiple of 4", rs.ring_attention, *_qkv(s=5))
    # q and k/v shards of different lengths
    _expect(ValueError, "q has 6 tokens but k/v have 4", rs.ring_attention, q, k[:, :4], v[:, :4])
    # after all that, the group still works
    out = rs.ring_softmax(torch.randn(2, 3 + rank), dim=1)
    assert out.shape == (2, 3 + rank)


def test_distributed_bad_inputs_raise_on_every_rank():
    run_world(2, _distributed_errors)
