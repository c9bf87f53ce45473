"""Launch configurations for the attention kernels: a small per-device table.

A configuration is a `Tile`: how many query rows (``block_m``) and key rows (``block_n``) one step
of a kernel handles, with Triton's ``num_warps`` and ``num_stages``. The table is keyed on what
stays the same from one ring step to the next (GPU generation, padded head dim, dtype, causal),
never on sequence lengths, so a ring of many steps compiles each kernel once.

Three kernels read the table:

- ``fwd``:  one program per ``block_m`` query rows, looping over keys ``block_n`` at a time;
- ``dkdv``: one program per ``block_n`` key rows, looping over queries ``block_m`` at a time;
- ``dq``:   one program per ``block_m`` query rows, looping over keys ``block_n`` at a time;

and each has a warp-specialized variant for its unmasked tiles on Hopper (``fwd_ws``, ``dkdv_ws``,
``dq_ws``: ``fwd_warp_spec``, ``bwd_warp_spec``). On Hopper the forward of 16-bit dense blocks runs
a Gluon kernel instead where ``fwd_gluon`` says so (its tile is fixed, see ``attention_fwd_gluon``).

The backward computes dQ either in its own kernel (``dq``: recomputes QK^T and dO V^T, 7 matmuls
in all) or inside the dK/dV kernel with float32 atomic adds (5 matmuls, order of the additions not
fixed); ``dq_by_atomics`` says which. ``dkdv_split_tail`` says whether the dK/dV kernel gives the
last partial query tile a loop of its own, so that the main loop loads without row checks.

Benchmarks try other settings with ``override(fwd=..., dkdv=..., dq=..., dq_atomic=...,
dkdv_split_tail=..., bwd_warp_spec=...)``. A tile that does not fit the device's shared memory
falls back to ``FALLBACK`` (see ``attention_fwd.launch``).
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# Tiles for Hopper (sm_90), bfloat16/float16, timed on an H200 at B*S = 32K tokens, 16 heads
# (.notes/attention.md, benchmarks/logs/). Key: (kernel, padded head dim) -> Tile, or
# {causal: Tile} where causal and full attention prefer different tiles. float32 inputs use the
# exact (FMA) dot and small tiles.
_SM90_16BIT = {
    ("fwd", 64): Tile(128, 64, 8, 3),
    ("fwd", 128): Tile(128, 128, 8, 3),
    ("fwd", 256): Tile(64, 64, 8, 2),
    ("dkdv", 64): Tile(32, 64, 4, 3),
    ("dkdv", 128): Tile(64, 128, 8, 3),
    ("dkdv", 256): Tile(16, 64, 8, 2),
    # dq at D=64: 64x64 w4 was the causal tile beside the plain dK/dV kernel; beside the
    # warp-specialized one 128x64 w8 gained 3-6% on causal blocks (session 7)
    ("dq", 64): Tile(128, 64, 8, 3),
    ("dq", 128): Tile(128, 128, 8, 2),
    ("dq", 256): Tile(64, 32, 8, 2),
    # the warp-specialized forward (fwd_warp_spec): one producer warp and two 4-warp consumer
    # groups need num_warps=4; 3 stages do not fit at D=128 and gave NaN at D=64 (triton 3.6)
    ("fwd_ws", 64): Tile(128, 128, 4, 2),
    ("fwd_ws", 128): Tile(128, 128, 4, 2),
    # the warp-specialized backward (bwd_warp_spec), num_warps=4 likewise; at D=128 these are the
    # largest tiles whose buffers fit 227 KB of shared memory (triton 3.6, sm_90, offline compile).
    # Every warp-specialized tile keeps 2 stages: with 3, triton 3.6's pipelines race on an H200
    # (dK/dV 64x128 at D=128: NaN or changed gradients in 15 of 600 repeated runs, 0 of 600 with 2;
    # the forward at D=64: NaN every run)
    # dK/dV at D=64: 128 query rows per step gained 3-5% on full blocks and lost ~10% on causal ones
    # (every tile masked), H200 session 7, logs/2026-11-22-h200-attention-s7-bwd64-tiles.log
    ("dkdv_ws", 64): {False: Tile(128, 128, 4, 2), True: Tile(64, 128, 4, 2)},
    ("dkdv_ws", 128): Tile(64, 128, 4, 2),
    ("dq_ws", 64): Tile(128, 128, 4, 2),
    ("dq_ws", 128): Tile(128, 64, 4, 2),
}

# Other CUDA GPUs (Ampere, Ada, ...) and any head dim not above: conservative tiles.
_GENERIC_16BIT = {
    "fwd": Tile(64, 64, 4, 2),
    "fwd_ws": Tile(128, 128, 4, 2),
    "dkdv_ws": Tile(64, 128, 4, 2),
    "dq_ws": Tile(128, 64, 4, 2),
    "dkdv": Tile(32, 64, 4, 2),
    "dq": Tile(64, 32, 4, 2),
}
_FP32 = Tile(32, 32, 4, 1)
# TRITON_INTERPRET=1 on CPU tensors: small tiles, so tiny test shapes still span several tiles.
_INTERPRETER = Tile(16, 16, 4, 1)

# Tried in order when a tile needs more shared memory than the device has.
FALLBACK = (Tile(64, 64, 4, 2), Tile(64, 32, 4, 1), Tile(32, 32, 4, 1), Tile(16, 16, 4, 1))

# Padded head dims for which Hopper computes dQ by atomics in the dK/dV kernel (off: at D=128 it
# gained ~3% on an H200, at D=64 it lost; the separate dQ kernel is deterministic).
_SM90_DQ_ATOMIC: set[int] = set()
# Padded head dims for which the dK/dV kernel loads whole query tiles without row checks and
# handles the last partial tile in a loop of its own (more code and shared memory, fewer
# predicates): 8-19% faster backward on an H200 at D=64 and 128 (D=256 not measured).
_SM90_DKDV_SPLIT_TAIL: set[int] = {64, 128}

# Padded head dims for which the Hopper forward reads Q/K/V through on-device tensor descriptors
# (TMA), and for which it runs the warp-specialized kernel (Triton splits its one key loop into a
# TMA-load warp and two compute groups) on block pairs where no tile needs a mask. Inputs whose
# strides or base addresses are not 16-byte aligned, or whose head dim is not a power of two,
# always take the pointer path.
_SM90_FWD_TMA: set[int] = {128}
_SM90_FWD_WARP_SPEC: set[int] = {128}
# Padded head dims -> most keys for which the warp-specialized forward runs persistent (a grid of
# one program per multiprocessor walking the query tiles in order). On an H200, D=128 full
# attention (medians of 3, session 7): +4% at 4K keys, +2% at 8K, even at 16K-32K; D=64 (where it
# would be the only warp-specialized forward) even with the plain kernel at 4K-32K, so not taken.
_SM90_FWD_PERSISTENT_MAX_KEYS: dict[int, int] = {128: 8192}
# A block pair with masked tiles takes the warp-specialized kernel (then a launch for the masked
# keys, resuming from a float32 (out, lse)) only with at least this many keys: on an H200 at
# D=128 causal it gained 6% at 32K and 3% at 16K keys, and lost 11% at 4K.
_SM90_FWD_RESUME_MIN_KEYS = 16384
# Padded head dims -> fewest keys for which the Hopper forward runs the Gluon kernel instead
# (``attention_fwd_gluon``: warp-specialized by hand, the softmax under the P V matmul, masked tiles
# in the same loop, a persistent grid), where it supports the problem. H200, bf16, 16 heads,
# B*S = 32K (session 9, logs/2026-11-22-h200-attention-s9-gluon-persistent.log): D=128 551-622
# TFLOP/s at 4K-32K tokens, causal and not, against 425-553 for the Triton kernels; D=64 429-477
# against 373-432. (Session 8's grid of one program per query tile was 2-8% slower than the Triton
# kernel at D=64 4K: the persistent grid hides each tile's start and end.)
_SM90_FWD_GLUON_MIN_KEYS: dict[int, int] = {128: 0, 64: 0}
# Overrides that ask for a particular Triton forward (tests, probes): they turn the Gluon one off.
_TRITON_FWD_MODES = ("fwd", "fwd_ws", "fwd_tma", "fwd_warp_spec", "fwd_persistent", "fwd_resume_min_keys")
# Padded head dims for which the Hopper backward runs its warp-specialized kernels (TMA loads, one
# loop over every visible tile split into a load warp and two compute groups, each tile masked),
# per kernel, each with the shortest query/key block (the smaller of the two) that takes them.
# Both kernels warp-specialized gave the backward +19-27% at D=128 and +2-8% at D=64 for blocks
# >= 8K (H200, bf16, B*S = 32K, .notes/attention.md call 9). The dK/dV kernel adding into the
# caller's buffers (ACCUMULATE) raced in triton 3.6's warp-specialized pipelines even at 2 stages:
# NaN dK/dV in 4 of 8 ring replays with GQA 16/8 and 10 of 10 with 16/16 (session 5,
# benchmarks/probes/ring_world.py); with fresh buffers it was clean in every run, so attention_bwd
# gives it fresh buffers and adds them after. D=64: dQ alone warp-specialized lost 6% at 32K;
# dK/dV alone warp-specialized (fresh buffers) gained 3-13% over all-plain at 4K and 32K, full,
# causal and ring-step masks (session 7, logs/2026-11-22-h200-attention-s7-bwd-modes.log).
# Session 20: the warp-specialized dK/dV kernel still races with fresh buffers: non-finite dK/dV in
# 8 and 1 of 3000 repeats of 4K x 4K ring pairs at D=128 (GQA 16/8, causal; q after k, the
# diagonal) and 3 of 3000 at D=64; the GPU test test_gpu_ring_pairs_repeatable caught it once. With
# the dK/dV kernel plain: 0 of 3000 in each (benchmarks/probes/bwd_race.py,
# logs/2026-11-22-h200-s20-bwd-race*.log). So the Triton dK/dV kernel runs plain (on Hopper the Gluon
# kernel below takes the blocks it supports); dQ stays warp-specialized (no bad dQ in any run).
_SM90_BWD_WARP_SPEC: dict[str, dict[int, int]] = {"dkdv": {}, "dq": {128: 0}}
# Padded head dims for which the Hopper backward computes dK/dV with the Gluon kernel
# (``attention_bwd_gluon``: warp-specialized by hand, every hand-over an mbarrier of its own), where
# it supports the problem. Session 21, H100, bf16, 16 heads, B*S = 32K, 4K-32K tokens, the whole
# backward (logs/2026-11-23-h100-s21-bwd-gluon.log): D=128 453-475 TFLOP/s full and 390-475 causal
# against 379-387 and 326-396 with dK/dV plain (the Triton warp-specialized kernel: 435-456, 367-454);
# D=64 362-385 and 321-392 against 325-338 and 305-351. No bad gradient in 4000 ring-pair repeats.
_SM90_DKDV_GLUON: set[int] = {64, 128}
# Overrides that ask for a particular Triton dK/dV kernel (tests, probes): they turn the Gluon one off.
_TRITON_DKDV_MODES = ("dkdv", "dkdv_ws", "dq_atomic", "dkdv_split_tail", "bwd_warp_spec", "dkdv_warp_spec")

_OVERRIDE: dict = {}


@functools.lru_cache(maxsize=None)
def _major_of(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def cuda_major(device: torch.device) -> int:
    """The compute capability's major number of CUDA ``device`` (asked once per GPU: the host time of
    every block call counts in a ring of short blocks)."""
    return _major_of(torch.cuda.current_device() if device.index is None else device.index)


def tile_for(kernel: str, device: torch.device, head_dim_pad: int, dtype: torch.dtype,
             causal: bool) -> Tile:
    """The tile for ``kernel`` ("fwd", "fwd_ws", "dkdv", "dq", "dkdv_ws" or "dq_ws") on ``device``.

    ``head_dim_pad`` is the head dim rounded up to a power of two (>= 16); head dims below 64 use
    the 64 entry. ``causal`` is part of the key so that causal and full attention can be tuned apart.
    """
    if kernel in _OVERRIDE:
        return _OVERRIDE[kernel]
    if device.type != "cuda":
        return _INTERPRETER
    if dtype == torch.float32:
        return _FP32
    if cuda_major(device) != 9:
        return _GENERIC_16BIT[kernel]
    entry = _SM90_16BIT.get((kernel, max(head_dim_pad, 64)), _GENERIC_16BIT[kernel])
    return entry[bool(causal)] if isinstance(entry, dict) else entry


def _sm90_flag(name: str, head_dims, device: torch.device, head_dim_pad: int, dtype: torch.dtype) -> bool:
    """A backward option: the override if set, else on for 16-bit inputs on Hopper at ``head_dims``."""
    if name in _OVERRIDE:
        return bool(_OVERRIDE[name])
    if device.type != "cuda" or dtype == torch.float32:
        return False
    return cuda_major(device) == 9 and head_dim_pad in head_dims


def dq_by_atomics(device: torch.device, head_dim_pad: int, dtype: torch.dtype, causal: bool) -> bool:
    """Whether the backward adds dQ by atomics inside the dK/dV kernel (else: a separate dQ kernel)."""
    return _sm90_flag("dq_atomic", _SM90_DQ_ATOMIC, device, head_dim_pad, dtype)


def dkdv_split_tail(device: torch.device, head_dim_pad: int, dtype: torch.dtype, causal: bool) -> bool:
    """Whether the dK/dV kernel splits off the last partial query tile (unmasked loads before it)."""
    return _sm90_flag("dkdv_split_tail", _SM90_DKDV_SPLIT_TAIL, device, head_dim_pad, dtype)


def fwd_tma(device: torch.device, head_dim_pad: int, dtype: torch.dtype, causal: bool) -> bool:
    """Whether the forward loads through tensor descriptors (TMA), where the inputs allow it."""
    return _sm90_flag("fwd_tma", _SM90_FWD_TMA, device, head_dim_pad, dtype)


def fwd_warp_spec(device: torch.device, head_dim_pad: int, dtype: torch.dtype, causal: bool) -> bool:
    """Whether the forward runs warp-specialized (with TMA loads) where no tile needs a mask."""
    return _sm90_flag("fwd_warp_spec", _SM90_FWD_WARP_SPEC, device, head_dim_pad, dtype)


def bwd_warp_spec(kernel: str, device: torch.device, head_dim_pad: int, dtype: torch.dtype, causal: bool,
                  seqlen: int) -> bool:
    """Whether backward ``kernel`` ("dkdv" or "dq") runs warp-specialized (with TMA loads), ``seqlen``
    being the smaller of the block pair's query and key lengths. Override: ``bwd_warp_spec`` (both
    kernels), ``dkdv_warp_spec`` or ``dq_warp_spec``."""
    for name in (kernel + "_warp_spec", "bwd_warp_spec"):
        if name in _OVERRIDE:
            return _sm90_flag(name, (), device, head_dim_pad, dtype)
    min_len = _SM90_BWD_WARP_SPEC[kernel].get(head_dim_pad)
    return min_len is not None and seqlen >= min_len and _sm90_flag("", {head_dim_pad}, device, head_dim_pad, dtype)


def dkdv_gluon(device: torch.device, head_dim_pad: int, dtype: torch.dtype, causal: bool) -> bool:
    """Whether the backward computes dK/dV with the Gluon kernel, where it supports the problem
    (``attention_bwd.gluon_dkdv_ready``). Override: ``dkdv_gluon``; overriding any of the Triton
    dK/dV kernel's tiles or modes turns it off, so that those overrides reach the Triton kernel."""
    if "dkdv_gluon" in _OVERRIDE:
        return _sm90_flag("dkdv_gluon", (), device, head_dim_pad, dtype)
    if any(mode in _OVERRIDE for mode in _TRITON_DKDV_MODES):
        return False
    return _sm90_flag("", _SM90_DKDV_GLUON, device, head_dim_pad, dtype)


