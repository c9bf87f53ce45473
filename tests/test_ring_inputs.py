"""Input checks of the ring functions and shard / unshard (layouts.py, ring.py): without a process
group, on one gloo rank, and on two gloo ranks where the ranks' inputs disagree.

The two-rank checks run in a process group with a timeout of a few seconds, so a regression that
leaves a rank waiting fails the test instead of hanging it. After the checks, the group must
still work.
"""
import datetime

import pytest
import torch
import torch.distributed as dist

import ringsoftmax as rs
from ringsoftmax.layouts import LAYOUTS, shard_for, unshard_from
from ringsoftmax.ring import _pack, ring_loop

from dist_utils import run_world
from helpers import assert_close, attention64

OUT_OF_RANGE = r"dim=2 is out of range for a tensor of 2 dims \(use -2 \.\. 1\)"
REJECTED = r"rank\(s\) \[1\] rejected their input"


def _qkv(b=1, s=8, h=4, hkv=2, d=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, n, d, generator=g, dtype=dtype) for n in (h, hkv, hkv)]


# ------------------------------------------------------------------------------------------------
# one process: no process group, or one rank (the ring functions and shard / unshard fall back to
# one device, with the same checks)
# ------------------------------------------------------------------------------------------------

def _single_rank_checks(group=None):
    x = torch.arange(48.).reshape(4, 12)
    for fn in (rs.shard, rs.unshard):                                   # finding 2
        name = fn.__name__
        with pytest.raises(IndexError, match=f"{name}: {OUT_OF_RANGE}"):
            fn(x, 2, group=group)
        with pytest.raises(IndexError, match="dim=-3 is out of range"):
            fn(x, -3, group=group)
        with pytest.raises(TypeError, match="must be a torch.Tensor, got list"):
            fn([1.0, 2.0], 0, group=group)
        with pytest.raises(ValueError, match="at least one dimension.*scalar"):
            fn(torch.tensor(1.0), 0, group=group)
        with pytest.raises(TypeError, match="dim must be an int, got NoneType"):
            fn(x, None, group=group)
        assert fn(x, -1, group=group) is x
    q, k, v = _qkv(s=6)                                                 # finding 16
    with pytest.raises(ValueError, match="q has 6 tokens but k/v have 4"):
        rs.ring_attention(q, k[:, :4], v[:, :4], causal=True, group=group)
    xg = x.clone().requires_grad_()                                     # finding 18
    with pytest.raises(ValueError, match="unshard: x_shard requires grad, but unshard is not differentiable"):
        rs.unshard(xg, 1, group=group)
    with torch.no_grad():
        assert rs.unshard(xg, 1, group=group) is xg
    assert rs.unshard(xg.detach(), 1, group=group).requires_grad is False


def test_single_device_checks():
    _single_rank_checks()


def _one_rank(rank, world):
    _single_rank_checks(dist.new_group(timeout=datetime.timedelta(seconds=5)))


def test_one_rank_group_checks():
    run_world(1, _one_rank)


def test_shard_for_and_unshard_from_check_dim():
    x = torch.arange(48.).reshape(4, 12)
    with pytest.raises(IndexError, match=f"shard: {OUT_OF_RANGE}"):
        shard_for(x, 2, 0, 2)
    with pytest.raises(IndexError, match=f"unshard: {OUT_OF_RANGE}"):
        unshard_from([x, x], 2)
    with pytest.raises(ValueError, match="rank 2 is not one of the 2 ranks"):
        shard_for(x, 1, 2, 2)
    with pytest.raises(ValueError, match=r"shards\[1\] is \(4, 6\).*every shard must have one shape"):
        unshard_from([x, x[:, :6]], 1)
    for layout in LAYOUTS:                          # valid arguments, negative dim included: unchanged
        parts = [shard_for(x, -1, r, 2, layout) for r in range(2)]
        assert torch.equal(unshard_from(parts, -1, layout), x)


