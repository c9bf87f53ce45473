"""Integer helpers for the launchers' host code (grids, tile sizes).

``triton.cdiv`` and ``triton.next_power_of_2`` are ``ConstexprFunction`` objects in triton 3.6 and
3.9 (callable inside kernels too): on the host each call goes through their constexpr unwrapping,
2.7 and 4.2 us per call on a CI machine against 0.01-0.04 us for the functions below, and a small
softmax launch made five such calls. Kernels keep using ``tl.cdiv``; host code uses these.
"""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers, b > 0."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()