def fwd_persistent(device: torch.device, head_dim_pad: int, dtype: torch.dtype, causal: bool, n_keys: int) -> bool:
    """Whether the warp-specialized forward runs persistent on a block of ``n_keys`` keys (it also
    runs warp-specialized where fwd_warp_spec says not, e.g. D=64). Override: ``fwd_persistent``;
    overriding ``fwd_warp_spec=False`` alone turns it off too (no warp-specialized forward at all)."""
    if "fwd_persistent" in _OVERRIDE:
        return _sm90_flag("fwd_persistent", (), device, head_dim_pad, dtype)
    if _OVERRIDE.get("fwd_warp_spec", True) is False:
        return False
    most = _SM90_FWD_PERSISTENT_MAX_KEYS.get(head_dim_pad)
    return most is not None and n_keys <= most and _sm90_flag("", {head_dim_pad}, device, head_dim_pad, dtype)


def fwd_gluon(device: torch.device, head_dim_pad: int, dtype: torch.dtype, causal: bool, n_keys: int) -> bool:
    """Whether the forward runs the Gluon kernel on a block of ``n_keys`` keys, where the kernel
    supports the problem (``attention_fwd.gluon_ready``). Override: ``fwd_gluon``; overriding any of
    the Triton forward's tiles or modes turns it off, so that those overrides reach the Triton kernels."""
    if "fwd_gluon" in _OVERRIDE:
        return _sm90_flag("fwd_gluon", (), device, head_dim_pad, dtype)
    if any(mode in _OVERRIDE for mode in _TRITON_FWD_MODES):
        return False
    least = _SM90_FWD_GLUON_MIN_KEYS.get(head_dim_pad)
    return least is not None and n_keys >= least and _sm90_flag("", {head_dim_pad}, device, head_dim_pad, dtype)