def test_agreement_row_covers_every_dim():
    """Finding 6: fields longer than the values sent as they are still compare whole."""
    shape = (1,) * 8
    assert _pack({"s": shape + (2, 3)}) != _pack({"s": shape + (3, 3)})
    assert _pack({"s": shape + (2, 3)}) != _pack({"s": shape + (2, 3, 1)})
    assert _pack({"s": shape + (2, 3)}) == _pack({"s": shape + (2, 3)})
    assert _pack({"d": (torch.float32,)}) != _pack({"d": (torch.int32,)})


# ------------------------------------------------------------------------------------------------
# two ranks
# ------------------------------------------------------------------------------------------------

def _expect(error, match, fn, *args, **kw):
    with pytest.raises(error, match=match):
        fn(*args, **kw)


def _unshard_checks(rank, world, g):
    x = torch.arange(24.).reshape(2, 12)
    s = rs.shard(x, 1, group=g)
    # finding 1: dtype and layout must agree
    _expect(ValueError, r"unshard: ranks disagree on dtype: rank 0 has torch.float32 and rank 1 has torch.float64",
            rs.unshard, s.double() if rank else s, 1, group=g)
    _expect(ValueError, r"unshard: ranks disagree on layout: rank 0 has 'zigzag' and rank 1 has 'stripe'",
            rs.unshard, s, 1, group=g, layout="stripe" if rank else "zigzag")
    # any dtype travels, non-contiguous shards too
    for t in (x.long(), x > 5, x.t().contiguous().t()):
        assert torch.equal(rs.unshard(rs.shard(t, 1, group=g), 1, group=g), t)
    # finding 2: out-of-range dim, on every rank or on one (the other raises too, none hangs)
    _expect(IndexError, f"shard: {OUT_OF_RANGE}", rs.shard, x, 2, group=g)
    _expect(IndexError, f"unshard: {OUT_OF_RANGE}", rs.unshard, s, 2, group=g)
    err = (IndexError, OUT_OF_RANGE) if rank else (RuntimeError, REJECTED)
    _expect(*err, rs.unshard, s, 2 if rank else 1, group=g)
    err = (TypeError, "must be a torch.Tensor") if rank else (RuntimeError, REJECTED)
    _expect(*err, rs.unshard, s.tolist() if rank else s, 1, group=g)
    # finding 18: a shard that requires grad, on one rank
    err = (ValueError, "not differentiable") if rank else (RuntimeError, REJECTED)
    _expect(*err, rs.unshard, s.clone().requires_grad_(bool(rank)), 1, group=g)
    # finding 6: 10-D shards that differ beyond the 8th dim
    _expect(ValueError, r"ranks disagree on the shard's shape: .*10 values.*this is rank",
            rs.unshard, torch.zeros((1,) * 9 + (2 + rank,)), 0, group=g)


