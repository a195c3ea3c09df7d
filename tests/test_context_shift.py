"""Context shift: RoPE re-rotation, the cache's bookkeeping, and 3x the context on the real model."""

from __future__ import annotations

import pytest
import torch

from llmcli.cache.context_shift import ContextShift, prefix_length, rerotation
from llmcli.cache.static import StaticKVCache
from llmcli.decode.generate import Stats, prefill, token_stream
from llmcli.decode.sampling import SamplingParams
from llmcli.models.llama import ModelArgs, apply_rope, rope_cos_sin, rope_inv_freq
from llmcli.runtime.runtime import Runtime

CPU = torch.device("cpu")


@pytest.mark.parametrize("scaling", [None, {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}])
def test_rerotating_a_key_moves_it_to_the_new_position(scaling):
    args = ModelArgs(hidden_size=256, num_attention_heads=2, rope_theta=500000.0, rope_scaling=scaling)
    inv = rope_inv_freq(args)
    x = torch.randn(1, 2, 50, args.head_dim)
    positions = torch.arange(3000, 3050)
    at = apply_rope(x, *rope_cos_sin(inv, positions, torch.float32))
    moved = apply_rope(x, *rope_cos_sin(inv, positions - 2500, torch.float32))
    assert torch.allclose(rerotation(inv)(at, 2500), moved, atol=2e-3)  # float32 angles at 3000 rad
    assert torch.allclose(rerotation(inv)(at, 0), at)


def test_make_room_keeps_the_prefix_and_drops_half_of_the_rest():
    args = ModelArgs(hidden_size=64, num_attention_heads=2, num_hidden_layers=1)
    cache = StaticKVCache.for_model(args, 20, CPU, torch.float32)
    cache.k[0][:, :, :20] = torch.arange(20.0)[:, None]
    cache.v[0][:, :, :20] = torch.arange(20.0)[:, None]
    cache.length, cache.token_ids = 20, list(range(100, 120))
    shift = ContextShift(keep=4, inv_freq=torch.zeros(args.head_dim // 2))  # no rotation: values stay
    shift.make_room(cache)
    kept = [0, 1, 2, 3] + list(range(12, 20))
    assert cache.length == 12 and cache.token_ids == [100 + i for i in kept]
    assert cache.v[0][0, 0, :12, 0].tolist() == kept and cache.k[0][0, 0, :12, 0].tolist() == kept
    assert (shift.shifts, shift.dropped) == (1, 8)


@pytest.fixture(scope="module")
def model(smollm2_loaded):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield smollm2_loaded
    torch.set_num_threads(before)


def test_the_system_prompt_is_the_kept_prefix(model):
    rt = Runtime(model, 256)
    messages = [{"role": "system", "content": "You are a storyteller."}, {"role": "user", "content": "Go on."}]
    keep = prefix_length(rt.prompt_ids, messages)
    text = model.tokenizer.decode(rt.prompt_ids(messages)[:keep], skip_special=False)
    assert text.endswith("<|im_start|>user\n") and "You are a storyteller." in text


@pytest.mark.slow
def test_text_through_three_shifts_stays_coherent(model):
    """256 tokens through a 128-token context, three shifts or more: no error, no collapse into one
    repeated token, and after the last shift layer 0's keys are those a fresh prefill of the kept
    tokens computes."""
    ctx = 128
    rt = Runtime(model, ctx)
    messages = [{"role": "system", "content": "You are a storyteller who never stops."},
                {"role": "user", "content": "Tell a long story about a lighthouse keeper and the sea."}]
    prompt = rt.prompt_ids(messages)
    shift = rt.context_shift(messages)
    cache = rt.new_cache()
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, seed=3)
    tokens = list(token_stream(model.model, prompt, cache, params, 2 * ctx, CPU, Stats(), shift=shift))
    assert len(tokens) == 2 * ctx and cache.length <= ctx and shift.shifts >= 3
    assert cache.token_ids[:shift.keep] == prompt[:shift.keep] and len(cache.token_ids) == cache.length
    for i in range(0, len(tokens) - 127, 128):
        window = tokens[i:i + 128]
        assert len(set(window)) >= 24, model.tokenizer.decode(window)
        longest = max(len(run) for run in _runs(window))
        assert longest <= 8, model.tokenizer.decode(window)
    fresh = StaticKVCache.for_model(model.args, ctx, CPU, torch.float32)
    with torch.inference_mode():
        prefill(model.model, cache.token_ids, fresh, CPU)
    n = cache.length
    # values are not moved by position: as computed (one token at a time vs one prefill: rounding)
    assert torch.allclose(cache.v[0][:, :, :n], fresh.v[0][:, :, :n], atol=1e-5)
    assert torch.allclose(cache.k[0][:, :, :n], fresh.k[0][:, :, :n], atol=1e-3)


def _runs(xs):
    run = [xs[0]]
    for a, b in zip(xs, xs[1:]):
        if a == b:
            run.append(b)
        else:
            yield run
            run = [b]
    yield run
