"""Launch plans kept per tensor layout, so that a repeated call does not plan its kernels again.

Planning a launch is Python: which path takes the rows (``rows_fit``, ``staged_fits``), tiles, warps,
specializations, grids. On an H200's machine that took ~70 us for a staged launch (session 17), and a
small call's route and rows-kernel tiles 17 us of ``softmax_fwd``'s 49 (session 50,
``benchmarks/probes/host_ab.py``: (64, 1024) bf16 49.2 -> 32.1 us), longer than the GPU takes over such a
call. A plan depends only on the tensors' layouts and the module knobs (tables and switches the tests and
probes patch), so ``memo`` keeps it by layout and checks the knobs on every hit.
"""
from __future__ import annotations

import copy

#: Most plans ``memo`` keeps (each a few hundred bytes) before it starts again.
MEMO_SIZE = 4096
#: Most knob snapshots ``memo`` keeps for plans to share.
SNAPSHOTS_SIZE = 64

_PLANS: dict = {}
_SNAPSHOTS: list = []  # deep copies of the knobs plans were built under, shared by the plans built under equal knobs


def layout_key(tensors) -> tuple:
    """What a plan may depend on in each of ``tensors``: shape, strides, dtype, device and the data
    pointer's offset within 16 bytes (Triton specializes on 16-byte alignment; the kernels shift
    their tiles by it)."""
    return tuple((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16) for t in tensors)


def memo(name: str, tensors, extra, build, knobs: tuple):
    """``build()``, memoized by ``name``, ``extra`` (hashable) and ``layout_key(tensors)``, built again
    where ``knobs`` (the current values of every knob the build reads, as a tuple of references) differ
    from those it was built under. Cleared when it holds ``MEMO_SIZE`` plans.

    The knobs are not part of the key: a plan keeps a deep copy of the knobs it was built under, and a
    hit compares them with the current ones, so a change, in place too, builds it again. (A hit costs
    3.1 us on the CI machine with the staged plans' 31 knobs; hashing them into the key cost 10.9.)
    Plans built under equal knobs share one copy (``snapshot``): copying takes 22-400 us there, more than
    most builds, and calls whose shapes keep changing build a plan each time.
    ``tests/test_plan_memo.py`` checks that each caller's knobs cover every module-level name its build
    reads."""
    key = (name, extra) + layout_key(tensors)
    entry = _PLANS.get(key)
    if entry is None or entry[0] != knobs:
        if len(_PLANS) >= MEMO_SIZE:
            _PLANS.clear()
        entry = _PLANS[key] = (snapshot(knobs), build())
    return entry[1]


def snapshot(knobs: tuple) -> tuple:
    """A deep copy of ``knobs``: a kept one that equals them, else a new one (kept; the kept copies are
    dropped when they number ``SNAPSHOTS_SIZE``)."""
    for kept in _SNAPSHOTS:
        if kept == knobs:
            return kept
    if len(_SNAPSHOTS) >= SNAPSHOTS_SIZE:
        _SNAPSHOTS.clear()
    _SNAPSHOTS.append(copy.deepcopy(knobs))
    return _SNAPSHOTS[-1]
