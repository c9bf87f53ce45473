"""The LSE merge rule: exact against float64 on split rows, stable at +-1e4 and -inf."""
import pytest
import torch

import ringsoftmax as rs
from ringsoftmax.merge import merge_, merge_lse, merge_stats, stats_to_lse

from helpers import assert_close, attention64


def _split_attention(seed, lse_scale=1.0):
    torch.manual_seed(seed)
    q = torch.randn(2, 5, 3, 4, dtype=torch.float64) * lse_scale
    k = torch.randn(2, 9, 3, 4, dtype=torch.float64) * lse_scale
    v = torch.randn(2, 9, 3, 4, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_merge_of_two_key_blocks_is_attention_over_both(scale):
    q, k, v = _split_attention(0, scale)
    out_a, lse_a = attention64(q, k[:, :4], v[:, :4])
    out_b, lse_b = attention64(q, k[:, 4:], v[:, 4:])
    out, lse = rs.merge(out_a, lse_a, out_b, lse_b)
    want_out, want_lse = attention64(q, k, v)
    assert_close("out", out, want_out, 1e-12)
    assert_close("lse", lse, want_lse, 1e-12)


def test_merge_is_stable_at_large_lse_and_minus_inf():
    out_a = torch.randn(1, 4, 2, 3, dtype=torch.float64)
    out_b = torch.randn(1, 4, 2, 3, dtype=torch.float64)
    inf = float("inf")
    lse_a = torch.tensor([[[1e4, -1e4, -inf, -inf], [1e4, 5.0, -inf, 1e4]]], dtype=torch.float64)
    lse_b = torch.tensor([[[1e4, -1e4, -inf, 3.0], [-1e4, 5.0, 2.0, 1e4 + 1]]], dtype=torch.float64)
    out, lse = rs.merge(out_a, lse_a, out_b, lse_b)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    want_lse = torch.logaddexp(lse_a, lse_b)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    fin = torch.isfinite(want_lse)
    assert torch.allclose(lse[fin], want_lse[fin], rtol=1e-15, atol=0)
    wa = torch.exp(lse_a - torch.where(fin, want_lse, 0.0)).transpose(-1, -2).unsqueeze(-1)
    wb = torch.exp(lse_b - torch.where(fin, want_lse, 0.0)).transpose(-1, -2).unsqueeze(-1)
    want = torch.where(fin.transpose(-1, -2).unsqueeze(-1), wa * out_a + wb * out_b, 0.0)
    assert torch.allclose(out, want, rtol=1e-13, atol=1e-13)
    assert torch.equal(out[0, 2, 0], torch.zeros(3, dtype=torch.float64))     # both -inf -> 0


def test_merge_lse_and_stats_agree_and_keep_empty_rows_empty():
    inf = float("inf")
    a = torch.tensor([0.0, 1e4, -inf, -inf, -1e4], dtype=torch.float64)
    b = torch.tensor([0.0, -1e4, 3.0, -inf, -1e4], dtype=torch.float64)
    lse = merge_lse(a, b)
    assert torch.equal(lse.isneginf(), torch.tensor([False, False, False, True, False]))
    assert torch.allclose(lse[~lse.isneginf()], torch.logaddexp(a, b)[~lse.isneginf()], rtol=1e-15)
    one = torch.ones_like(a)
    m, s = merge_stats(a, torch.where(a.isneginf(), 0.0, one), b, torch.where(b.isneginf(), 0.0, one))
    assert torch.allclose(stats_to_lse(m, s)[~lse.isneginf()], lse[~lse.isneginf()], rtol=1e-15)
    assert stats_to_lse(m, s)[3] == -inf and s[3] == 0


def test_merge_accumulates_in_float32_and_in_place_on_views():
    out_a = torch.randn(1, 6, 2, 4, dtype=torch.bfloat16)
    out_b = torch.randn(1, 6, 2, 4, dtype=torch.float16)
    lse_a, lse_b = torch.randn(1, 2, 6), torch.randn(1, 2, 6)
    out, lse = rs.merge(out_a, lse_a, out_b, lse_b)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    acc_out = torch.zeros(1, 10, 2, 4)
    acc_lse = torch.full((1, 2, 10), float("-inf"))
    merge_(acc_out[:, 2:8], acc_lse[:, :, 2:8], out_a, lse_a)
    merge_(acc_out[:, 2:8], acc_lse[:, :, 2:8], out_b, lse_b)
    assert torch.allclose(acc_out[:, 2:8], out) and torch.allclose(acc_lse[:, :, 2:8], lse)
    assert (acc_out[:, :2] == 0).all() and acc_lse[:, :, 8:].isneginf().all()


def test_merge_rejects_mismatched_pairs():
    out = torch.zeros(1, 4, 2, 3)
    with pytest.raises(ValueError, match="lse_a must have shape"):
        rs.merge(out, torch.zeros(1, 4, 2), out, torch.zeros(1, 2, 4))
    with pytest.raises(TypeError, match="float32"):
        rs.merge(out, torch.zeros(1, 2, 4, dtype=torch.bfloat16), out, torch.zeros(1, 2, 4))
    with pytest.raises(ValueError, match="one shape"):
        rs.merge(out, torch.zeros(1, 2, 4), torch.zeros(1, 4, 2, 5), torch.zeros(1, 2, 4))
