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


def shard_for(x: torch.Tensor, dim: int, rank: int, world: int, layout: str = "zigzag") -> torch.Tensor:
    """Rank ``rank``'s shard of ``x`` along ``dim`` (a new contiguous tensor), without a process group."""
    check_layout(layout, "shard")
    dim = dim % x.dim()
    err = split_error(layout, x.shape[dim], world)
    if err:
        raise ValueError(f"shard: {err}")
    idx = positions(layout, x.shape[dim] // world, rank, world, device=x.device)
    return x.index_select(dim, idx)


def unshard_from(shards, dim: int, layout: str = "zigzag") -> torch.Tensor:
    """Put every rank's shard (a list, in rank order) back into the global sequence order."""
    check_layout(layout, "unshard")
    world = len(shards)
    dim = dim % shards[0].dim()
    n = shards[0].shape[dim]
    shape = list(shards[0].shape)
    shape[dim] = n * world
    out = shards[0].new_empty(shape)
    for rank, part in enumerate(shards):
        out.index_copy_(dim, positions(layout, n, rank, world, device=part.device), part)
    return out


def shard(x: torch.Tensor, dim: int, group=None, layout: str = "zigzag") -> torch.Tensor:
    """This rank's shard of the full tensor ``x`` along ``dim``, cut by ``layout``.

    With no initialized process group (or one rank) the shard is ``x`` itself.
    """
    from .ring import group_rank_world
    pg, rank, world = group_rank_world(group, "shard")
    check_layout(layout, "shard")
    return x if pg is None else shard_for(x, dim, rank, world, layout)


def unshard(x_shard: torch.Tensor, dim: int, group=None, layout: str = "zigzag") -> torch.Tensor:
    """The full tensor from every rank's shard along ``dim`` (all_gather); the inverse of ``shard``.

    Every rank gets the whole tensor. Not differentiable.
    """
    import torch.distributed as dist

    from .ring import agree, group_rank_world
    pg, _, world = group_rank_world(group, "unshard")
    check_layout(layout, "unshard")
    if pg is None:
        return x_shard
    agree(pg, {"the shard's shape": tuple(x_shard.shape), "dim": (dim % x_shard.dim(),)}, None, "unshard")
    parts = [torch.empty_like(x_shard) for _ in range(world)]
    dist.all_gather(parts, x_shard.contiguous(), group=pg)
    return unshard_from(parts, dim, layout)
