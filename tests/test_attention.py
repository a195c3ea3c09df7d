"""The one-query attention used by every decode step (models/llama.py attend_one; on the CPU with a
float32 cache, the C++ kernel in native/src/attention.cpp) against torch's SDPA."""

import pytest
import torch
import torch.nn.functional as F

from llmcli.models.llama import attend_one


@pytest.mark.parametrize("B,H,KV,S,D", [(1, 9, 3, 70, 64), (3, 8, 2, 33, 128), (2, 4, 4, 1, 64),
                                        (1, 14, 2, 301, 64), (2, 6, 3, 17, 80)])
@pytest.mark.parametrize("masked", [False, True])
def test_one_query_attention_equals_sdpa(B, H, KV, S, D, masked):
    g = torch.Generator().manual_seed(S * D + B)
    q = torch.randn(B, H, 1, D, generator=g)
    cache_k, cache_v = torch.randn(2, B, KV, S + 7, D, generator=g)  # a cache longer than what is valid
    k, v = cache_k[:, :, :S], cache_v[:, :, :S]  # strided views, as the KV cache hands them out
    mask = None
    if masked:  # per row, as the batched engine's slots give it; every row sees at least one key
        mask = torch.rand(B, 1, 1, S, generator=g) > 0.4
        mask[..., 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=H != KV)
    got = attend_one(q, k, v, mask, None)
    assert got.shape == ref.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(attend_one(q, k, v, mask, 0.3),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=H != KV),
                               rtol=1e-5, atol=2e-6)


def test_large_scores_do_not_overflow_the_softmax():
    q = torch.full((1, 2, 1, 64), 30.0)
    k = torch.randn(1, 2, 40, 64) * 5
    v = torch.randn(1, 2, 40, 64)
    got = attend_one(q, k, v, None, None)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v), rtol=1e-4, atol=1e-5)


def test_a_bfloat16_cache_takes_sdpa():
    q, k, v = (torch.randn(1, 4, n, 64).bfloat16() for n in (1, 20, 20))
    torch.testing.assert_close(attend_one(q, k, v, None, None), F.scaled_dot_product_attention(q, k, v))
