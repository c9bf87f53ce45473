"""Split rows longer than the GPU keeps on chip: the leading columns held, the others read twice.

An exact softmax sees a row's whole statistic before it writes any of the row. The staged kernel
(``softmax_staged``) keeps a row on chip across that wait only up to ``capacity`` chunks (on an
H200, 4.3M float32 elements forward, 2.1M backward); longer rows used to go whole through the
two-pass path, which reads every element twice. Here such rows are split by columns at H, the most
the staged kernel holds (``held_columns``):

1. columns [H, N) are reduced to their statistic (the two-pass path's first pass; backward the
   partial dot);
2. the staged kernel takes columns [0, H): it merges that statistic into each row's own
   (``HAS_PRIOR``), writes those outputs (and lse), and leaves the whole row's statistic behind;
3. columns [H, N) are written from it (the two-pass path's second pass).

HBM traffic, in units of one read of the input: forward 2 + (N - H) / N against the two-pass
path's 3; backward 3 + 2 (N - H) / N against 5. Which rows take it: ``HELD_MIN_SHARE``.

Inputs (M, N) with unit column stride, as for the staged kernel (``softmax_staged.available``);
float32 math; outputs contiguous.
"""
from __future__ import annotations

import torch

from . import softmax_bwd as B
from . import softmax_fwd as F
from . import softmax_staged as S
from .plan_memo import memo

#: Take this path only where the held columns are at least this share of the row, by (direction,
#: element size); None: not at all. H200, M * N = 2^28 (benchmarks/probes/softmax_two_pass.py),
#: medians against the two-pass path, three processes alike (session 17): backward fp32 +8.4
#: points of copy at 4M (71%), +3.6 at 8M, +1.4 at 16M, 32M (share 6.5%) 0.0; bf16 +9.2 at 8M, +3.8
#: at 16M, +1.2 at 32M, 64M -0.1; forward fp32 +5.8 at 8M, +1.7 at 16M, 32M (share 12%) -0.1, bf16
#: +3.9 at 16M, +0.4 at 32M (24%), 64M (12%) -0.9. The slow mode seen in session 16 (whole
#: processes up to 2x slower) was the host: planning the launches took 430-660 us of Python per
#: call, more than the GPU's 0.4 ms, and ``do_bench`` then times the host; plans are memoized now
#: (``plan_memo.memo``: 250-290 us per call, benchmarks/probes/softmax_host.py).
HELD_MIN_SHARE = {("fwd", 4): 0.15, ("fwd", 2): 0.15, ("bwd", 4): 0.1, ("bwd", 2): 0.1}
#: The share of the staged kernel's ``capacity`` the held columns fill, by direction: forward 0.9
#: against a full fill +0.6 points of copy at fp32 8M, 0 to -0.6 at 16M-64M (session 17, H200); the
#: backward lost 1.5-3 points at 0.9 (session 16).
HELD_FILL = {"fwd": 0.9, "bwd": 1.0}
#: Take this path only where it moves at least this many bytes through HBM (``traffic``): it
#: launches five kernels where the two-pass path launches three, ~280 us of the host per call on an
#: H200's machine against ~150 us, and up to twice that in some processes (session 17,
#: benchmarks/probes/softmax_host.py); below ~0.5 ms of GPU work (1.6 GB at the ~3.3 TB/s these
#: kernels reach) the host then sets the pace of back-to-back calls. bf16 16M-element rows forward
#: (16 rows: 1.36 GB) measured 64% of copy with the host hidden and 60% (the two-pass path's
#: figure) in a full bench where it was not. Session 49 (H200, launch cache, passes planned once): there
#: 63.7-64.3% against the two-pass path's 61.9, its GPU time 0.393 ms against 0.42 ms of host per call,
#: too close to the host's swings to take; and a byte threshold that took those 16 rows would take 8 rows
#: of 32M, where the held path ran 46.2-60.8% against 61.4-61.5.
HELD_MIN_BYTES = 1.6e9
#: While the stream captures a CUDA graph the host's cost is paid once, at capture, so
#: ``HELD_MIN_BYTES`` does not apply there; the rows must number at least this many instead. H100,
#: graph replays against the path without held columns (session 47, calls 3 and 5; forward float32 8M-16M
#: and bf16 16M-32M, backward float32 4M-8M and bf16 8M-16M): 1 row 0.86-0.95x, 2 rows 1.01-1.09x, 3 rows
#: 1.04-1.19x, 4 rows 1.05-1.26x, 16 rows 1.09-1.36x. (Eager calls of these sizes ran at the host's pace,
#: which varied call to call on that machine: ``HELD_MIN_BYTES``.)
HELD_MIN_ROWS_CAPTURED = 2


