"""How a sequence is split over ranks, and shard / unshard.

A layout says which global token positions each rank holds. With world size W and a sequence of S
tokens (each rank holds S / W):

- ``contiguous``: rank r holds tokens [r*S/W, (r+1)*S/W).
- ``zigzag``: the sequence is cut into 2W equal chunks; rank r holds chunks r and 2W-1-r, which
  balances causal work across ranks.
- ``stripe``: rank r holds tokens r, r+W, r+2W, ...

A shard is described by ``Segment``s: runs of consecutive local tokens whose global positions
form an arithmetic progression. Attention masks need nothing else, so one ring loop serves every
layout.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

LAYOUTS = ("contiguous", "zigzag", "stripe")


@dataclass(frozen=True)
class Segment:
    """Local tokens [start, start + length) sit at global positions offset + i * stride."""
    start: int
    length: int
    offset: int
    stride: int

    @property
    def local(self) -> slice:
        return slice(self.start, self.start + self.length)

    @property
    def first(self) -> int:
        return self.offset

    @property
    def last(self) -> int:
        return self.offset + (self.length - 1) * self.stride


def check_layout(layout: str, fn: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"{fn}: layout={layout!r} is unknown; use one of {', '.join(LAYOUTS)}")


def split_error(layout: str, seqlen: int, world: int) -> str | None:
    """Why a global sequence of ``seqlen`` tokens can't be split over ``world`` ranks, or None."""
    parts = 2 * world if layout == "zigzag" else world
    if seqlen % parts:
        return (f"a sequence of {seqlen} tokens can't be split by layout {layout!r} over {world} ranks: it needs a "
                f"multiple of {parts} ({'2 * world' if layout == 'zigzag' else 'world'}); pad the sequence or "
                f"choose another layout")
    return None


def segments(layout: str, shard_len: int, rank: int, world: int) -> tuple[Segment, ...]:
    """The segments of rank ``rank``'s shard of ``shard_len`` tokens."""
    if layout == "contiguous":
        return (Segment(0, shard_len, rank * shard_len, 1),)
    if layout == "stripe":
        return (Segment(0, shard_len, rank, world),)
    half = shard_len // 2
    return (Segment(0, half, rank * half, 1), Segment(half, half, (2 * world - 1 - rank) * half, 1))


def positions(layout: str, shard_len: int, rank: int, world: int, device=None) -> torch.Tensor:
    """Global positions of rank ``rank``'s tokens, in local order: int64 (shard_len,)."""
    return torch.cat([seg.offset + seg.stride * torch.arange(seg.length, device=device)
                      for seg in segments(layout, shard_len, rank, world)])


