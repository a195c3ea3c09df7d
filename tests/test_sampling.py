"""Sampling functions on hand-built logits."""

from __future__ import annotations

import math

import pytest
import torch

from llmcli.decode.sampling import (SamplingParams, apply_min_p, apply_penalties, apply_temperature, apply_top_k,
                                    apply_top_p, make_generator, parse_parameter, sample)
from llmcli.errors import InvalidParameterError

INF = float("-inf")


def kept(logits: torch.Tensor) -> list[int]:
    return sorted(torch.nonzero(torch.isfinite(logits)).flatten().tolist())


def logits_for(probs: list[float]) -> torch.Tensor:
    return torch.tensor([math.log(p) for p in probs])


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([0.5, 3.0, -1.0, 2.0, 2.5, 0.0])
    assert kept(apply_top_k(logits, 3)) == [1, 3, 4]
    assert kept(apply_top_k(logits, 1)) == [1]
    assert torch.equal(apply_top_k(logits, 0), logits)  # off
    assert torch.equal(apply_top_k(logits, 6), logits)
    assert apply_top_k(logits, 3)[1] == 3.0  # kept values unchanged


def test_top_p_keeps_smallest_set_reaching_p():
    logits = logits_for([0.5, 0.2, 0.15, 0.1, 0.05])
    assert kept(apply_top_p(logits, 0.5)) == [0]  # 0.5 alone reaches 0.5
    assert kept(apply_top_p(logits, 0.6)) == [0, 1]
    assert kept(apply_top_p(logits, 0.85)) == [0, 1, 2]
    assert kept(apply_top_p(logits, 0.86)) == [0, 1, 2, 3]
    assert kept(apply_top_p(logits, 1.0)) == [0, 1, 2, 3, 4]
    assert kept(apply_top_p(logits_for([0.9, 0.1]), 0.01)) == [0]  # at least one survives
    shuffled = logits_for([0.1, 0.5, 0.05, 0.2, 0.15])  # order in the vocab does not matter
    assert kept(apply_top_p(shuffled, 0.6)) == [1, 3]


def test_min_p_keeps_tokens_above_fraction_of_top():
    logits = logits_for([0.4, 0.3, 0.2, 0.06, 0.04])
    assert kept(apply_min_p(logits, 0.5)) == [0, 1, 2]  # threshold 0.2
    assert kept(apply_min_p(logits, 0.15)) == [0, 1, 2, 3]  # threshold 0.06
    assert kept(apply_min_p(logits, 0.0)) == [0, 1, 2, 3, 4]


def test_repeat_penalty_changes_exactly_the_seen_logits():
    logits = torch.tensor([2.0, -2.0, 1.0, -1.0, 0.5])
    history = torch.tensor([0, 1, 1, 4])
    out = apply_penalties(logits, history, SamplingParams(repeat_penalty=2.0))
    assert out.tolist() == [1.0, -4.0, 1.0, -1.0, 0.25]


def test_repeat_last_n_limits_the_window():
    logits = torch.tensor([2.0, 2.0, 2.0])
    history = torch.tensor([0, 1, 2])
    out = apply_penalties(logits, history, SamplingParams(repeat_penalty=2.0, repeat_last_n=2))
    assert out.tolist() == [2.0, 1.0, 1.0]
    assert torch.equal(apply_penalties(logits, history, SamplingParams(repeat_penalty=2.0, repeat_last_n=0)), logits)


def test_presence_and_frequency_penalties():
    logits = torch.zeros(4)
    history = torch.tensor([1, 1, 1, 3])
    out = apply_penalties(logits, history, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25))
    assert out.tolist() == [0.0, -0.5 - 0.75, 0.0, -0.5 - 0.25]


def test_temperature_zero_is_argmax_after_penalties():
    logits = torch.tensor([1.0, 3.0, 2.0])
    gen, _ = make_generator(0, torch.device("cpu"))
    assert sample(logits, torch.tensor([], dtype=torch.long), SamplingParams(temperature=0), gen) == 1
    assert sample(logits, torch.tensor([1]), SamplingParams(temperature=0, repeat_penalty=4.0), gen) == 2


def test_temperature_scales():
    assert apply_temperature(torch.tensor([1.0, 2.0]), 0.5).tolist() == [2.0, 4.0]


def test_sampling_respects_filters_and_seed():
    logits = torch.randn(1000)
    params = SamplingParams(temperature=1.5, top_k=5, top_p=1.0, min_p=0.0, seed=42)
    allowed = set(logits.topk(5).indices.tolist())

    def draws(seed):
        gen, used = make_generator(seed, torch.device("cpu"))
        assert used == seed
        return [sample(logits, torch.empty(0, dtype=torch.long), params, gen) for _ in range(200)]

    first = draws(42)
    assert set(first) <= allowed and len(set(first)) > 1  # sampled, not greedy
    assert draws(42) == first  # same seed, same tokens
    assert draws(43) != first


