"""generate() for the torch-free CPU path: the same prompt reuse, prefill, picks and text as
generate.py's token_stream and Picker, on numpy logits from runtime/lean_step.py's model.

    for chunk in generate_lean(model, tokenizer, prompt_ids, request, cache): ...

It takes the plain requests (sampling, max_tokens, stop strings, end tokens); a grammar, tools,
logprobs, beams, guesses or a context shift need the torch path (`takes()` says which).
"""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from ..cache import reuse_prefix
from ..formats.tokenizer import Tokenizer
from .request import Request
from .sampling_plain import RESCORED, SamplingParams, largest, make_rng, near_tie, sample_array, wanted_top
from .stream import Generation, Stats, limit_reason, output_limit, text_stream

def takes(request: Request) -> bool:
    """Whether this path generates what `request` asks (else the torch path does)."""
    return (request.grammar is None and not request.tools and request.logprobs is None and request.beams == 1
            and request.guesses is None and not request.context_shift)


def token_stream(model, prompt: list[int], cache, params: SamplingParams, max_new: int, stats: Stats,
                 reasoning=None) -> Iterator[int]:
    """Up to `max_new` token ids after `prompt`, reusing what the cache holds of it; where
    `reasoning` (reasoning.Reasoning) forces a token (its budget closing the thinking), that one."""
    rng, stats.seed = make_rng(params.seed)
    t0 = time.perf_counter()
    reuse = stats.cached_tokens = reuse_prefix(cache, prompt)
    rest, top = prompt[reuse:], wanted_top(params)
    logits, h, found = model.prefill(rest, cache, top)
    cache.token_ids.extend(rest)
    history = list(prompt)
    for i in range(max_new):
        forced = reasoning.forced() if reasoning is not None else None
        token = forced if forced is not None else _pick(model, logits[0], h[0], found, params, history, rng)
        history.append(token)
        now = time.perf_counter()
        if stats.completion_tokens == 0:
            stats.ttft_s = stats.prefill_s = now - t0
        else:
            stats.decode_s = now - t0 - stats.prefill_s
        stats.completion_tokens += 1
        yield token
        if i + 1 < max_new:
            logits, h, found = model([token], cache, top=top)
            cache.token_ids.append(token)


def _pick(model, logits: np.ndarray, h: np.ndarray, found, params: SamplingParams, history: list[int], rng) -> int:
    """Picker.pick's choice: near-tied greedy candidates rescored exactly first (picker.rescore_near_ties)."""
    top = None if found is None else (found[0][0].tolist(), found[1][0].tolist())
    if params.greedy:
        k = min(RESCORED, logits.shape[-1])
        if top is None or len(top[1]) < k:
            top = largest(logits, k)
        if len(top[1]) < 2 or near_tie(top[0][0], top[0][1]):
            model.rescore(logits, h, top[1][:k])
            top = None
    return sample_array(logits, history, params, rng, top)


def generate_lean(model, tokenizer: Tokenizer, prompt: list[int], request: Request, cache,
                  reasoning=None) -> Generation:
    """generate.generate's chunks for a request this path takes; `reasoning` (reasoning.Reasoning,
    one per sequence) splits a reasoning model's thinking off and keeps its budget."""
    if not prompt:
        raise ValueError("empty prompt")
    if not takes(request):
        raise ValueError("this request needs the torch path")
    limit = output_limit(len(prompt), cache.max_len, request.max_tokens)
    stats = Stats(prompt_tokens=len(prompt))
    tokens = token_stream(model, prompt, cache, request.sampling, limit, stats, reasoning)
    chunks = text_stream(tokens, tokenizer, tuple(s for s in request.stop if s), prompt, stats,
                         limit_reason(limit, request.max_tokens), request.ignore_eos, reasoning)
    return Generation(chunks, None, None)
