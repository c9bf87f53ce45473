"""Ring attention inside Hugging Face transformers models: ``attn_implementation="ringsoftmax"``.

Each rank of a process group holds a shard of every sequence (a layout of ``ringsoftmax.layouts``)
and runs the whole model on it; every attention layer becomes one ``ring_attention`` call, so the
logits (and the gradients, summed over ranks) are those of the unsharded sequence.

    import ringsoftmax.integrations.transformers as rs_hf
    rs_hf.register(group=None, layout="zigzag")            # once, before building the model
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="ringsoftmax")
    batch = rs_hf.shard_batch(input_ids, labels=labels)     # this rank's tokens, positions, labels
    out = model(**batch)                                    # out.logits: this rank's tokens

``shard_batch`` matters: it gives every token its global position (RoPE must see those, not the
shard's 0..n-1), an all-ones attention mask (without one, transformers would read the jumps in a
zigzag shard's positions as packed sequences), and labels shifted before sharding (a causal LM's
label shift crosses shard boundaries) as ``shift_labels``.

What it does not do, and says so: padding masks (use unpadded sequences or ``attention_varlen``),
sliding-window, chunked or other non-causal masks, attention dropout, logit soft-capping, and
decoding with a KV cache (queries and keys of different lengths). Needs transformers'
``AttentionInterface`` and ``AttentionMaskInterface``; tested with 4.57.6 and 5.23.0 on CPU (gloo,
1-3 processes, a small Llama against its eager attention).
"""
from __future__ import annotations

import torch

from ..layouts import check_layout, positions, shard
from ..ring import group_rank_world, ring_attention

NAME = "ringsoftmax"
_SETTINGS = {"group": None, "layout": "zigzag"}
#: Arguments some models pass to their attention function that change what it computes (windows,
#: soft-capping, attention sinks, relative position biases, packed sequences): refused when set.
UNSUPPORTED = ("sliding_window", "softcap", "s_aux", "sinks", "position_bias", "cu_seq_lens_q", "cu_seq_lens_k",
               "block_indices")


def ringsoftmax_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                          **kwargs):
    """transformers attention function: query (B, H, S, D), key/value (B, Hkv, S, D) of this rank's
    shard -> (out (B, S, H, D), None). Causal unless ``is_causal=False`` is passed or set on the module."""
    if attention_mask is not None:
        raise ValueError("ringsoftmax attention got an attention mask: it masks by global position itself "
                         "and supports neither padding nor custom masks")
    if dropout:
        raise NotImplementedError(f"ringsoftmax attention has no attention dropout (got {dropout}); set the "
                                  "model's attention_dropout to 0")
    for name in UNSUPPORTED:
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"ringsoftmax attention does not support {name} (this model passes it)")
    causal = kwargs.get("is_causal")
    if query.shape[2] != key.shape[2]:
        raise NotImplementedError(f"ringsoftmax attention needs queries and keys of one sequence shard "
                                  f"({query.shape[2]} queries, {key.shape[2]} keys): decoding with a KV cache "
                                  "is not supported (pass use_cache=False, generate with another implementation)")
    out = ring_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                         causal=bool(getattr(module, "is_causal", True) if causal is None else causal),
                         softmax_scale=scaling,
                         group=_SETTINGS["group"], layout=_SETTINGS["layout"])
    return out, None


def ringsoftmax_mask(*args, mask_function=None, attention_mask=None, local_size=None, **kwargs):
    """transformers mask function: None (ring_attention masks by global position), after checking that
    the model asks for the plain causal mask over unpadded tokens."""
    from transformers.masking_utils import causal_mask_function
    if attention_mask is not None and not bool(attention_mask.all()):
        raise ValueError("ringsoftmax attention does not support padding: the attention mask has zeros "
                         "(pack sequences without padding, or use ringsoftmax.attention_varlen)")
    if mask_function is not causal_mask_function or local_size is not None:
        raise NotImplementedError(
            "ringsoftmax attention supports the plain causal mask only; this model asks for another "
            "(sliding window, chunked, packed sequences, or image/prefix masks). If you passed position_ids "
            "without an attention_mask, transformers read their jumps as packed sequences: use shard_batch, "
            "which passes an all-ones attention_mask")
    return None


def register(group=None, layout: str = "zigzag") -> None:
    """Register ``attn_implementation="ringsoftmax"`` with transformers, for shards of ``layout`` over
    ``group`` (a ProcessGroup or 1-D DeviceMesh; None: the default group, or one process)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    check_layout(layout, "register")
    group_rank_world(group, "register")  # a group given without torch.distributed raises here
    _SETTINGS.update(group=group, layout=layout)
    AttentionInterface.register(NAME, ringsoftmax_attention)
    AttentionMaskInterface.register(NAME, ringsoftmax_mask)


def shard_batch(input_ids: torch.Tensor, labels: torch.Tensor | None = None, ignore_index: int = -100) -> dict:
    """This rank's share of a (batch, seqlen) batch, as keyword arguments of the model's forward.

    Every rank passes the whole batch. Returns ``input_ids`` and ``position_ids`` (global positions)
    of this rank's tokens and an all-ones ``attention_mask``; with ``labels`` also ``shift_labels``
    (the labels shifted by one over the whole sequence, the last token's label ``ignore_index``, then
    sharded; ``labels`` carries the same so that the model computes a loss) and
    ``num_items_in_batch`` (the whole batch's labelled tokens), so that each rank's loss is its
    tokens' share of the unsharded mean: the ranks' losses and gradients sum to the unsharded ones.
    ``seqlen`` must split over the group in its layout."""
    if input_ids.dim() != 2:
        raise ValueError(f"shard_batch: input_ids must be (batch, seqlen), got shape {tuple(input_ids.shape)}")
    group, layout = _SETTINGS["group"], _SETTINGS["layout"]
    _, rank, world = group_rank_world(group, "shard_batch")
    ids = shard(input_ids, 1, group=group, layout=layout)
    n = ids.shape[1]
    pos = positions(layout, n, rank, world, device=input_ids.device).to(torch.long)
    batch = {"input_ids": ids, "position_ids": pos.expand(input_ids.shape[0], n),
             "attention_mask": torch.ones_like(ids)}
    if labels is not None:
        if labels.shape != input_ids.shape:
            raise ValueError(f"shard_batch: labels {tuple(labels.shape)} must be shaped like input_ids "
                             f"{tuple(input_ids.shape)}")
        shifted = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], ignore_index)], dim=1)
        mine = shard(shifted, 1, group=group, layout=layout)
        batch.update(labels=mine, shift_labels=mine, num_items_in_batch=(shifted != ignore_index).sum())
    return batch
