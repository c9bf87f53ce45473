"""The torch.distributed ring: ring_attention and ring_softmax over a sequence sharded across ranks.

ring_attention: every rank keeps its query shard; K/V shards travel one rank forward per step
(double-buffered ``batch_isend_irecv``: the next block is in flight while this one is computed).
Each (query segment, key segment) pair of a step is one block call returning (out, lse), merged
into float32 accumulators. Backward recomputes each block from the saved (out, lse); dQ stays
home, dK/dV travel with K/V and arrive back at their owner after a full turn.

ring_softmax: a row split over the ranks along ``dim``. Each rank reduces its piece to a per-row
lse, the lses are merged across ranks, and each rank normalizes its piece with the merged lse.
Backward all-reduces rowsum(dy * y).

Before any exchange, the ranks agree on their arguments (one small all_gather): a rank with bad
input, or ranks whose shards disagree (or disagree on whether a gradient is needed, so that only
some would run the backward), make every rank raise instead of leaving some waiting. Double
backward is not supported and raises.

Under torch.compile both functions run eagerly (``torch.compiler.disable``; the compiled graph breaks
around them): their agreement and ring loops are collectives between kernel launches, which dynamo
traced into and failed on.
"""
from __future__ import annotations

import numbers
import struct
import zlib

import torch
import torch.distributed as dist

from .attention import attention, check_causal, check_qkv, default_scale
from .backend import attention_ops, softmax_ops
from .layouts import LAYOUTS, Segment, check_layout, segments, split_error
from .merge import NEG_INF, accum_dtype, merge_, merge_stats
from .softmax import check_softmax_input, from_rows, once_differentiable, softmax, to_rows

INPUT_ERRORS = (TypeError, ValueError, IndexError)


# ----------------------------------------------------------------------------------------------
# process groups and agreement between ranks
# ----------------------------------------------------------------------------------------------

def group_rank_world(group, fn: str):
    """(process group or None, rank, world size); None when there is nothing to distribute over.

    ``group`` is a ProcessGroup, a 1-D DeviceMesh, or None for the default group. Without an
    initialized default group (and no group given), or with one rank, the result is (None, 0, 1).
    """
    if group is not None and hasattr(group, "get_group") and hasattr(group, "ndim"):  # a DeviceMesh
        if group.ndim != 1:
            raise ValueError(f"{fn}: a DeviceMesh group must be 1-D (pass mesh[dim_name]), got {group.ndim}-D")
        group = group.get_group()
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise RuntimeError(f"{fn}: a group was given but torch.distributed is not initialized; call "
                               "torch.distributed.init_process_group first (or pass group=None to run on one device)")
        return None, 0, 1
    pg = dist.group.WORLD if group is None else group
    rank, world = dist.get_rank(pg), dist.get_world_size(pg)
    if rank < 0:
        raise ValueError(f"{fn}: this process is not a member of the given group")
    return (None, 0, 1) if world == 1 else (pg, rank, world)


def _comm_device(pg) -> torch.device:
    """Where small control tensors must live for ``pg``'s collectives."""
    if dist.get_backend(pg) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def device_error(pg, t: torch.Tensor) -> str | None:
    """Why ``t`` can't travel through ``pg``'s backend, or None."""
    backend = dist.get_backend(pg)
    if backend == "nccl" and not t.is_cuda:
        return f"tensors are on {t.device} but the process group uses NCCL: move them to this rank's GPU"
    if backend == "nccl" and t.device.index != torch.cuda.current_device():
        return (f"tensors are on {t.device} but this rank's current CUDA device is cuda:{torch.cuda.current_device()}, "
                f"where the ring's collectives run: call torch.cuda.set_device({t.device.index}) first (each rank "
                "one GPU), or move the tensors there")
    if backend == "gloo" and t.is_cuda:
        return "tensors are on CUDA but the process group uses gloo: initialize it with backend='nccl'"
    return None


FIELD_WIDTH = 8   # values of a field sent as they are (a shape of up to 8 dims), for the error message;
                  # each field also sends its true length and a checksum of all its values, so fields
                  # of any length are compared whole
