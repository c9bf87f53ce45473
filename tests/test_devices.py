"""Where the kernels run: on the tensors' CUDA device, current or not, and on its current stream.

Triton launches on the current device and its current stream. On the CPU the device switch is checked with
stand-ins for torch.cuda's device functions; with two GPUs, the public calls run on cuda:1 while cuda:0 is
current, their inputs written on cuda:1's stream just before (a launch on cuda:0's stream would not wait).
On one GPU, calls made under a side stream run on it, after the work queued there.
"""
import contextlib
import types

import pytest
import torch

import ringsoftmax as rs
from ringsoftmax import backend, ring
from ringsoftmax.merge import merge, merge_

from helpers import assert_close, attention64, check_softmax_grad, gpu_sleep, softmax64

ON_CUDA1 = types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 1))  # what the guard reads of a tensor


@pytest.fixture
def fake_devices(monkeypatch):
    """torch.cuda.current_device / torch.cuda.device replaced by a counter of the current device (0 at first);
    yields the list of devices made current, in order."""
    state = {"current": 0, "entered": []}

    @contextlib.contextmanager
    def device(d):
        before = state["current"]
        state["current"] = torch.device(d).index
        state["entered"].append(state["current"])
        try:
            yield
        finally:
            state["current"] = before

    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["current"])
    monkeypatch.setattr(torch.cuda, "device", device)
    yield state


def test_on_tensor_device_switches_only_when_needed(fake_devices):
    seen = []
    run = backend.on_tensor_device(lambda t, *a, **k: seen.append((torch.cuda.current_device(), a, k)) or "out")
    assert run(ON_CUDA1, 2, key=3) == "out"
    assert seen[-1] == (1, (2,), {"key": 3}) and torch.cuda.current_device() == 0
    assert run(types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))) == "out"
    assert run(torch.zeros(1)) == "out"                              # a CPU tensor: no CUDA call at all
    assert [s[0] for s in seen] == [1, 0, 0] and fake_devices["entered"] == [1]


def test_every_kernel_entry_runs_on_the_tensors_device(fake_devices, monkeypatch):
    """Each function of the kernels' namespaces, and the fused merge, sees its first tensor's device current."""
    from ringsoftmax.kernels import attention_bwd, attention_fwd, softmax_bwd, softmax_fwd
    from ringsoftmax.kernels import merge as kmerge
    entries = [(softmax_fwd, "softmax_fwd"), (softmax_fwd, "row_stats"), (softmax_fwd, "normalize"),
               (softmax_bwd, "row_dot"), (softmax_bwd, "softmax_bwd"), (attention_fwd, "attention_fwd"),
               (attention_bwd, "attention_delta"), (attention_bwd, "attention_bwd"), (kmerge, "merge_")]
    seen = {}
    for module, name in entries:
        monkeypatch.setattr(module, name, lambda t, *a, _n=name, **k: seen.setdefault(_n, torch.cuda.current_device()))
    caches = (backend._kernel_softmax_ops, backend._kernel_attention_ops, backend.kernel_merge_)
    for cache in caches:
        cache.cache_clear()  # (built again around the stand-ins, and again after the test)
    try:
        softmax_ops, attention_ops = backend._kernel_softmax_ops(), backend._kernel_attention_ops()
        for _, name in entries[:5]:
            getattr(softmax_ops, name)(ON_CUDA1, None)
        for _, name in entries[5:8]:
            getattr(attention_ops, name)(ON_CUDA1, None)
        backend.kernel_merge_()(ON_CUDA1, None, None, None)
    finally:
        for cache in caches:
            cache.cache_clear()
    assert seen == {name: 1 for _, name in entries}
    assert torch.cuda.current_device() == 0


def test_ring_with_nccl_names_a_device_that_is_not_current(fake_devices, monkeypatch):
    monkeypatch.setattr(ring.dist, "get_backend", lambda pg: "nccl")
    problem = ring.device_error(None, ON_CUDA1)
    assert "cuda:1" in problem and "current CUDA device is cuda:0" in problem and "set_device(1)" in problem
    fake_devices["current"] = 1
    assert ring.device_error(None, ON_CUDA1) is None


def _late_on(device, src):
    """A tensor on ``device`` equal to ``src`` only once ``device``'s current stream has run a ~50 ms sleep."""
    x = torch.full_like(src, 7.0)
    with torch.cuda.device(device):
        gpu_sleep(50e-3, device)
        x.copy_(src)
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(37, 1000), (4, 1 << 20), (16, 1 << 22)])
def test_softmax_on_a_side_stream(m, n):
    """Under ``torch.cuda.stream(side)`` every launch of a call (several for long rows) runs on ``side``."""
    src = torch.randn(m, n, device="cuda") * 30
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x = _late_on(src.device, src).requires_grad_()
        y, lse = rs.softmax_with_lse(x)
        dy = _late_on(src.device, torch.randn_like(src))
        y.backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    want_y, want_lse = softmax64(src, -1)
    assert_close("y", y, want_y, 1e-6)
    assert_close("lse", lse, want_lse, 1e-6)
    check_softmax_grad(y.detach(), dy, x.grad, 1e-5)


needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n", [(37, 1000), (4, 1 << 20), (2, 1 << 24)])
def test_softmax_on_a_device_that_is_not_current(m, n, dtype):
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 1)
    src = (torch.randn(m, n, device=dev) * 100).to(dtype)
    src[0, : n // 2] = float("-inf")
    x = _late_on(dev, src).requires_grad_()
    y, lse = rs.softmax_with_lse(x)
    want_y, want_lse = softmax64(src, -1)
    assert y.device == dev and torch.cuda.current_device() == 0
    assert_close("y", y, want_y, 1e-6 if dtype == torch.float32 else 1e-2)
    assert_close("lse", lse, want_lse, 1e-6)
    dy = _late_on(dev, torch.randn(m, n, device=dev).to(dtype))
    y.backward(dy)
    # against the gradient of the y the backward read (bf16 y's rounding moves dx's cancelling terms)
    check_softmax_grad(y.detach(), dy, x.grad, 1e-5 if dtype == torch.float32 else 8e-3)


@pytest.mark.gpu
@needs_two_gpus
@pytest.mark.parametrize("causal", [False, True])
def test_attention_and_merge_on_a_device_that_is_not_current(causal):
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 1)
    q, k, v = (_late_on(dev, torch.randn(2, 300, 4, 64, device=dev, dtype=torch.bfloat16)).requires_grad_()
               for _ in range(3))
    out, lse = rs.attention(q, k, v, causal=causal)
    want_out, want_lse = attention64(q, k, v, causal=causal)
    assert out.device == dev and torch.cuda.current_device() == 0
    assert_close("out", out, want_out, 1e-2)
    assert_close("lse", lse, want_lse, 1e-5)
    out.float().square().sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    attention64(q64, k64, v64, causal=causal)[0].square().sum().backward()
    for name, got, want in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert_close(name, got, want, 2e-2)
    acc_out, acc_lse = torch.randn(2, 300, 4, 64, device=dev), torch.randn(2, 4, 300, device=dev)
    out_b, lse_b = _late_on(dev, torch.randn(2, 300, 4, 64, device=dev)), _late_on(dev, torch.randn(2, 4, 300, device=dev))
    want = merge(acc_out.double(), acc_lse.double(), out_b.double(), lse_b.double())
    merge_(acc_out, acc_lse, out_b, lse_b)
    assert_close("merged out", acc_out, want[0], 1e-6)
    assert_close("merged lse", acc_lse, want[1], 1e-6)
