"""Beam search against transformers' `generate(num_beams=N, do_sample=False)` on tiny random models."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB, hf_model, save_hf

from llmcli.decode.beam import beam_search
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model

CPU32 = place("cpu", "float32")
EOS = 2


def _pair(tmp_path, seed, eos_boost, **overrides):
    """(transformers model, llmcli model) with the same weights. With `eos_boost`, the end id's logit is
    about the top logit + eos_boost: random weights spread the probability evenly, and EOS would never win."""
    ref = hf_model("llama", seed=seed, **overrides)
    if eos_boost is not None:
        with torch.no_grad():
            out = ref(torch.randint(3, VOCAB, (4, 16), generator=torch.Generator().manual_seed(seed)),
                      output_hidden_states=True)
            h = out.hidden_states[-1].reshape(-1, out.hidden_states[-1].shape[-1]).mean(0)  # after the final norm
            target = out.logits.max(-1).values.mean() + eos_boost
            ref.lm_head.weight[EOS] = h * target / h.dot(h)  # (untied head: only the output row changes)
            if ref.config.tie_word_embeddings:
                raise ValueError("a tied head would change the embedding too")
    return ref, load_model(save_hf(ref, tmp_path / f"m{seed}"), CPU32).model


def _reference(ref, prompt, beams, max_new, length_penalty):
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), num_beams=beams, do_sample=False, max_new_tokens=max_new,
                           length_penalty=length_penalty, eos_token_id=EOS, pad_token_id=0,
                           return_dict_in_generate=True, output_scores=True)
    ids = out.sequences[0, len(prompt):].tolist()
    if EOS in ids:  # transformers pads shorter hypotheses with the end id
        ids = ids[: ids.index(EOS) + 1]
    return ids, float(out.sequences_scores[0])


CASES = [  # seed, eos boost, beams, max_new, length_penalty, overrides
    (0, None, 4, 12, 1.0, {"tie_word_embeddings": True}),
    (1, 0.0, 3, 16, 1.0, {}),  # the best hypothesis is the end id alone, and one of 7 tokens
    (2, -0.5, 4, 16, 0.0, {"num_key_value_heads": 4}),  # stops early: nothing running can win
    (3, 0.0, 2, 16, 2.0, {}),
    (4, 0.0, 5, 20, -1.0, {}),  # a negative penalty favours short hypotheses
]


@pytest.mark.parametrize("seed,boost,beams,max_new,lp,overrides", CASES)
def test_best_sequence_matches_transformers(tmp_path, one_thread, seed, boost, beams, max_new, lp, overrides):
    ref, model = _pair(tmp_path, seed, boost, **overrides)
    g = torch.Generator().manual_seed(seed)
    ended = 0
    for n in (3, 9):
        prompt = torch.randint(3, VOCAB, (n,), generator=g).tolist()
        expected, expected_score = _reference(ref, prompt, beams, max_new, lp)
        ids, score, steps, _ = beam_search(model, prompt, beams, max_new, {EOS}, CPU32.device, lp)
        assert ids == expected
        assert score == pytest.approx(expected_score, rel=1e-5, abs=1e-5)
        ended += ids[-1] == EOS
    if boost is not None:
        assert ended  # the cases with a likely end id do finish hypotheses on it


def test_one_beam_is_greedy(tmp_path, one_thread):
    _, model = _pair(tmp_path, 0, None)
    prompt = [5, 17, 99, 42]
    ids, _, _, _ = beam_search(model, prompt, 1, 10, {EOS}, CPU32.device)
    from llmcli.cache.static import StaticKVCache
    from llmcli.decode.generate import Stats, token_stream
    from llmcli.decode.sampling import SamplingParams

    cache = StaticKVCache.for_model(model.args, 32, CPU32.device, torch.float32)
    greedy = list(token_stream(model, prompt, cache, SamplingParams(temperature=0), 10, CPU32.device, Stats()))
    assert ids == greedy[: len(ids)]