_ROW = FIELD_WIDTH + 2
# what a field may hold besides numbers: a layout or a dtype, sent as its index here
_SYMBOLS = (*LAYOUTS, *sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str))


def _encode(item) -> float:
    """One value of a field as a float: a number as itself, a layout or dtype as its index in
    ``_SYMBOLS``, anything else -1 (only a rejected input holds one, and then nothing is compared)."""
    if isinstance(item, numbers.Real):
        try:
            return float(item) + 0.0                    # (+ 0.0: -0.0 and 0.0 get one checksum)
        except (OverflowError, ValueError):
            return -1.0
    if isinstance(item, (str, torch.dtype)) and item in _SYMBOLS:
        return float(_SYMBOLS.index(item))
    return -1.0


def _pack(fields: dict) -> list[float]:
    """Flatten {name: tuple of values} into a fixed-width row: per field its length, a checksum of
    all its values, and its first ``FIELD_WIDTH`` values (zero-padded)."""
    row = []
    for value in fields.values():
        vals = [_encode(v) for v in tuple(value)]
        crc = zlib.crc32(struct.pack(f"<{len(vals)}d", *vals))
        shown = vals[:FIELD_WIDTH]
        row += [float(len(vals)), float(crc), *shown, *([0.0] * (FIELD_WIDTH - len(shown)))]
    return row


