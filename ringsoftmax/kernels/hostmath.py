"""Plain-Python helpers for the launchers' host code (grids, tile sizes, the attention scale),
importable without triton (the layers above use ``check_scale`` on the CPU path too).

``triton.cdiv`` and ``triton.next_power_of_2`` are ``ConstexprFunction`` objects in triton 3.6 and
3.9 (callable inside kernels too): on the host each call goes through their constexpr unwrapping,
2.7 and 4.2 us per call on a CI machine against 0.01-0.04 us for the functions below, and a small
softmax launch made five such calls. Kernels keep using ``tl.cdiv``; host code uses these.
"""
from __future__ import annotations

import math

LOG2E = 1.4426950408889634
#: The largest softmax_scale whose scale * LOG2E is a finite float32 (the kernels scale scores by it).
MAX_SCALE = 3.4028234663852886e38 / LOG2E


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers, b > 0."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def prev_power_of_2(n: int) -> int:
    """The largest power of two <= n (1 for n <= 1)."""
    return 1 << max(n.bit_length() - 1, 0)


def check_scale(softmax_scale) -> float:
    """``softmax_scale`` as a float; raises ValueError unless positive, finite, and at most
    ``MAX_SCALE``, so that ``scale * LOG2E`` is a finite float32 (the kernels take each row's maximum
    score before scaling it)."""
    scale = float(softmax_scale)
    if not (math.isfinite(scale) and 0 < scale <= MAX_SCALE):
        raise ValueError(f"softmax_scale must be a positive finite number at most {MAX_SCALE:.4g} (scale * log2(e) "
                         f"must be a finite float32), got {softmax_scale!r}")
    return scale
