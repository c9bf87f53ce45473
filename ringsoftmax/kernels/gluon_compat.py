"""Gluon (``triton.experimental.gluon``) across the triton releases we run on: one import, one set of names.

Gluon ships with triton >= 3.5; without it ``gluon`` is None and the callers take their Triton paths.
Builtins renamed between releases, bound here to one name each:

- ``tma_load`` / ``tma_store``: ``tma.async_copy_global_to_shared`` / ``async_copy_shared_to_global``
  in triton 3.6, ``tma.async_load`` / ``async_store`` from 3.7 on;
- ``cp_async``: ``async_copy.async_copy_global_to_shared`` in 3.6, ``async_copy.async_load`` from 3.7;
- ``cta_barrier``: ``gl.thread_barrier`` in 3.6, ``gl.barrier`` from 3.7;
- a shared-memory view of another dtype or shape: ``desc._reinterpret(dtype, shape, layout)`` in 3.6,
  ``desc.reinterpret(...)`` from 3.7. A method cannot be bound to a module name, so on releases
  without ``reinterpret`` this module adds that name to the descriptor class, as the same builtin
  (nothing else about the class changes); kernels call ``desc.reinterpret``.
"""
from __future__ import annotations

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # pragma: no cover - triton < 3.5
    gluon = gl = async_copy = fence_async_shared = mbarrier = tma = None
    warpgroup_mma = warpgroup_mma_wait = TensorDescriptor = None

if gluon is not None:
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    if not hasattr(gl.shared_memory_descriptor, "reinterpret"):
        gl.shared_memory_descriptor.reinterpret = gl.shared_memory_descriptor._reinterpret
