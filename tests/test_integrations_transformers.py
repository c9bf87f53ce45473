"""ringsoftmax as a transformers attention implementation: a small random Llama, sharded over 1-3
CPU processes (gloo), against the same model unsharded with transformers' eager attention.

float32 on CPU (the reference backend): logits of every rank's tokens, the loss and every parameter
gradient (summed over ranks) match the unsharded model to float32 rounding; plus the errors for what
the adapter does not support.
"""
import pytest
import torch
import torch.distributed as dist

from dist_utils import run_world

transformers = pytest.importorskip("transformers")  # a test extra: installed by .ci/run

from ringsoftmax.integrations import transformers as rs_hf  # noqa: E402
from ringsoftmax.layouts import shard_for  # noqa: E402

SEQ, BATCH = 24, 2


def tiny_llama(impl: str, **overrides):
    """A 2-layer Llama with GQA (4 query heads, 2 KV heads), fixed random weights."""
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      attention_dropout=0.0, **overrides)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl)


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (BATCH, SEQ), generator=g)
    labels = ids.clone()
    labels[0, 5] = -100  # one token without a label
    return ids, labels


def reference():
    """The unsharded eager model: (logits, loss, {name: grad})."""
    model = tiny_llama("eager")
    ids, labels = batch()
    out = model(input_ids=ids, labels=labels, use_cache=False)
    out.loss.backward()
    return out.logits.detach(), out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _sharded_case(rank, world, layout):
    want_logits, want_loss, want_grads = reference()
    rs_hf.register(layout=layout)
    model = tiny_llama(rs_hf.NAME)
    ids, labels = batch()
    out = model(**rs_hf.shard_batch(ids, labels=labels), use_cache=False)
    got = out.logits.detach()
    torch.testing.assert_close(got, shard_for(want_logits, 1, rank, world, layout), rtol=1e-5, atol=1e-5)
    out.loss.backward()
    loss = out.loss.detach().clone()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    if world > 1:
        dist.all_reduce(loss)
        for g in grads.values():
            dist.all_reduce(g)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(g, want_grads[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("layout", ["zigzag", "stripe"])
def test_one_process_matches_eager(layout):
    _sharded_case(0, 1, layout)


@pytest.mark.parametrize("world,layout", [(2, "zigzag"), (3, "zigzag"), (2, "contiguous"), (3, "stripe")])
def test_sharded_over_ranks_matches_unsharded(world, layout):
    run_world(world, _sharded_case, layout)


def test_what_it_does_not_support():
    rs_hf.register()
    model = tiny_llama(rs_hf.NAME)
    ids, _ = batch()
    padded = torch.ones_like(ids)
    padded[0, -3:] = 0
    with pytest.raises(ValueError, match="padding"):
        model(input_ids=ids, attention_mask=padded)
    with pytest.raises(NotImplementedError, match="packed"):   # positions with jumps and no mask
        model(input_ids=ids, position_ids=torch.arange(SEQ).mul(2).expand(BATCH, SEQ), use_cache=False)
    out = model(**rs_hf.shard_batch(ids), use_cache=True)       # a prefill fills the cache ...
    with pytest.raises(NotImplementedError, match="KV cache"):  # ... but decoding from it is refused
        model(input_ids=ids[:, :1], past_key_values=out.past_key_values, use_cache=True)
    model.train()
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with pytest.raises(NotImplementedError, match="dropout"):
        model(**rs_hf.shard_batch(ids), use_cache=False)
    with pytest.raises(ValueError, match="layout"):
        rs_hf.register(layout="diagonal")
    with pytest.raises(RuntimeError, match="not initialized"):
        rs_hf.register(group=object())


def test_sliding_window_models_are_refused():
    rs_hf.register()
    config = transformers.MistralConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, sliding_window=8)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=rs_hf.NAME)
    ids, _ = batch()
    with pytest.raises(NotImplementedError):
        model(**rs_hf.shard_batch(ids), use_cache=False)


def test_attention_function_arguments():
    """Called directly as transformers calls it: (B, H, S, D) in, (B, S, H, D) out, causal from the
    module or an ``is_causal`` argument; arguments that change the computation are refused."""
    rs_hf.register()
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 6, 8, generator=g)
    k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(2))

    class Module:
        is_causal = True

    for causal, kwargs in ((True, {}), (False, {"is_causal": False})):
        out, weights = rs_hf.ringsoftmax_attention(Module(), q, k, v, None, scaling=0.5, **kwargs)
        want = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=causal, scale=0.5)
        assert weights is None
        torch.testing.assert_close(out, want.transpose(1, 2), rtol=1e-5, atol=1e-6)
    for name in rs_hf.UNSUPPORTED:
        with pytest.raises(NotImplementedError, match=name):
            rs_hf.ringsoftmax_attention(Module(), q, k, v, None, **{name: torch.zeros(1)})
    with pytest.raises(ValueError, match="attention mask"):
        rs_hf.ringsoftmax_attention(Module(), q, k, v, torch.ones(1, 1, 6, 6, dtype=torch.bool))
