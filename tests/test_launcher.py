"""Cached kernel launches (``ringsoftmax.kernels.launcher``): the key's classes of arguments against
Triton's own specialization, the interpreter's path, and on a GPU launches checked against Triton's
lookup (``VERIFY``, which conftest.py sets for every test)."""
import itertools
import random

import pytest
import torch

from ringsoftmax.kernels import launcher


def _triton_specialization(arg):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    return native_specialize_impl(BaseBackend, arg, False, True, True)


def _pool_of_arguments():
    """Runtime arguments around every boundary Triton specializes on: ints near 1, multiples of 16 and
    the int32 / int64 / uint64 limits; tensors of three dtypes at every offset of 0-16 bytes; bools,
    floats, None."""
    rng = random.Random()
    ints = {0, 1, 2, 15, 16, 17, 32, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, -2**31, -2**31 - 1,
            2**63 - 16, 2**63, 2**64 - 16, 2**64 - 1} | {rng.randrange(-2**40, 2**40) for _ in range(40)}
    base = torch.empty(64, dtype=torch.uint8)
    tensors = [base[off:off + 32].view(dtype) for dtype in (torch.float32, torch.bfloat16, torch.int32)
               for off in range(0, 17, dtype.itemsize)]
    return sorted(ints) + tensors + [True, False, 0.5, -2.0, None]


def test_equal_classes_mean_equal_triton_specializations():
    """``arg_class`` splits the arguments at least as finely as Triton: any two arguments of one class
    get one specialization (so a cached compiled kernel is the one Triton would pick), and the pool
    really reaches several of Triton's classes (else the check proves nothing)."""
    pool = _pool_of_arguments()
    specs = [_triton_specialization(a) for a in pool]
    classes = [launcher.arg_class(a) for a in pool]
    assert len(set(specs)) >= 10
    for (ca, sa), (cb, sb) in itertools.combinations(zip(classes, specs), 2):
        if ca == cb:
            assert sa == sb, (ca, sa, sb)


def test_tma_descriptors_classed_by_all_but_the_pointer():
    gluon = pytest.importorskip("triton.experimental.gluon")
    hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    layout = gluon.language.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)
    storage = torch.empty(4 * 1024 + 64, dtype=torch.bfloat16)

    def descriptor(offset, block=(1, 2, 256)):
        view = storage[offset:offset + 4 * 1024].view(4, 4, 256)
        return hopper.TensorDescriptor(view, [4, 4, 256], [1024, 256, 1], list(block), layout)

    a, b, c = descriptor(0), descriptor(8), descriptor(0, (1, 4, 256))
    assert launcher.arg_class(a) == launcher.arg_class(b)
    assert _triton_specialization(a) == _triton_specialization(b)
    assert launcher.arg_class(a) != launcher.arg_class(c)


def test_unknown_arguments_are_refused():
    with pytest.raises(launcher._Unknown):
        launcher.arg_class("a string")
    with pytest.raises(launcher._Unknown):
        launcher.arg_class([1, 2])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs where there is no GPU")
def test_interpreted_kernels_go_through_triton(monkeypatch):
    """Under the interpreter nothing is cached and the launch still computes."""
    import ringsoftmax as rs
    from ringsoftmax.kernels import softmax_fwd
    monkeypatch.setenv("RINGSOFTMAX_BACKEND", "triton")
    monkeypatch.setattr(launcher, "_CACHE", {})
    assert launcher._layout(softmax_fwd._softmax_rows_kernel) is None
    x = torch.randn(3, 50, dtype=torch.float64).float()
    torch.testing.assert_close(rs.softmax(x, -1).double(), torch.softmax(x.double(), -1), atol=1e-6, rtol=1e-6)
    assert launcher._CACHE == {}


@pytest.mark.gpu
def test_cached_launches_follow_alignment_gpu():
    """Rows of one shape, 16-byte aligned, then one element off (the kernel Triton builds differs), then
    aligned again: each launch computes the right values, the second aligned call is a cached launch
    that ``VERIFY`` checked against Triton's lookup, and the two alignments have their own entries."""
    import ringsoftmax as rs
    from ringsoftmax.kernels import softmax_fwd
    assert launcher.VERIFY, "conftest.py sets VERIFY for the tests"
    storage = torch.randn(8 * 1000 + 1, device="cuda")
    aligned, shifted = storage[:8000].view(8, 1000), storage[1:].view(8, 1000)
    hits = launcher.HITS
    for x in (aligned, shifted, aligned, shifted):
        torch.testing.assert_close(rs.softmax(x, -1).double(), torch.softmax(x.double(), -1), atol=1e-6, rtol=1e-5)
    assert launcher.HITS >= hits + 2
    rows = [key for key in launcher._CACHE if key[0] == id(softmax_fwd._softmax_rows_kernel)]
    assert {key[3][0][1] for key in rows} >= {True, False}   # x's class: (dtype, aligned)


@pytest.mark.gpu
def test_a_wrong_cached_kernel_is_caught_gpu(monkeypatch):
    """``VERIFY`` notices a cached entry that is not Triton's pick (here: the float32 and bfloat16 rows
    launches' entries swapped)."""
    import ringsoftmax as rs
    monkeypatch.setattr(launcher, "_CACHE", {})
    x = torch.randn(4, 3000, device="cuda")
    rs.softmax(x, -1)
    rs.softmax(x.to(torch.bfloat16), -1)
    (k32, (c32, t32)), (k16, (c16, t16)) = launcher._CACHE.items()
    assert c32 is not c16
    launcher._CACHE.update({k32: (c16, t32), k16: (c32, t16)})
    with pytest.raises(AssertionError, match="not the one Triton picks"):
        rs.softmax(x, -1)


@pytest.mark.gpu
def test_launch_hooks_see_every_launch_gpu(monkeypatch):
    """With a launch hook set (as profilers do) every launch goes through Triton, which calls it."""
    from triton import knobs
    import ringsoftmax as rs
    x = torch.randn(4, 3000, device="cuda")
    rs.softmax(x, -1)                       # (a cached entry exists)
    seen = []
    hook = knobs.runtime.launch_enter_hook
    hook.add(seen.append)
    try:
        hits = launcher.HITS
        rs.softmax(x, -1)
        rs.softmax(x, -1)
    finally:
        hook.remove(seen.append)
    assert len(seen) == 2 and launcher.HITS == hits