def _ring_checks(rank, world, g):
    q, k, v = (shard_for(t, 1, rank, world) for t in _qkv())
    x = torch.randn(2, 3 + rank, dtype=torch.float64)
    # finding 6: ring_softmax on 10-D pieces that differ in dim 8 (not the softmax dim)
    _expect(ValueError, r"ring_softmax: ranks disagree on x's shape \(dim excluded\)",
            rs.ring_softmax, torch.randn(*([1] * 8 + [2 + rank, 3])), dim=-1, group=g)
    # finding 8: ranks that disagree on whether a gradient is needed
    needs = r"ranks disagree on whether a gradient is needed .*: rank 0 has True and rank 1 has False"
    _expect(ValueError, needs, rs.ring_attention, q.clone().requires_grad_(rank == 0), k, v, causal=True, group=g)
    _expect(ValueError, needs, rs.ring_softmax, x.clone().requires_grad_(rank == 0), dim=1, group=g)
    with torch.set_grad_enabled(rank == 0):
        _expect(ValueError, needs, rs.ring_softmax, x.clone().requires_grad_(), dim=1, group=g)
    # finding 12: a dim that is not an int, on one rank, then on both
    err = (TypeError, "ring_softmax: dim must be an int, got NoneType") if rank else (RuntimeError, REJECTED)
    _expect(*err, rs.ring_softmax, x, dim=None if rank else 1, group=g)
    _expect(TypeError, "dim must be an int, got str", rs.ring_softmax, x, dim="1", group=g)
    # finding 3: a gradient taken with create_graph=True works; differentiating it again raises
    inp = [t.clone().requires_grad_() for t in (q, k, v)]
    out = rs.ring_attention(*inp, causal=True, group=g)
    gq = torch.autograd.grad((out * out).sum(), inp[0], create_graph=True)[0]
    _expect(RuntimeError, "ring_attention: double backward is not supported",
            torch.autograd.grad, gq.pow(2).sum(), inp[0])
    xs = x.clone().requires_grad_()
    gx = torch.autograd.grad((rs.ring_softmax(xs, dim=1, group=g) ** 2).sum(), xs, create_graph=True)[0]
    _expect(RuntimeError, "ring_softmax: double backward is not supported", torch.autograd.grad, gx.pow(2).sum(), xs)
    # finding 5: causal must be a bool
    _expect(TypeError, "ring_attention: causal must be a bool", rs.ring_attention, q, k, v, causal="False", group=g)


def _empty_and_strided_checks(rank, world, g):
    # finding 9: batch 0 / heads 0 never reach the kernels, forward and backward
    for b, h in ((0, 4), (1, 0)):
        inp = [shard_for(t, 1, rank, world).requires_grad_() for t in _qkv(b=b, h=h)]
        out = rs.ring_attention(*inp, causal=True, group=g)
        assert out.shape == inp[0].shape
        out.sum().backward()
        assert all(t.grad.shape == t.shape and not t.grad.any() for t in inp)

    # finding 9: a step that raises on every rank leaves no transfer dangling
    def fail(src, kv, _):
        raise ArithmeticError("step failed")
    _expect(ArithmeticError, "step failed", ring_loop, g, [torch.zeros(3)], fail)

    # finding 11: non-contiguous (transposed) and expanded (stride-0) k/v, forward and backward
    q, k, v = _qkv(h=4, hkv=2)
    k1, v1 = k[:, :, :1], v[:, :, :1]
    dout = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(1))   # one on every rank
    for name, kf, vf, transform in (
            ("transposed", k, v, lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)),
            ("expanded", k1, v1, lambda t: t.expand(-1, -1, 2, -1))):
        ref = [t.clone().requires_grad_() for t in (q, kf, vf)]
        out_ref, _ = attention64(ref[0], transform(ref[1]), transform(ref[2]), causal=True)
        out_ref.backward(dout)
        mine = [shard_for(t, 1, rank, world).requires_grad_() for t in (q, kf, vf)]
        out = rs.ring_attention(mine[0], transform(mine[1]), transform(mine[2]), causal=True, group=g)
        assert not transform(mine[1]).is_contiguous()
        out.backward(shard_for(dout, 1, rank, world))
        assert_close(f"out {name}", out, shard_for(out_ref, 1, rank, world), 1e-10)
        for t, r, which in zip(mine, ref, "qkv"):
            assert_close(f"d{which} {name}", t.grad, shard_for(r.grad, 1, rank, world), 1e-10)


def _two_rank_checks(rank, world, checks):
    g = dist.new_group(timeout=datetime.timedelta(seconds=5))
    checks(rank, world, g)
    # the group still works: a ring_softmax and a ring_attention after all the errors
    y = rs.ring_softmax(torch.zeros(2, 3 + rank), dim=1, group=g)
    assert torch.allclose(y, torch.full_like(y, 1 / 7))
    q, k, v = (shard_for(t, 1, rank, world) for t in _qkv())
    rs.ring_attention(q, k, v, causal=True, group=g)


@pytest.mark.parametrize("checks", [_unshard_checks, _ring_checks, _empty_and_strided_checks])
def test_two_ranks(checks):
    run_world(2, _two_rank_checks, checks)