def agree(pg, fields: dict, error: Exception | None, fn: str) -> None:
    """All ranks exchange ``fields`` ({name: tuple of numbers, layouts or dtypes}) and whether their
    input was rejected; raise on every rank if any rank rejected its input or the fields differ
    between ranks. Every rank must pass the same field names, in one order, even with an error
    (the values of a rejected input may then be anything: they are sent, never compared).
    """
    world = dist.get_world_size(pg)
    row = torch.tensor([1.0 if error else 0.0, *_pack(fields)], dtype=torch.float64, device=_comm_device(pg))
    rows = [torch.empty_like(row) for _ in range(world)]
    dist.all_gather(rows, row, group=pg)
    table = torch.stack(rows).cpu()
    bad = [r for r in range(world) if table[r, 0] != 0]
    if error is not None:
        raise error
    if bad:
        raise RuntimeError(f"{fn}: rank(s) {bad} rejected their input (see their error); every rank stops here "
                           "so that none waits forever")
    for r in range(world):
        diff = (table[r] != table[0]).nonzero()
        if len(diff):
            name = list(fields)[(int(diff[0]) - 1) // _ROW]
            raise ValueError(f"{fn}: ranks disagree on {name}: rank 0 has {_unpack(table[0], fields, name)} and "
                             f"rank {r} has {_unpack(table[r], fields, name)}{_own(pg, fields[name])}; every rank "
                             "must pass matching arguments")


def _unpack(row: torch.Tensor, fields: dict, name: str) -> str:
    """Field ``name`` of a row made by ``_pack`` (after the leading error flag), for a message; the
    values are decoded as the kind of value (bool, layout, dtype, number) this rank has there."""
    at = 1 + list(fields).index(name) * _ROW
    n = int(row[at])
    like = (*fields[name], None)[0]
    vals = [_decode(v, like) for v in row[at + 2: at + 2 + min(n, FIELD_WIDTH)].tolist()]
    if n > FIELD_WIDTH:
        return f"({', '.join(map(repr, vals))}, ... {n} values)"
    return repr(vals[0]) if n == 1 else repr(tuple(vals))


def _decode(code: float, like):
    if isinstance(like, bool) and code in (0.0, 1.0):
        return bool(code)
    if isinstance(like, (str, torch.dtype)) and 0 <= code < len(_SYMBOLS) and code.is_integer():
        return _SYMBOLS[int(code)]
    return int(code) if code.is_integer() else code


def _own(pg, value) -> str:
    """This rank's whole value of a field longer than the message shows, else ''."""
    value = tuple(value)
    return f" (this is rank {dist.get_rank(pg)}, whose value is {value})" if len(value) > FIELD_WIDTH else ""


def _shape(t) -> tuple:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else ()


def _dtype(t):
    return t.dtype if isinstance(t, torch.Tensor) else None


def _needs_grad(*tensors) -> bool:
    """Whether autograd records a call on ``tensors``, so that every rank must run its backward."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


NEEDS_GRAD = "whether a gradient is needed (grad mode on and an input that requires grad)"


# ----------------------------------------------------------------------------------------------
# the ring loop
# ----------------------------------------------------------------------------------------------

def _exchange(pg, send, recv, to_rank: int, from_rank: int):
    """Post sends of ``send`` to ``to_rank`` and receives into ``recv`` from ``from_rank`` (group ranks)."""
    to_g, from_g = dist.get_global_rank(pg, to_rank), dist.get_global_rank(pg, from_rank)
    ops = [dist.P2POp(dist.isend, t, to_g, pg) for t in send]
    ops += [dist.P2POp(dist.irecv, t, from_g, pg) for t in recv]
    return dist.batch_isend_irecv(ops)


def _wait(reqs) -> None:
    for req in reqs:
        req.wait()


def ring_loop(pg, travelling, step, returning=None):
    """Pass ``travelling`` tensors around the ring, calling ``step(src, travelling, returning)`` once
    per rank's block (``src`` is the rank whose block it is, starting with this rank's own).

    The next block is received while ``step`` computes on the current one, into one of two buffers
    that alternate. ``returning`` tensors (gradients of the travelling blocks) are filled by ``step``
    and then sent one rank on; after a full turn each is back at the owner of its block and is
    returned (``returning`` must be contiguous; ``travelling`` is made contiguous once, here). Every
    rank posts its sends and receives in the same order, so the ring cannot deadlock. If ``step``
    raises, the transfers already posted are completed before the error propagates.
    """
    rank, world = dist.get_rank(pg), dist.get_world_size(pg)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    cur = [t.contiguous() for t in travelling]      # c10d sends only contiguous tensors: copy once, not per step
    bufs = [[torch.empty_like(t) for t in cur] for _ in range(2)] if world > 1 else []
    rbufs = [[torch.empty_like(t) for t in returning] for _ in range(2)] if returning is not None else []
    for i in range(world):
        pending = _exchange(pg, cur, bufs[i % 2], nxt, prv) if i + 1 < world else []
        try:
            step((rank - i) % world, cur, returning)
        except Exception:
            _wait(pending)   # every rank posted this step's transfers: finish them, so that an error every
            raise            # rank meets leaves no point-to-point op dangling in the group
        if returning is not None:
            _wait(_exchange(pg, returning, rbufs[i % 2], nxt, prv))
            returning = rbufs[i % 2]
        _wait(pending)
        if pending:
            cur = bufs[i % 2]
    return returning


def _blocks(layout: str, shard_len: int, rank: int, world: int, causal: bool) -> tuple[Segment, ...]:
    """The segments a shard is computed in: by layout when causal; one whole block otherwise."""
    if not causal:
        return (Segment(0, shard_len, 0, 1),)
    return segments(layout, shard_len, rank, world)


def _visible_pairs(q_segs, k_segs, causal: bool):
    """(query segment, key segment) pairs with at least one visible key."""
    return [(qs, ks) for qs in q_segs for ks in k_segs if qs.length and ks.length and
            not (causal and ks.first > qs.last)]


def _mask_args(qs: Segment, ks: Segment, causal: bool, scale: float) -> dict:
    return dict(softmax_scale=scale, causal=causal, q_offset=qs.offset, q_stride=qs.stride,
                k_offset=ks.offset, k_stride=ks.stride)


# ----------------------------------------------------------------------------------------------
# ring attention
# ----------------------------------------------------------------------------------------------

class RingAttentionFunction(torch.autograd.Function):
    """(q, k, v) shards -> out shard; ``ring`` = (pg, rank, world, layout, causal, scale)."""

    @staticmethod
    def forward(ctx, q, k, v, ring):
        pg, rank, world, layout, causal, scale = ring
        ops, acc = attention_ops(q), accum_dtype(q.dtype)
        b, n, h, d = q.shape
        out = torch.zeros(b, n, h, d, dtype=acc, device=q.device)
        lse = torch.full((b, h, n), NEG_INF, dtype=acc, device=q.device)
        q_segs = _blocks(layout, n, rank, world, causal)

        def step(src, kv, _):
            k_blk, v_blk = kv
            for qs, ks in _visible_pairs(q_segs, _blocks(layout, n, src, world, causal), causal):
                o, l = ops.attention_fwd(q[:, qs.local], k_blk[:, ks.local], v_blk[:, ks.local], out_dtype=acc,
                                         **_mask_args(qs, ks, causal, scale))
                merge_(out[:, qs.local], lse[:, :, qs.local], o, l)

        ring_loop(pg, [k, v], step)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        return out

    @staticmethod
    @once_differentiable("ring_attention")
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        pg, rank, world, layout, causal, scale = ctx.ring
        ops, acc = attention_ops(q), accum_dtype(q.dtype)
        n = q.shape[1]
        delta = ops.attention_delta(out, dout)             # once per call, reused by every step
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        q_segs = _blocks(layout, n, rank, world, causal)

        def step(src, kv, dkv):
            (k_blk, v_blk), (dk_blk, dv_blk) = kv, dkv
            for qs, ks in _visible_pairs(q_segs, _blocks(layout, n, src, world, causal), causal):
                ops.attention_bwd(q[:, qs.local], k_blk[:, ks.local], v_blk[:, ks.local], out[:, qs.local],
                                  dout[:, qs.local], lse[:, :, qs.local], delta[:, :, qs.local],
                                  dq=dq[:, qs.local], dk=dk_blk[:, ks.local], dv=dv_blk[:, ks.local],
                                  **_mask_args(qs, ks, causal, scale))

        zeros = [torch.zeros(k.shape, dtype=acc, device=k.device), torch.zeros(v.shape, dtype=acc, device=v.device)]
        dk, dv = ring_loop(pg, [k, v], step, returning=zeros)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def check_ring_qkv(q, k, v, layout: str, fn: str) -> None:
    """Raise a clear error for a layout or q/k/v shards the ring can't take (on one rank too)."""
    check_layout(layout, fn)
    check_qkv(q, k, v, fn)
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"{fn}: q has {q.shape[1]} tokens but k/v have {k.shape[1]}: ring shards of one sequence "
                         "must have one length (use attention for q and k/v of different lengths)")


