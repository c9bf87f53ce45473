"""The small tensors launchers keep per device (``ringsoftmax.kernels.kept_tensors``)."""
import pytest
import torch

from ringsoftmax.kernels import kept_tensors


@pytest.fixture
def fresh(monkeypatch):
    """An empty store: each test makes its own kept tensors."""
    monkeypatch.setattr(kept_tensors, "_KEPT", {})


def test_one_tensor_per_name_and_device(fresh):
    made = []

    def make(device):
        made.append(device)
        return torch.zeros(3, device=device)

    a = kept_tensors.kept("a", "cpu", make)
    assert kept_tensors.kept("a", torch.device("cpu"), make) is a
    b = kept_tensors.kept("b", "cpu", make)
    assert b is not a and made == [torch.device("cpu")] * 2
    assert kept_tensors.no_int32s("cpu").dtype == torch.int32


@pytest.mark.gpu
def test_made_outside_the_threads_pool_gpu(fresh):
    """Inside ``use_mem_pool`` (what cudagraph trees do while warming up or recording: this thread's allocations
    go to the pool) a kept tensor is made outside the pool, a plain one inside; "cuda" and "cuda:<current>" are
    one key; an error raised by ``make`` reaches the caller."""
    def addresses(pool):
        return [(s["address"], s["address"] + s["total_size"]) for s in pool.snapshot()]

    def inside(t, spans):
        return any(lo <= t.data_ptr() < hi for lo, hi in spans)

    def failing(device):
        raise ValueError("from make")

    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        plain = torch.ones(1 << 20, device="cuda")
        kept = kept_tensors.kept("t", "cuda", lambda d: torch.full((1 << 20,), 2.0, device=d))
        with pytest.raises(ValueError, match="from make"):
            kept_tensors.kept("bad", "cuda", failing)
    spans = addresses(pool)
    assert inside(plain, spans), "the control allocation did not land in the pool: the test checks nothing"
    assert not inside(kept, spans), "the kept tensor was made in the pool"
    assert kept_tensors.kept("t", f"cuda:{torch.cuda.current_device()}", None) is kept
    assert torch.equal(kept, torch.full_like(kept, 2.0))   # (made and filled before any stream used it)
    del plain