def held_width(direction: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config,
               captured: bool = False) -> int:
    """Where ``held_split`` cuts (M, N) rows a, b (out) under the staged ``config``: the held columns,
    a multiple of its chunk, or 0 where the path does not apply (whole rows fit, or the held share
    is under ``HELD_MIN_SHARE``, or that is None, or the call moves under ``HELD_MIN_BYTES``; where
    ``captured``, into a CUDA graph, fewer than ``HELD_MIN_ROWS_CAPTURED`` rows instead)."""
    (m, n), chunk = a.shape, config[0]
    share = HELD_MIN_SHARE[direction, F.element_size(a, b)]
    if share is None:
        return 0
    fits = S.held_columns(direction, a, b, out, config)
    held = int(HELD_FILL[direction] * fits / chunk) * chunk
    big = m >= HELD_MIN_ROWS_CAPTURED if captured else traffic(direction, a, b, out, held) >= HELD_MIN_BYTES
    return held if fits < n and share * n <= held and big else 0


def traffic(direction: str, a, b, out, held: int) -> int:
    """Bytes the held path moves through HBM on (M, N) rows a, b (out) with ``held`` columns held:
    every input read once and the output written once, the streamed columns' inputs read again."""
    m, n = a.shape
    inputs = a.element_size() if direction == "fwd" else a.element_size() + b.element_size()
    return m * (n * (inputs + out.element_size()) + (n - held) * inputs)


def _plan(direction: str, a, b, out, captured: bool) -> tuple:
    """(config, held columns, launches) of ``held_split`` on these rows: the table's config for the whole
    rows (its deepest ring, or its spill fallback: ``softmax_staged.held_config``), ``held_width`` under it,
    and where that is not 0 the plans of the three launches (``_launches``)."""
    config = S.held_config(direction, a, b, out)
    held = held_width(direction, a, b, out, config, captured)
    return config, held, _launches(direction, a, b, out, config, held) if held else None


def _launches(direction: str, a, b, out, config, held: int) -> tuple:
    """The plans of the first pass on the streamed columns, the staged launch on the held ones and the
    second pass, made on tensors laid out as ``held_split`` makes them (so the plans hold for its calls)."""
    m = a.shape[0]
    streamed = [t[:, held:] for t in (a, b, out)]
    stats = torch.empty((5, m), dtype=torch.float32, device=a.device)
    lse = torch.empty(m, dtype=torch.float32, device=a.device) if direction == "fwd" else None
    staged = S._launch_plan(direction, a[:, :held], b[:, :held], out[:, :held], lse, config, stats[1:])
    if staged is None:
        raise RuntimeError(f"softmax_held: the staged kernel refused the {held} of {a.shape[1]} columns that "
                           f"held_width gave it (M = {m}); please report this")
    if direction == "fwd":
        return F.stats_plan(streamed[0]), staged, F.normalize_plan(streamed[0], streamed[2])
    return B.dot_plan(*streamed[:2]), staged, B.elementwise_plan(*streamed)


def held_split(direction: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, lse=None) -> bool:
    """Rows longer than the staged kernel holds, by held and streamed columns; False where the
    staged kernel cannot run (device, alignment), holds whole rows or too small a share of them (the
    caller takes another path).

    Forward ``("fwd", x, x, y, lse)``: y (M, N) in x.dtype, lse (M,) float32 (None: not kept).
    Backward ``("bwd", y, dy, dx)``: dx (M, N) in dy.dtype.
    """
    m = a.shape[0]
    if HELD_MIN_SHARE[direction, F.element_size(a, b)] is None or not S.available(a, b, out):
        return False  # (checked first: the forward's long rows come here on every call)
    captured = a.is_cuda and torch.cuda.is_current_stream_capturing()  # (its host cost paid once)
    _, held, launches = memo(
        "held", (a, b, out), (direction, tuple(HELD_MIN_SHARE.items()), tuple(HELD_FILL.items()), HELD_MIN_BYTES,
                              HELD_MIN_ROWS_CAPTURED, captured),
        lambda: _plan(direction, a, b, out, captured), S.plan_knobs())
    if not held:
        return False
    first, staged, second = launches
    streamed = (t[:, held:] for t in (a, b, out))
    stats = torch.empty((5, m), dtype=torch.float32, device=a.device)
    if direction == "fwd":
        x_s, _, y_s = streamed
        F._two_pass_stats(x_s, out=stats[:3], plan=first)  # (lse, max, sum) of the streamed columns
        lse = stats[0] if lse is None else lse   # (the streamed columns' lse is not needed after)
    else:
        y_s, dy_s, dx_s = streamed
        B._two_pass_dot(y_s, dy_s, out=stats[1], plan=first)  # their dot
    prior = stats[1:]
    S.launch_planned(staged, a[:, :held], b[:, :held], out[:, :held], lse, prior)
    if direction == "fwd":
        F._normalize_into(x_s, y_s, prior[2], prior[3], plan=second)
    else:
        B._elementwise(y_s, dy_s, dx_s, prior[2], plan=second)
    return True