@torch.compiler.disable  # (see the module's note)
def ring_attention(q, k, v, causal: bool = False, softmax_scale=None, group=None, layout: str = "zigzag"):
    """Attention over a sequence sharded across the ranks of ``group``; differentiable (first order).

    Args:
        q: (batch, shard_len, heads, head_dim), this rank's query shard; k, v: (batch, shard_len,
            kv_heads, head_dim) with heads % kv_heads == 0, any strides. Every rank passes shards of
            one shape, dtype and device type (CUDA with NCCL, CPU with gloo), and every rank or none
            needs a gradient (grad mode on and an input that requires grad).
        causal: mask by global token position, as given by ``layout``.
        softmax_scale: default 1/sqrt(head_dim).
        group: ProcessGroup or 1-D DeviceMesh (default: the world). Without an initialized process
            group, or with one rank, this is ``attention(q, k, v, causal, softmax_scale)[0]``.
        layout: how the shards were cut ("contiguous", "zigzag", "stripe"; see ``shard``).
    Returns:
        out: (batch, shard_len, heads, head_dim), q's dtype: this rank's rows of the attention over
        the whole sequence.
    """
    fn = "ring_attention"
    pg, rank, world = group_rank_world(group, fn)
    if pg is None:
        check_ring_qkv(q, k, v, layout, fn)
        check_causal(causal, fn)
        return attention(q, k, v, causal=causal, softmax_scale=softmax_scale)[0]
    error = None
    try:
        check_ring_qkv(q, k, v, layout, fn)
        check_causal(causal, fn)
        problem = split_error(layout, q.shape[1] * world, world) or device_error(pg, q)
        if problem:
            raise ValueError(f"{fn}: {problem}")
        scale = default_scale(q, softmax_scale)
    except INPUT_ERRORS as e:
        error, scale = e, 0.0
    fields = {"q's shape": _shape(q), "k's shape": _shape(k), "v's shape": _shape(v), "dtype": (_dtype(q),),
              "causal": (bool(causal),), "layout": (layout,), "softmax_scale": (scale,),
              NEEDS_GRAD: (_needs_grad(q, k, v),)}
    agree(pg, fields, error, fn)
    return RingAttentionFunction.apply(q, k, v, (pg, rank, world, layout, bool(causal), scale))


