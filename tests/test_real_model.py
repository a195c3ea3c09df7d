"""The real SmolLM2-135M-Instruct (GGUF from PyPI) against transformers reading the same file."""

from __future__ import annotations

import pytest
import torch

from test_embeddings import SENTENCES, TEXTS

from llmcli.decode.generate import generate
from llmcli.decode.sampling import SamplingParams
from llmcli.runtime.runtime import Runtime, open_model

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "List three prime numbers and explain why they are prime."}],
]


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    """transformers' own GGUF reader, dequantized to float32: the reference implementation."""
    transformers = pytest.importorskip("transformers")
    folder, name = str(smollm2_gguf.parent), smollm2_gguf.name
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return tok, model


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_chat_template_and_greedy_output_match_transformers(smollm2_loaded, reference, index):
    hf_tok, hf_model = reference
    messages = PROMPTS[index]
    rt = Runtime(smollm2_loaded, 2048)
    expected_text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected_ids = hf_tok(expected_text, add_special_tokens=False).input_ids
    ids = rt.prompt_ids(messages)
    assert smollm2_loaded.tokenizer.decode(ids, skip_special=False) == expected_text
    assert ids == expected_ids

    with torch.no_grad():
        out = hf_model.generate(torch.tensor([expected_ids]), max_new_tokens=64, do_sample=False)
    expected = out[0, len(expected_ids):].tolist()
    chunks = list(generate(smollm2_loaded.model, smollm2_loaded.tokenizer, ids, SamplingParams(temperature=0),
                           rt.new_cache(), max_tokens=64))
    ours = [t for c in chunks for t in c.tokens]
    assert ours == expected
    assert "".join(c.text for c in chunks) == hf_tok.decode(expected, skip_special_tokens=True)
    if index == 0:
        assert "Paris" in "".join(c.text for c in chunks)


@pytest.mark.slow
def test_smollm2_last_token_matches_transformers(smollm2_gguf, reference):
    """`embed --pooling last` of a causal model: the last token's final hidden state, as transformers
    computes it (here, beside the greedy tests: transformers reads the file once for both)."""
    rt = open_model(str(smollm2_gguf), quant="f32", dtype="float32", ctx_size=512)
    e = rt.embedder("last", normalize=False)
    ids = [e.ids(t) for t in SENTENCES + TEXTS]
    with torch.no_grad():
        want = torch.stack([reference[1].model(torch.tensor([i])).last_hidden_state[0, -1] for i in ids])
    got = e.embed(ids)
    assert (got - want).abs().max() < 1e-4, (got - want).abs().max()
