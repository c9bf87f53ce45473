"""The ring on 2, 3 and 4 gloo processes against the unsharded float64 computation.

Each test spawns one process group and runs many cases in it (spawning is the slow part). Every
rank draws the same full tensors from one seed, takes its shard, runs the ring, and compares its
shard of the output and of the gradients with the same shard of the unsharded reference.
"""
import itertools
import zlib

import pytest
import torch
import torch.distributed as dist

import ringsoftmax as rs
from ringsoftmax.layouts import LAYOUTS, shard_for

from dist_utils import run_world
from helpers import assert_close, attention64, softmax64


def _device(rank):
    return torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")


def _ring_attention_case(rank, world, layout, causal, heads, kv_heads, shard_len, dtype, tol, scale=None, d=8):
    torch.manual_seed(zlib.crc32(repr((layout, causal, heads, kv_heads, shard_len, dtype)).encode()))
    b, n, dev = 2, shard_len * world, _device(rank)
    q = torch.randn(b, n, heads, d, dtype=torch.float64) * 2
    k = torch.randn(b, n, kv_heads, d, dtype=torch.float64) * 2
    v = torch.randn(b, n, kv_heads, d, dtype=torch.float64)
    g = torch.randn(b, n, heads, d, dtype=torch.float64)
    q, k, v, g = (t.to(dtype).double() for t in (q, k, v, g))    # the reference sees the rounded inputs
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    out_ref, _ = attention64(*ref, causal=causal, scale=scale)
    out_ref.backward(g)

    local = [shard_for(t, 1, rank, world, layout).to(dev, dtype).requires_grad_() for t in (q, k, v)]
    out = rs.ring_attention(*local, causal=causal, softmax_scale=scale, layout=layout)
    out.backward(shard_for(g, 1, rank, world, layout).to(dev, dtype))
    what = f"world={world} layout={layout} causal={causal} heads={heads}/{kv_heads} n={n} {dtype}"
    assert out.dtype == dtype
    assert_close(f"out {what}", out, shard_for(out_ref, 1, rank, world, layout), tol)
    for name, t, r in zip("qkv", local, ref):
        assert_close(f"d{name} {what}", t.grad, shard_for(r.grad, 1, rank, world, layout), tol)


def _ring_attention_cases(rank, world):
    for layout in LAYOUTS:
        shard_len = 6 if layout == "zigzag" else 5        # global lengths 5W / 6W: odd, not powers of two
        for causal in (False, True):
            for heads, kv_heads in ((4, 2), (3, 3), (4, 1)):
                _ring_attention_case(rank, world, layout, causal, heads, kv_heads, shard_len, torch.float64, 1e-10)
        _ring_attention_case(rank, world, layout, True, 4, 2, 8, torch.float32, 1e-5, scale=0.3)


def _ring_softmax_cases(rank, world, dtypes=((torch.float64, 1e-10), (torch.float32, 1e-5)), lengths=(3, 0, 8, 1)):
    lengths = list(lengths)[:world]                     # unequal pieces, one rank may be empty
    n = sum(lengths)
    start = sum(lengths[:rank])
    # magnitudes 1e4 check the forward; 3 checks the gradient too (at 1e4 y is one-hot and dx ~ 0,
    # so any rounding reads as a relative error of 1)
    for (dim, shape), (scale, check_grad) in itertools.product(((1, (2, n, 3)), (-1, (4, n))),
                                                               ((1e4, False), (3.0, True))):
        torch.manual_seed(7 + dim)
        x = torch.randn(shape, dtype=torch.float64) * scale
        x.movedim(dim, -1)[0, ..., : n // 2] = float("-inf")                           # some -inf entries
        x.movedim(dim, -1)[-1] = float("-inf")                                          # rows all -inf
        g = torch.randn(shape, dtype=torch.float64)
        for dtype, tol in dtypes:
            x, g = x.to(dtype).double(), g.to(dtype).double()       # the reference sees the rounded inputs
            xr = x.clone().requires_grad_()
            y_ref, _ = softmax64(xr, dim)
            y_ref.backward(g)
            piece = x.narrow(dim, start, lengths[rank]).to(_device(rank), dtype).requires_grad_()
            y = rs.ring_softmax(piece, dim=dim)
            y.backward(g.narrow(dim, start, lengths[rank]).to(_device(rank), dtype))
            what = f"world={world} dim={dim} {dtype} piece={lengths[rank]} scale={scale}"
            assert y.dtype == dtype and y.shape == piece.shape
            assert_close(f"y {what}", y, y_ref.narrow(dim, start, lengths[rank]), tol)
            if check_grad:
                assert_close(f"dx {what}", piece.grad, xr.grad.narrow(dim, start, lengths[rank]), tol)


def _shard_roundtrip(rank, world):
    x = torch.arange(2 * 4 * world * 3, dtype=torch.float32).reshape(2, 4 * world, 3)
    for layout in LAYOUTS:
        mine = rs.shard(x, 1, layout=layout)
        assert torch.equal(mine, shard_for(x, 1, rank, world, layout))
        assert torch.equal(rs.unshard(mine, 1, layout=layout), x)


def _all_cases(rank, world):
    _shard_roundtrip(rank, world)
    _ring_softmax_cases(rank, world)
    _ring_attention_cases(rank, world)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_against_unsharded(world):
    run_world(world, _all_cases)


def _gpu_cases(rank, world):
    _ring_softmax_cases(rank, world, dtypes=((torch.float32, 1e-5), (torch.bfloat16, 1e-2)),
                        lengths=(3000, 0, 70001, 65552))
    for layout in LAYOUTS:
        for causal in (False, True):
            for heads, kv_heads in ((8, 2), (4, 4)):
                _ring_attention_case(rank, world, layout, causal, heads, kv_heads, 130, torch.bfloat16, 2e-2, d=64)
        _ring_attention_case(rank, world, layout, True, 4, 1, 66, torch.float32, 1e-5, d=128)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_ring_with_nccl(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    run_world(world, _gpu_cases, backend="nccl")
