"""Which implementation runs a block: the Triton kernels or the plain-torch reference.

- CUDA tensors run the Triton kernels (``ringsoftmax/kernels``); CPU tensors run ``reference.py``.
- float64 runs ``reference.py`` on every device: the kernels compute in float32.
- ``RINGSOFTMAX_BACKEND=torch`` forces the reference; ``RINGSOFTMAX_BACKEND=triton`` forces the
  kernels, which on CPU tensors needs ``TRITON_INTERPRET=1`` set before triton is imported.
- The kernels run with their first tensor's CUDA device current (``on_tensor_device``): Triton
  launches on the current device and its current stream, whatever device the pointers are on.

Both modules expose the same functions (softmax_fwd, row_stats, normalize, row_dot, softmax_bwd,
attention_fwd, attention_delta, attention_bwd) with the same contracts.
"""
from __future__ import annotations

import functools
import os
import types

import torch

from . import reference

ENV = "RINGSOFTMAX_BACKEND"


def use_triton(t: torch.Tensor) -> bool:
    """True when a block on tensor ``t`` runs on the Triton kernels."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced not in ("", "torch", "triton"):
        raise ValueError(f"{ENV}={forced!r} is not a backend: use 'torch' or 'triton', or leave it unset")
    if forced == "torch" or t.dtype == torch.float64:
        return False
    if forced == "triton":
        if not t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                f"{ENV}=triton with CPU tensors runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1 "
                "in the environment before Python starts, or move the tensors to a CUDA device")
        return True
    return t.is_cuda


def softmax_ops(t: torch.Tensor):
    """The module whose row softmax functions run for tensor ``t``."""
    return _kernel_softmax_ops() if use_triton(t) else reference


def attention_ops(t: torch.Tensor):
    """The module whose attention block functions run for tensor ``t``."""
    return _kernel_attention_ops() if use_triton(t) else reference


def on_tensor_device(fn):
    """``fn(t, *args, **kwargs)`` run with CUDA tensor ``t``'s device current where it is not already.

    Triton launches a kernel on the current device, on that device's current stream, whatever device
    its pointers are on: a tensor on cuda:1 while cuda:0 is current (a model placed by
    ``device_map="auto"``, a second model on another GPU) either fails in Triton's launcher ("cannot be
    accessed from Triton") or, with peer access on, runs on cuda:0 unordered with cuda:1's stream.
    With ``t``'s device current the launch, its stream and every per-device cache (kept tensors,
    multiprocessor counts, launch plans) are ``t``'s, as a torch op's would be. (Cost: one device
    lookup per call, ~1.3 us on an H100's host. The public functions check that all their tensors share
    ``t``'s device.)
    """
    @functools.wraps(fn)
    def run(t, *args, **kwargs):
        if t.is_cuda and t.device.index != torch.cuda.current_device():
            with torch.cuda.device(t.device):
                return fn(t, *args, **kwargs)
        return fn(t, *args, **kwargs)
    return run


@functools.lru_cache(maxsize=None)
def _kernel_softmax_ops():
    """The kernels' row softmax functions (built once: every call of the library asks for them)."""
    from .kernels import softmax_bwd, softmax_fwd
    return types.SimpleNamespace(softmax_fwd=on_tensor_device(softmax_fwd.softmax_fwd),
                                 row_stats=on_tensor_device(softmax_fwd.row_stats),
                                 normalize=on_tensor_device(softmax_fwd.normalize),
                                 row_dot=on_tensor_device(softmax_bwd.row_dot),
                                 softmax_bwd=on_tensor_device(softmax_bwd.softmax_bwd))


@functools.lru_cache(maxsize=None)
def _kernel_attention_ops():
    """The kernels' attention block functions (built once)."""
    from .kernels import attention_bwd, attention_fwd
    return types.SimpleNamespace(attention_fwd=on_tensor_device(attention_fwd.attention_fwd),
                                 attention_delta=on_tensor_device(attention_bwd.attention_delta),
                                 attention_bwd=on_tensor_device(attention_bwd.attention_bwd))


@functools.lru_cache(maxsize=None)
def kernel_merge_():
    """The fused in-place merge kernel's launcher ``merge_(acc_out, acc_lse, out_b, lse_b)`` (built once)."""
    from .kernels.merge import merge_
    return on_tensor_device(merge_)
