"""The real SmolLM2-135M-Instruct (GGUF from PyPI) against transformers reading the same file."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch
from conftest import SMOLLM2_SHA256
from references import kept
from test_embeddings import SENTENCES, TEXTS

from llmcli.decode.generate import generate
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.runtime.runtime import Runtime, open_model

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "List three prime numbers and explain why they are prime."}],
]


NEW_TOKENS = 64


@pytest.fixture(scope="module")
def reference(smollm2_gguf) -> dict:
    """transformers' own GGUF reader, dequantized to float32 (the reference implementation): per
    prompt its rendering, ids and greedy tokens; per text of test_embeddings the last token's final
    hidden state. Kept in tests/data (tests/references.py): reading the file takes transformers
    longer than these tests take."""
    def compute():
        transformers = pytest.importorskip("transformers")
        folder, name = str(smollm2_gguf.parent), smollm2_gguf.name
        tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
        answers = {"prompts": [], "texts": []}
        with torch.no_grad():
            for messages in PROMPTS:
                text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                ids = tok(text, add_special_tokens=False).input_ids
                out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
                tokens = out[0, len(ids):].tolist()
                answers["prompts"].append({"text": text, "ids": ids, "tokens": tokens,
                                           "reply": tok.decode(tokens, skip_special_tokens=True)})
            for ids in _embedding_ids(smollm2_gguf):  # llmcli's ids, checked against its tokenizer below
                state = model.model(torch.tensor([ids])).last_hidden_state[0, -1].numpy()
                answers["texts"].append({"ids": ids, "last_hidden": base64.b64encode(state.tobytes()).decode()})
        return answers

    key = {"file_sha256": SMOLLM2_SHA256, "prompts": PROMPTS, "texts": SENTENCES + TEXTS, "new_tokens": NEW_TOKENS}
    return kept("smollm2-reference", key, compute)


def _embedder(smollm2_gguf):
    return open_model(str(smollm2_gguf), quant="f32", dtype="float32", ctx_size=512).embedder("last", normalize=False)


def _embedding_ids(smollm2_gguf) -> list[list[int]]:
    e = _embedder(smollm2_gguf)
    return [e.ids(t) for t in SENTENCES + TEXTS]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_chat_template_and_greedy_output_match_transformers(smollm2_loaded, reference, index):
    expected = reference["prompts"][index]
    rt = Runtime(smollm2_loaded, 2048)
    ids = rt.prompt_ids(PROMPTS[index])
    assert smollm2_loaded.tokenizer.decode(ids, skip_special=False) == expected["text"]
    assert ids == expected["ids"]
    request = Request(SamplingParams(temperature=0), max_tokens=NEW_TOKENS)
    chunks = list(generate(smollm2_loaded.model, smollm2_loaded.tokenizer, ids, request, rt.new_cache()))
    ours = [t for c in chunks for t in c.tokens]
    assert ours == expected["tokens"]
    reply = "".join(c.text for c in chunks)
    assert reply == expected["reply"]
    if index == 0:
        assert "Paris" in reply


@pytest.mark.slow
def test_smollm2_last_token_matches_transformers(smollm2_gguf, reference):
    """`embed --pooling last` of a causal model: the last token's final hidden state, as transformers
    computes it."""
    e = _embedder(smollm2_gguf)
    ids = [e.ids(t) for t in SENTENCES + TEXTS]
    assert ids == [t["ids"] for t in reference["texts"]]
    want = torch.stack([torch.from_numpy(np.frombuffer(base64.b64decode(t["last_hidden"]), dtype=np.float32).copy())
                        for t in reference["texts"]])
    got = e.embed(ids)
    assert (got - want).abs().max() < 1e-4, (got - want).abs().max()