def fwd_resume_min_keys(device: torch.device) -> int:
    """Fewest keys for which a masked block pair takes the warp-specialized forward (two launches)."""
    if "fwd_resume_min_keys" in _OVERRIDE:
        return int(_OVERRIDE["fwd_resume_min_keys"])
    return _SM90_FWD_RESUME_MIN_KEYS if device.type == "cuda" else 0


@contextlib.contextmanager
def override(**tiles):
    """Use the given tiles (``fwd=``, ``fwd_ws=``, ``dkdv=``, ``dq=``, ``dkdv_ws=``, ``dq_ws=``: Tile) or
    modes (``dq_atomic=``, ``dkdv_split_tail=``, ``fwd_tma=``, ``fwd_warp_spec=``, ``fwd_persistent=``,
    ``fwd_gluon=``, ``bwd_warp_spec=``, ``dkdv_gluon=``: bool;
    ``fwd_resume_min_keys=``: int; ``dkdv_warp_spec=``, ``dq_warp_spec=``: bool, each backward kernel
    alone) instead of the table, e.g. to tune or to test every mode."""
    unknown = set(tiles) - {"fwd", "fwd_ws", "dkdv", "dq", "dkdv_ws", "dq_ws", "dq_atomic", "dkdv_split_tail",
                            "fwd_tma", "fwd_warp_spec", "fwd_persistent", "fwd_gluon", "fwd_resume_min_keys",
                            "bwd_warp_spec", "dkdv_warp_spec", "dq_warp_spec", "dkdv_gluon"}
    if unknown:
        raise ValueError(f"unknown kernels {sorted(unknown)}")
    saved = dict(_OVERRIDE)
    _OVERRIDE.update(tiles)
    try:
        yield
    finally:
        _OVERRIDE.clear()
        _OVERRIDE.update(saved)
