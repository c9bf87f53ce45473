"""Which implementation runs a block: the Triton kernels or the plain-torch reference.

- CUDA tensors run the Triton kernels (``ringsoftmax/kernels``); CPU tensors run ``reference.py``.
- float64 runs ``reference.py`` on every device: the kernels compute in float32.
- ``RINGSOFTMAX_BACKEND=torch`` forces the reference; ``RINGSOFTMAX_BACKEND=triton`` forces the
  kernels, which on CPU tensors needs ``TRITON_INTERPRET=1`` set before triton is imported.

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


@functools.lru_cache(maxsize=None)
def _kernel_softmax_ops():
    """The kernels' row softmax functions (built once: every call of the library asks for them)."""
    from .kernels import softmax_bwd, softmax_fwd
    return types.SimpleNamespace(softmax_fwd=softmax_fwd.softmax_fwd, row_stats=softmax_fwd.row_stats,
                                 normalize=softmax_fwd.normalize, row_dot=softmax_bwd.row_dot,
                                 softmax_bwd=softmax_bwd.softmax_bwd)


@functools.lru_cache(maxsize=None)
def _kernel_attention_ops():
    """The kernels' attention block functions (built once)."""
    from .kernels import attention_bwd, attention_fwd
    return types.SimpleNamespace(attention_fwd=attention_fwd.attention_fwd,
                                 attention_delta=attention_bwd.attention_delta,
                                 attention_bwd=attention_bwd.attention_bwd)