def check_dim(x, dim, fn: str, name: str = "x") -> int:
    """Validate that ``x`` is a tensor with a dimension ``dim`` (an int, negative counts from the
    end); return ``dim`` as a non-negative index."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError(f"{fn}: {name} must have at least one dimension, got a scalar")
    try:
        dim = operator.index(dim)
    except TypeError:
        raise TypeError(f"{fn}: dim must be an int, got {type(dim).__name__}") from None
    if not -x.dim() <= dim < x.dim():
        raise IndexError(f"{fn}: dim={dim} is out of range for a tensor of {x.dim()} dims "
                         f"(use -{x.dim()} .. {x.dim() - 1})")
    return dim % x.dim()


def shard_for(x: torch.Tensor, dim: int, rank: int, world: int, layout: str = "zigzag") -> torch.Tensor:
    """Rank ``rank``'s shard of ``x`` along ``dim`` (a new contiguous tensor), without a process group."""
    dim = check_dim(x, dim, "shard")
    check_layout(layout, "shard")
    if not 0 <= rank < world:
        raise ValueError(f"shard: rank {rank} is not one of the {world} ranks 0 .. {world - 1}")
    err = split_error(layout, x.shape[dim], world)
    if err:
        raise ValueError(f"shard: {err}")
    idx = positions(layout, x.shape[dim] // world, rank, world, device=x.device)
    return x.index_select(dim, idx)


def unshard_from(shards, dim: int, layout: str = "zigzag") -> torch.Tensor:
    """Put every rank's shard (a list, in rank order; one shape and dtype) back into the global
    sequence order."""
    check_layout(layout, "unshard")
    if not isinstance(shards, (list, tuple)) or not shards:
        raise TypeError(f"unshard: shards must be a non-empty list of tensors, one per rank, got {shards!r:.80}")
    dim = check_dim(shards[0], dim, "unshard", "shards[0]")
    for rank, part in enumerate(shards):
        check_dim(part, dim, "unshard", f"shards[{rank}]")
        if part.shape != shards[0].shape or part.dtype != shards[0].dtype:
            raise ValueError(f"unshard: shards[{rank}] is {tuple(part.shape)} {part.dtype} but shards[0] is "
                             f"{tuple(shards[0].shape)} {shards[0].dtype}; every shard must have one shape and dtype")
    world = len(shards)
    n = shards[0].shape[dim]
    shape = list(shards[0].shape)
    shape[dim] = n * world
    out = shards[0].new_empty(shape)
    for rank, part in enumerate(shards):
        out.index_copy_(dim, positions(layout, n, rank, world, device=part.device), part)
    return out


def shard(x: torch.Tensor, dim: int, group=None, layout: str = "zigzag") -> torch.Tensor:
    """This rank's shard of the full tensor ``x`` along ``dim``, cut by ``layout``.

    With no initialized process group (or one rank) the shard is ``x`` itself (``dim`` and
    ``layout`` are still checked).
    """
    from .ring import group_rank_world
    pg, rank, world = group_rank_world(group, "shard")
    check_dim(x, dim, "shard")
    check_layout(layout, "shard")
    return x if pg is None else shard_for(x, dim, rank, world, layout)


def unshard(x_shard: torch.Tensor, dim: int, group=None, layout: str = "zigzag") -> torch.Tensor:
    """The full tensor from every rank's shard along ``dim`` (all_gather); the inverse of ``shard``.

    Every rank gets the whole tensor. Every rank passes a shard of one shape and dtype (any dtype),
    and one ``dim`` and ``layout``; otherwise every rank raises. Not differentiable: a shard that
    requires grad, with grad mode on, is rejected (pass ``x_shard.detach()``).
    With no initialized process group (or one rank) the result is ``x_shard`` itself.
    """
    import torch.distributed as dist

    from .ring import INPUT_ERRORS, _dtype, _shape, agree, group_rank_world
    pg, _, world = group_rank_world(group, "unshard")
    error = None
    try:
        dim = _check_unshard(x_shard, dim, layout, pg)
    except INPUT_ERRORS as e:
        error = e
    if pg is None:
        if error is not None:
            raise error
        return x_shard
    fields = {"the shard's shape": _shape(x_shard), "dim": (dim,), "dtype": (_dtype(x_shard),), "layout": (layout,)}
    agree(pg, fields, error, "unshard")
    x_shard = x_shard.contiguous()
    parts = [torch.empty_like(x_shard) for _ in range(world)]
    dist.all_gather(parts, x_shard, group=pg)
    return unshard_from(parts, dim, layout)


def _check_unshard(x_shard, dim, layout: str, pg) -> int:
    """Validate ``unshard``'s arguments on this rank; return ``dim`` as a non-negative index."""
    from .ring import device_error
    dim = check_dim(x_shard, dim, "unshard", "x_shard")
    check_layout(layout, "unshard")
    if torch.is_grad_enabled() and x_shard.requires_grad:
        raise ValueError("unshard: x_shard requires grad, but unshard is not differentiable (its result would "
                         "silently carry no gradient back); pass x_shard.detach(), or call it under torch.no_grad()")
    problem = device_error(pg, x_shard) if pg is not None else None
    if problem:
        raise ValueError(f"unshard: {problem}")
    return dim