# ----------------------------------------------------------------------------------------------
# ring softmax
# ----------------------------------------------------------------------------------------------

def all_merge_stats(m: torch.Tensor, s: torch.Tensor, pg):
    """Merge per-row (max, sum) statistics over the ranks of ``pg`` with the LSE rule, in rank order
    (the same result on every rank). (M,), (M,) -> (M,), (M,)."""
    mine = torch.stack([m, s])
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(pg))]
    dist.all_gather(parts, mine, group=pg)
    m, s = parts[0]
    for part in parts[1:]:
        m, s = merge_stats(m, s, part[0], part[1])
    return m, s


class RingSoftmaxFunction(torch.autograd.Function):
    """x shard -> y shard, the softmax of rows split over the ranks along ``dim``."""

    @staticmethod
    def forward(ctx, x, dim, pg):
        rows = to_rows(x, dim)
        ops = softmax_ops(rows)
        m, s = all_merge_stats(*ops.row_stats(rows), pg)
        y = ops.normalize(rows, m, s)
        ctx.save_for_backward(y)
        ctx.dim, ctx.pg, ctx.shape = dim, pg, x.shape
        return from_rows(y, x.shape, dim)

    @staticmethod
    @once_differentiable("ring_softmax")
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dy_rows = to_rows(dy, ctx.dim)
        ops = softmax_ops(y)
        delta = ops.row_dot(y, dy_rows)
        dist.all_reduce(delta, op=dist.ReduceOp.SUM, group=ctx.pg)
        dx = ops.softmax_bwd(y, dy_rows, delta)
        return from_rows(dx, ctx.shape, ctx.dim), None, None


@torch.compiler.disable  # (see the module's note)
def ring_softmax(x_shard: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """Softmax along ``dim`` of rows split over the ranks of ``group``; differentiable (first order).

    Args:
        x_shard: this rank's piece of every row: any shape, float16 / bfloat16 / float32 / float64.
            Pieces may differ in length along ``dim`` (even be empty); every other dim, the dtype,
            ``dim`` and whether a gradient is needed must agree across ranks. Which tokens a rank
            holds does not matter.
        dim: the dimension the rows run along (an int).
        group: ProcessGroup or 1-D DeviceMesh (default: the world). Without an initialized process
            group, or with one rank, this is ``softmax(x_shard, dim)``.
    Returns:
        y_shard like x_shard: this rank's piece of the softmax of the whole rows. A row that is
        ``-inf`` on every rank gives 0.
    """
    fn = "ring_softmax"
    pg, rank, world = group_rank_world(group, fn)
    if pg is None:
        return softmax(x_shard, dim)
    error, shape = None, _shape(x_shard)
    try:
        dim = check_softmax_input(x_shard, dim, fn)
        problem = device_error(pg, x_shard)
        if problem:
            raise ValueError(f"{fn}: {problem}")
        shape = shape[:dim] + (-1,) + shape[dim + 1:]       # the split dim may differ between ranks
    except INPUT_ERRORS as e:
        error = e
    fields = {"x's shape (dim excluded)": shape, "dim": (dim,), "dtype": (_dtype(x_shard),),
              NEEDS_GRAD: (_needs_grad(x_shard),)}
    agree(pg, fields, error, fn)
    return RingSoftmaxFunction.apply(x_shard, dim, pg)
