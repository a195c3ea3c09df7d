"""Generation with a scripted model: streaming text, stop strings, end tokens, limits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny import tokenizer_json

from llmcli.cache.static import StaticKVCache
from llmcli.decode.generate import generate
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.errors import PromptTooLongError
from llmcli.formats.tokenizer import from_hf_folder

GREEDY = SamplingParams(temperature=0)


class ScriptedModel(torch.nn.Module):
    """Emits `script` token by token whatever the input (greedy), like a real model's forward."""

    def __init__(self, script: list[int], vocab: int):
        super().__init__()
        self.script, self.vocab = script, vocab
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.prompt_len = None
        self.calls = []

    def forward(self, tokens, cache, positions=None, last_only=False, hidden=False):
        T = tokens.shape[1]
        self.calls.append(T)
        step = cache.length + T - self.prompt_len  # how many script tokens were produced so far
        cache.length += T
        logits = torch.full((1, 1 if last_only else T, self.vocab), -10.0)
        logits[0, -1, self.script[max(0, min(step, len(self.script) - 1))]] = 10.0
        return (logits, torch.zeros(logits.shape[:-1] + (4,))) if hidden else logits


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    (folder / "tokenizer.json").write_text(tokenizer_json())
    return from_hf_folder(folder, {"eos_token_id": 2})


def run(tok, script, stop=(), max_tokens=None, ctx=64, prompt="Hello"):
    model = ScriptedModel(script, tok.vocab_size)
    model.prompt_len = len(tok.encode(prompt))
    cache = StaticKVCache(1, 1, 1, ctx, torch.device("cpu"), torch.float32)
    chunks = list(generate(model, tok, tok.encode(prompt), Request(GREEDY, max_tokens=max_tokens, stop=stop), cache))
    return chunks, model


def ids_of(tok, text):
    return tok.encode(text)


def test_multibyte_character_split_across_tokens_comes_out_whole(tok):
    ids = ids_of(tok, "ok 🚀!")
    pieces = [tok.backend.id_to_token(i) for i in ids]
    assert len(ids) >= 5, pieces  # the emoji is several byte tokens in this vocabulary
    chunks, _ = run(tok, ids + [2])
    texts = [c.text for c in chunks]
    assert "".join(texts) == "ok 🚀!"
    assert all("\ufffd" not in t for t in texts)
    assert any(t.endswith("🚀") for t in texts)
    assert chunks[-1].finish_reason == "stop"


def test_stop_string_split_across_tokens_is_not_printed(tok):
    script = ids_of(tok, "The capital is Paris. STOP here") + [2]
    chunks, model = run(tok, script, stop=("is Par",))
    assert "".join(c.text for c in chunks) == "The capital "
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].stats.completion_tokens < len(script) - 2  # stopped early, not at the end


def test_partial_stop_that_does_not_complete_is_released(tok):
    chunks, _ = run(tok, ids_of(tok, "is Pa and more") + [2], stop=("is Par",))
    assert "".join(c.text for c in chunks) == "is Pa and more"


def test_eos_token_stops_and_is_not_printed(tok):
    chunks, _ = run(tok, ids_of(tok, "Paris") + [2] + ids_of(tok, "never"))
    assert "".join(c.text for c in chunks) == "Paris"
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].stats.completion_tokens == len(ids_of(tok, "Paris")) + 1


def test_max_tokens_gives_length(tok):
    chunks, model = run(tok, ids_of(tok, "one two three four five six"), max_tokens=3)
    last = chunks[-1]
    assert last.finish_reason == "length" and last.stats.completion_tokens == 3
    assert last.stopped_by == "max_tokens"
    assert sum(1 for c in chunks if c.tokens) == 3
    assert model.calls[1:] == [1, 1]  # one token per decode step; no forward after the last token


def test_output_limited_by_context(tok):
    prompt = "Hello"
    n = len(tok.encode(prompt))
    chunks, _ = run(tok, ids_of(tok, "one two three four five six seven eight"), ctx=n + 4)
    assert chunks[-1].finish_reason == "length" and chunks[-1].stats.completion_tokens == 4
    assert chunks[-1].stopped_by == "context"  # the last chunk says which limit it was (issue 21)
    chunks, _ = run(tok, ids_of(tok, "one two three four five six seven eight"), ctx=n + 4, max_tokens=10)
    assert chunks[-1].stopped_by == "context" and chunks[-1].stats.completion_tokens == 4
    chunks, _ = run(tok, ids_of(tok, "one two three four five six seven eight"), ctx=n + 4, max_tokens=4)
    assert chunks[-1].stopped_by == "max_tokens"  # both at once: -n was met
    chunks, _ = run(tok, ids_of(tok, "one") + [2], ctx=n + 4)
    assert chunks[-1].finish_reason == "stop" and chunks[-1].stopped_by is None


def test_prompt_longer_than_context_is_an_error(tok):
    with pytest.raises(PromptTooLongError, match="raise --ctx-size"):
        run(tok, [5], ctx=3, prompt="a much longer prompt than three tokens")


