"""llmcli's model against transformers (the reference) on tiny random models, in float32."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB, hf_model, reference_from, save_hf, write_gguf

from llmcli.cache.static import StaticKVCache
from llmcli.quant.presets import load_preset
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model

CPU32 = place("cpu", "float32")

# Phi-4-mini's shape of RoPE: LongRoPE (short factors up to 32 positions, long beyond) on half of each head
PHI3_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                 "original_max_position_embeddings": 32, "short_factor": [1.0, 1.5, 2.0, 3.0],
                 "long_factor": [2.0, 4.0, 8.0, 16.0]}

VARIANTS = {
    "llama-gqa-untied": ("llama", {}),
    "llama-mha-tied": ("llama", {"num_key_value_heads": 4, "tie_word_embeddings": True}),
    "llama-head-dim-32": ("llama", {"head_dim": 32}),
    "llama-attention-bias": ("llama", {"attention_bias": True}),
    "llama3-rope-scaling": ("llama", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}),
    "llama-linear-rope": ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    "mistral-sliding-window": ("mistral", {"sliding_window": 8}),
    "mistral-no-window": ("mistral", {}),
    "qwen2-bias": ("qwen2", {"tie_word_embeddings": True}),
    "qwen2-mha": ("qwen2", {"num_key_value_heads": 4}),
    "qwen3-qk-norm": ("qwen3", {}),
    "qwen3-tied-head-dim-32": ("qwen3", {"tie_word_embeddings": True, "head_dim": 32}),
    "phi3": ("phi3", {}),
    "phi3-longrope-partial": ("phi3", {"rope_parameters": PHI3_LONGROPE, "original_max_position_embeddings": 32}),
    "phi3-sliding-window": ("phi3", {"sliding_window": 8}),
    "gemma3": ("gemma3_text", {}),
    "gemma3-final-softcap": ("gemma3_text", {"final_logit_softcapping": 3.0}),
    "gemma3-global-rope-scaling": ("gemma3_text", {"rope_parameters": {
        "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 8.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20_000.0}}}),
}


def _tokens(n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, n), generator=g)


def _ref_logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits[0].float()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_transformers(tmp_path, variant):
    model_type, overrides = VARIANTS[variant]
    ref = hf_model(model_type, **overrides)
    loaded = load_model(save_hf(ref, tmp_path / variant), CPU32)
    tokens = _tokens(40)
    cache = StaticKVCache.for_model(loaded.args, 64, CPU32.device, torch.float32)
    with torch.no_grad():
        ours = loaded.model(tokens, cache)[0]
    expected = _ref_logits(ref, tokens)
    assert expected.abs().max() > 0.5  # the comparison is not between near-zero numbers
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", ["llama-gqa-untied", "mistral-sliding-window", "qwen2-bias", "qwen3-qk-norm",
                                     "phi3-longrope-partial", "gemma3"])
def test_cached_decoding_matches_full_forward(tmp_path, variant):
    """Prefill a prefix, then one token per step (and a chunk): same logits as one full pass."""
    model_type, overrides = VARIANTS[variant]
    loaded = load_model(save_hf(hf_model(model_type, **overrides), tmp_path / variant), CPU32)
    tokens = _tokens(30)
    with torch.no_grad():
        full = loaded.model(tokens, StaticKVCache.for_model(loaded.args, 64, CPU32.device, torch.float32))[0]
        cache = StaticKVCache.for_model(loaded.args, 64, CPU32.device, torch.float32)
        steps = [loaded.model(tokens[:, :10], cache)[0]]
        steps.append(loaded.model(tokens[:, 10:17], cache)[0])  # a chunk after a prefix (masked path)
        for i in range(17, 30):
            steps.append(loaded.model(tokens[:, i:i + 1], cache)[0])
    assert cache.length == 30
    tol = 5e-5 if model_type == "gemma3_text" else 1e-5  # gemma3's scaled embeddings and (1 + w) norms: larger sums
    torch.testing.assert_close(torch.cat(steps), full, atol=tol, rtol=tol)


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_gguf_matches_reference(tmp_path, qtype, model_type):
    """A GGUF written like llama.cpp's converter loads to what its tensors dequantize to."""
    ref = hf_model(model_type)
    held = write_gguf(ref, tmp_path / "tiny.gguf", qtype)
    loaded = load_model(tmp_path / "tiny.gguf", CPU32, load_preset("f32"))  # dequantized: the reference mode
    assert loaded.args.num_key_value_heads == 2 and loaded.args.tie_word_embeddings is False
    tokens = _tokens(24)
    with torch.no_grad():
        ours = loaded.model(tokens, StaticKVCache.for_model(loaded.args, 32, CPU32.device, torch.float32))[0]
    torch.testing.assert_close(ours, _ref_logits(reference_from(ref, held), tokens), atol=1e-4, rtol=1e-4)
    if qtype == "F32":  # lossless: also equal to the original model
        torch.testing.assert_close(ours, _ref_logits(ref, tokens), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
@pytest.mark.parametrize("variant", ["qwen3-qk-norm", "phi3", "phi3-longrope-partial", "gemma3", "gemma3-final-softcap"])
def test_gguf_new_architectures_match_reference(tmp_path, qtype, variant):
    """qwen3 / phi3 / gemma3 GGUFs as llama.cpp's converter writes them (unpermuted Q/K, phi3's fused
    attn_qkv and ffn_up, LongRoPE factor tensors, gemma3's norms stored as 1 + w) load to the reference."""
    model_type, overrides = VARIANTS[variant]
    if model_type == "gemma3_text":  # GGUF has no key for it: llama.cpp scales by head_dim (but for the 27B)
        overrides = {**overrides, "query_pre_attn_scalar": 32}
    ref = hf_model(model_type, **overrides)
    held = write_gguf(ref, tmp_path / "tiny.gguf", qtype)
    loaded = load_model(tmp_path / "tiny.gguf", CPU32)
    assert loaded.args.model_type == model_type
    tokens = _tokens(40)
    with torch.no_grad():
        ours = loaded.model(tokens, StaticKVCache.for_model(loaded.args, 64, CPU32.device, torch.float32))[0]
    torch.testing.assert_close(ours, _ref_logits(reference_from(ref, held), tokens), atol=1e-4, rtol=1e-4)
    if qtype == "F32":
        torch.testing.assert_close(ours, _ref_logits(ref, tokens), atol=1e-4, rtol=1e-4)


def test_phi3_short_factors_while_the_context_fits(tmp_path):
    """LongRoPE takes its short factors when the cache fits the original context (32 here): the
    same logits as transformers on a sequence within it."""
    ref = hf_model("phi3", rope_parameters=PHI3_LONGROPE, original_max_position_embeddings=32)
    loaded = load_model(save_hf(ref, tmp_path / "phi3"), CPU32)
    tokens = _tokens(24)
    with torch.no_grad():
        ours = loaded.model(tokens, StaticKVCache.for_model(loaded.args, 32, CPU32.device, torch.float32))[0]
        long = loaded.model(tokens, StaticKVCache.for_model(loaded.args, 64, CPU32.device, torch.float32))[0]
    torch.testing.assert_close(ours, _ref_logits(ref, tokens), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(long, ours, atol=1e-3)  # the long factors do change the result


def test_gguf_tied_embeddings_and_tokenizer(tmp_path):
    ref = hf_model("llama", tie_word_embeddings=True)
    write_gguf(ref, tmp_path / "tied.gguf", "F32")
    loaded = load_model(tmp_path / "tied.gguf", CPU32)
    assert loaded.args.tie_word_embeddings
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight
    hf_tok = load_model(save_hf(ref, tmp_path / "hf"), CPU32).tokenizer
    text = "<|im_start|>user\nHello world! héllo 12345 🙂<|im_end|>\n"
    assert loaded.tokenizer.encode(text) == hf_tok.encode(text)
    assert loaded.tokenizer.encode("<|im_start|>")== [1]
    assert 2 in loaded.tokenizer.eos_ids


def test_qk_permutation_round_trips():
    from llmcli.formats.gguf import permute_rows, unpermute_rows

    w = torch.randn(12 * 8, 5)
    assert torch.equal(unpermute_rows(permute_rows(w, 12), 12), w)
    assert not torch.equal(permute_rows(w, 12), w)
    # one head of 4 rows: HF halves [a0 a1 | b0 b1] become interleaved pairs [a0 b0 a1 b1]
    rows = torch.arange(4.0)[:, None]
    assert permute_rows(rows, 1).flatten().tolist() == [0.0, 2.0, 1.0, 3.0]


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q4_1"])
def test_header_parser_agrees_with_gguf_reader(tmp_path, qtype):
    """Our fast header parser yields what the gguf package's own reader does."""
    import numpy as np
    from gguf import GGUFReader

    from llmcli.formats.gguf import open_gguf

    path = tmp_path / "t.gguf"
    write_gguf(hf_model("llama"), path, qtype)
    ours, theirs = open_gguf(path), GGUFReader(str(path))
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert (a.tensor_type, a.data_offset, a.n_bytes) == (b.tensor_type, b.data_offset, b.n_bytes)
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data)
    for key, field in theirs.fields.items():
        if not key.startswith("GGUF."):
            assert ours.metadata[key] == pytest.approx(field.contents()), key


@pytest.mark.parametrize("variant", ["llama-gqa-untied", "llama-attention-bias", "qwen2-bias", "mistral-sliding-window",
                                     "qwen3-qk-norm", "phi3", "gemma3"])
def test_fused_projections_give_the_same_logits(tmp_path, variant):
    model_type, overrides = VARIANTS[variant]
    loaded = load_model(save_hf(hf_model(model_type, **overrides), tmp_path / variant), CPU32)
    tokens = _tokens(20)
    new_cache = lambda: StaticKVCache.for_model(loaded.args, 32, CPU32.device, torch.float32)  # noqa: E731
    with torch.no_grad():
        before = loaded.model(tokens, new_cache())[0]
        loaded.model.fuse()
        assert hasattr(loaded.model.model.layers[0].self_attn, "qkv_proj")
        assert not hasattr(loaded.model.model.layers[0].mlp, "gate_proj")
        cache = new_cache()
        after = torch.cat([loaded.model(tokens[:, :12], cache)[0]] +
                          [loaded.model(tokens[:, i:i + 1], cache)[0] for i in range(12, 20)])
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
