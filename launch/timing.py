"""Timing shared by the benchmarks in this folder: medians of interleaved rounds."""
from __future__ import annotations

import statistics


def interleaved_medians(calls: dict, rounds: int, bench) -> dict:
    """key -> median of ``bench(callable)`` over ``rounds`` rounds, each timing every callable once, in
    turn, so that a slow drift of the GPU's clock touches all contestants alike. A string in place of
    a callable (a missing or failing peer) passes through."""
    times = {k: [] for k, f in calls.items() if not isinstance(f, str)}
    for _ in range(rounds):
        for k in times:
            times[k].append(bench(calls[k]))
    return {k: (statistics.median(times[k]) if k in times else f) for k, f in calls.items()}