def test_long_prompt_is_prefilled_in_chunks(tok, monkeypatch):
    import llmcli.decode.prefill as g

    monkeypatch.setattr(g, "PREFILL_CHUNK", 4)
    chunks, model = run(tok, ids_of(tok, "ok") + [2], prompt="a prompt of quite a few tokens here")
    n = len(tok.encode("a prompt of quite a few tokens here"))
    assert model.calls[: -(len(ids_of(tok, "ok")))] == [4] * (n // 4) + ([n % 4] if n % 4 else [])


def test_stats_are_filled(tok):
    chunks, _ = run(tok, ids_of(tok, "abc def") + [2])
    s = chunks[-1].stats
    assert s.prompt_tokens == len(tok.encode("Hello")) and s.completion_tokens >= 2
    assert s.ttft_s > 0 and s.prefill_tps > 0
    json.dumps(s.as_dict())


def test_greedy_rescores_a_tie_made_by_half_precision_rounding():
    """Exact logits 20.03125 < 20.0625 both round to 20.0 in bfloat16; argmax of the rounded ones
    would take the first, the rescored ones the right one. Far apart logits are left alone."""
    from llmcli.decode.picker import rescore_near_ties
    from llmcli.models.linear import Linear

    head = Linear(4, 3, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[5, 5, 5, 5.03125], [5, 5, 5, 5.0625], [1, 1, 1, 1]]))
    h = torch.ones(4, dtype=torch.bfloat16)
    with torch.no_grad():  # as under generate's inference mode
        rounded = head(h).float()
    assert rounded[0] == rounded[1] == 20.0 and int(rounded.argmax()) == 0
    rescored = rescore_near_ties(head, rounded, h)
    assert rescored[:2].tolist() == [20.03125, 20.0625] and int(rescored.argmax()) == 1
    apart = torch.tensor([20.0, 10.0, 0.0])
    assert rescore_near_ties(head, apart, h) is apart  # a clear winner: nothing recomputed


def test_quantized_heads_read_back_their_rows(smollm2_gguf):
    """The real model's Q8_0 output head (shared with the embedding) gives its dequantized rows."""
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    head = load_model(smollm2_gguf, place("cpu", "bfloat16", threads=1)).model.lm_head
    ids = torch.tensor([0, 17, 49151])
    assert torch.equal(head.weight_rows(ids, torch.float32), head.dequantize(torch.float32)[ids])


def test_a_quantized_head_rescores_its_rows_in_one_call(smollm2_gguf):
    """A near tie's candidates from the real model's Q8_0 head: out[ids] = its dequantized rows . h,
    summed in float64 (one C call where weight_rows and a product took ~130 us in place); the other
    logits untouched; an id outside the head refused."""
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    head = load_model(smollm2_gguf, place("cpu", "float32", threads=1)).model.lm_head
    ids = torch.tensor([0, 17, 49151, 500])
    h = torch.randn(576, generator=torch.Generator().manual_seed(4))
    out = torch.full((49152,), -1.0)
    assert head.weight_dot_into(ids, h, out)
    want = head.dequantize(torch.float32)[ids].double() @ h.double()
    np.testing.assert_allclose(out[ids].double().numpy(), want.numpy(), rtol=1e-6)
    out[ids] = -1.0
    assert torch.equal(out, torch.full((49152,), -1.0))
    with pytest.raises(ValueError, match="outside"):
        head.weight_dot_into(torch.tensor([49152]), h, out)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0), SamplingParams(top_k=1),
                                    SamplingParams(temperature=1.5, top_k=1, seed=7)])
def test_top_k_1_is_greedy_and_rescores_near_ties(params):
    """--top-k 1 picks the most likely token whatever the temperature, so it rescores a bfloat16
    tie as --temp 0 does (issue 21: only the temp-0 path did)."""
    from llmcli.decode.picker import Picker
    from llmcli.models.linear import Linear

    head = Linear(4, 3, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[5, 5, 5, 5.03125], [5, 5, 5, 5.0625], [1, 1, 1, 1]]))
        h = torch.ones(4, dtype=torch.bfloat16)
        rounded = head(h).float()
    picker = Picker(params, [0], torch.device("cpu"), head=head)
    assert params.greedy and picker.wants_hidden
    assert picker.pick(rounded, h) == 1


@pytest.mark.parametrize("params", [SamplingParams(temperature=0), SamplingParams(temperature=1.5, top_k=1, seed=3),
                                    SamplingParams(seed=7), SamplingParams(top_k=5, top_p=0.5, min_p=0.2, seed=11),
                                    SamplingParams(seed=5, repeat_penalty=1.3)])
def test_a_pick_from_the_steps_largest_logits_is_the_pick_from_all_of_them(params):
    """The native step finds each row's largest logits as it makes them (Picker.wants_top of them);
    a pick given those is the pick without them: greedy (with bfloat16 near ties rescored), the
    default sampler's draws (same seed), NaN and inf logits, and no top taken with penalties on."""
    from llmcli import native
    from llmcli.decode.picker import Picker
    from llmcli.models.linear import Linear

    V, H = 300, 16
    head = Linear(H, V, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=torch.Generator().manual_seed(0)))
        head.weight[7] = head.weight[200] = 1.0
        head.weight[200, -1] = 1.03125  # rounds to a tie with row 7 in bfloat16, and is larger
    alone, given = (Picker(params, [1, 2], torch.device("cpu"), head=head) for _ in range(2))
    k = given.wants_top
    assert k == (0 if params.repeat_penalty != 1.0 else 8 if params.greedy else params.top_k)
    gen = torch.Generator().manual_seed(1)
    for trial in range(60):
        h = (torch.randn(H, generator=gen) * 3).to(torch.bfloat16) if trial % 3 else torch.full((H,), 20.0).to(torch.bfloat16)
        with torch.no_grad():
            logits = head(h).float()
        if trial % 10 == 4:
            logits[[3, 50]] = float("-inf")
        if trial % 10 == 5:
            logits[40] = float("inf")
        if trial % 10 == 6:
            logits[90] = float("nan")
        want = alone.pick(logits.clone(), h)
        top = None
        if k:
            values, indices = native.top_k(logits, k)
            top = (values.tolist(), indices.tolist())
        assert given.pick(logits.clone(), h, top) == want, trial
        if trial % 3 == 0 and params.greedy:
            assert want == 200  # the near tie, rescored