def test_the_draw_among_the_top_k_is_the_torch_chains():
    """sample() draws among the top k in plain floats (draw_from_top): the token the chain of torch
    ops on those k logits (top-p, min-p, temperature, draw) gives with the same seed, over sharp and
    flat distributions and each filter on or off; and the generator moves on alike."""
    from llmcli.decode.sampling import apply_top_p, draw, draw_from_top

    g = torch.Generator().manual_seed(0)
    settings = [(t, k, p, m) for t in (0.3, 0.8, 1.5) for k in (5, 40) for p in (0.5, 0.95, 1.0) for m in (0.0, 0.05, 0.3)]
    for trial in range(400):
        t, k, p, m = settings[trial % len(settings)]
        logits = torch.randn(3000, generator=g) * (0.5 + 6 * float(torch.rand(1, generator=g)))
        params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m, seed=trial)
        fast, _ = make_generator(trial, torch.device("cpu"))
        slow, _ = make_generator(trial, torch.device("cpu"))
        got = sample(logits, torch.empty(0, dtype=torch.long), params, fast)
        values, idx = logits.topk(k)
        want = int(idx[draw(apply_temperature(apply_min_p(apply_top_p(values, p), m), t), slow)])
        assert got == want, (trial, params)
        assert torch.equal(torch.rand(3, generator=fast), torch.rand(3, generator=slow))
    # masked logits among the k (a grammar's -inf), and a zero noise: never a masked token
    values = [2.0, 1.0, float("-inf"), float("-inf")]
    assert draw_from_top(values, [1.0, 1e-30, 0.0, 1.0], SamplingParams(top_k=4, top_p=1.0, min_p=0.0)) == 1


def test_sampling_distribution_follows_probabilities():
    logits = logits_for([0.7, 0.2, 0.1])
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    gen, _ = make_generator(0, torch.device("cpu"))
    counts = torch.bincount(torch.tensor([sample(logits, torch.empty(0, dtype=torch.long), params, gen)
                                          for _ in range(4000)]), minlength=3) / 4000
    assert torch.allclose(counts, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)


def test_random_seed_is_reported():
    _, seed = make_generator(-1, torch.device("cpu"))
    assert seed >= 0


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1),
                                 dict(min_p=1.0), dict(repeat_penalty=0.0), dict(repeat_last_n=-2)])
def test_invalid_parameters_are_refused(bad):
    with pytest.raises(InvalidParameterError):
        SamplingParams(**bad)


def test_parse_parameter():
    p = parse_parameter(SamplingParams(), "top_k", "20")
    assert p.top_k == 20
    assert parse_parameter(p, "temperature", "0.1").temperature == 0.1
    assert parse_parameter(p, "repeat-penalty", "1.1").repeat_penalty == 1.1
    with pytest.raises(InvalidParameterError, match="unknown parameter"):
        parse_parameter(p, "nope", "1")
    with pytest.raises(InvalidParameterError, match="whole number"):
        parse_parameter(p, "top_k", "2.5")
    with pytest.raises(InvalidParameterError, match="top-p"):
        parse_parameter(p, "top_p", "2")


def test_numpy_s_chain_keeps_what_torch_s_keeps_and_penalizes_alike():
    """sampling_plain (the torch-free path's) against sampling's torch functions, on random logits."""
    import numpy as np

    from llmcli.decode import sampling, sampling_plain

    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        logits = torch.randn(500, generator=gen) * (1 + trial % 4)
        x = logits.numpy().astype(np.float64)
        for p in (0.1, 0.5, 0.9, 0.99):
            want = torch.isfinite(sampling.apply_top_p(logits, p)).numpy()
            assert np.array_equal(np.isfinite(sampling_plain._top_p(x, p)), want)
            want = torch.isfinite(sampling.apply_min_p(logits, p / 2)).numpy()
            assert np.array_equal(np.isfinite(sampling_plain._min_p(x, p / 2)), want)
        history = torch.randint(0, 500, (40,), generator=gen)
        params = SamplingParams(repeat_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2, repeat_last_n=30)
        want = sampling.apply_penalties(logits, history, params).numpy()
        got = sampling_plain.apply_penalties(logits.numpy(), history.tolist(), params)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_numpy_s_draws_follow_the_distribution_and_repeat_with_the_seed():
    import numpy as np

    from llmcli.decode.sampling_plain import make_rng, sample_array

    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    for params in (SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
                   SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)):
        rng, seed = make_rng(5)
        counts = np.bincount([sample_array(logits, [], params, rng) for _ in range(4000)], minlength=4) / 4000
        want = np.array([0.5, 0.3, 0.15, 0.05]) if params.top_k == 0 else np.array([0.5, 0.3, 0.15, 0]) / 0.95
        assert np.abs(counts - want).max() < 0.03, counts
        runs = []
        for _ in range(2):
            rng = make_rng(11)[0]
            runs.append([sample_array(logits, [], params, rng) for _ in range(50)])
        assert runs[0] == runs[1] and len(set(runs[0])) > 1
    assert sample_array(logits, [], SamplingParams(temperature=0), make_rng(1)[0]) == 0
