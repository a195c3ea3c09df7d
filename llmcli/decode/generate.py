"""Generation as a stack of generators:

    token_stream   prefill the prompt (reusing what the cache already holds), then decode one token
                   per step and yield each id (or beam.py's / speculative.py's stream, as the request
                   asks)
    text_stream    ids -> text: end-of-sequence ids, stop strings (never printed, even when split
                   across tokens), whole UTF-8 characters only
    generate       the public entry: checks the prompt fits, picks the output limit, yields Chunk

    for chunk in generate(model, tokenizer, prompt_ids, request, cache, step): ...

The last chunk carries `finish_reason` ("stop" or "length") and the `Stats`; a "length" finish
also says which limit ended it, `stopped_by`: "max_tokens" (-n) or "context" (the context filled
before -n, or without one). What rides along with one sequence: its `constraint`
(constrained.TokenConstraint, made from the request's grammar: it masks the logits, and a complete
grammar ends the sequence) and its `logprobs` (Logprobs: each sampled token's log-probability and
the top alternatives, when the request asks), both readable on the Generation.
"""

from __future__ import annotations

import sys
from typing import Iterator

import torch

from ..cache import reuse_prefix
from ..formats.tokenizer import Tokenizer
from .picker import Logprobs, Picker
from .stream import (Chunk, Generation, Stats, limit_reason, output_limit,  # noqa: F401 (re-exported)
                     text_stream)
from .prefill import prefill, prefill_runner
from .request import Request
from .sampling import SamplingParams


@torch.inference_mode()
def token_stream(model, prompt: list[int], cache, params: SamplingParams, max_new: int,
                 device: torch.device, stats: Stats, step=None, shift=None, constraint=None,
                 logprobs: Logprobs | None = None) -> Iterator[int]:
    """Yield up to `max_new` token ids. `cache.token_ids` lists the ids in the cache slots; the
    longest prefix shared with `prompt` is reused and only the rest is prefilled. `step` runs the
    one-token decode steps (e.g. a compiled model); prefill runs prefill_runner(model, step). `shift`
    (context_shift.ContextShift) makes room when the cache is full. `constraint` masks each step's
    logits; once it is complete, its end token is yielded without another step (the grammar allows
    nothing else) and not counted as generated. `logprobs` records each sampled token."""
    step = step or model
    picker = Picker(params, prompt, device, head=getattr(model, "lm_head", None), constraint=constraint,
                    logprobs=logprobs, stats=stats)
    reuse = stats.cached_tokens = reuse_prefix(cache, prompt)
    hidden = picker.wants_hidden
    out = prefill(prefill_runner(model, step), prompt[reuse:], cache, device, hidden=hidden)
    logits, h = out if hidden else (out, None)
    cache.token_ids.extend(prompt[reuse:])
    top = picker.wants_top if getattr(step, "native", False) else 0  # the step finds the largest logits
    found = None
    for i in range(max_new):
        token = picker.pick(logits, h, found)
        yield token
        if picker.grammar_done:
            yield constraint.end_token
            return
        if i + 1 < max_new:
            if shift is not None and cache.length >= cache.max_len:
                shift.make_room(cache)
            out = step(torch.tensor([[token]], dtype=torch.long, device=device), cache, last_only=True, hidden=hidden,
                       **({"top": top} if top else {}))
            logits, h = (out[0][0, -1], out[1][0, -1]) if hidden else (out[0, -1], None)
            found = step.last_top if top else None
            found = None if found is None else (found[0][-1].tolist(), found[1][-1].tolist())
            cache.token_ids.append(token)


def generate(model, tokenizer: Tokenizer, prompt: list[int], request: Request, cache, step=None, *,
             constraint=None, shift=None, draft=None, reasoning=None) -> Generation:
    """Stream the completion of `prompt` (token ids) as `request` asks; `step` runs decode steps
    (default: the model). `constraint` (constrained.TokenConstraint, one per sequence) is required
    where the request is constrained (its grammar, or its tools' grammar: the caller binds either to
    the tokenizer). With `shift` (context_shift.ContextShift) generation goes past the context: only
    max_tokens ends it. `draft` (speculative.DraftModel) guesses tokens where the request's guesses
    are "draft"; "lookup" guesses from the context; beams > 1 searches. `reasoning`
    (reasoning.Reasoning, one per sequence) splits a reasoning model's thinking off; its budget and
    a grammar that waits for the answer ride in `constraint` (think_first.py)."""
    if not prompt:
        raise ValueError("empty prompt")
    if request.constrained and constraint is None:
        raise ValueError("a constrained request needs its constraint")
    device = next(model.parameters()).device
    limit = output_limit(len(prompt), cache.max_len, request.max_tokens)
    if shift is not None:
        limit = request.max_tokens or sys.maxsize
    stats = Stats(prompt_tokens=len(prompt))
    recorder = Logprobs(request.logprobs) if request.logprobs is not None else None
    stream = _strategy_stream(request, tokenizer, draft)
    if stream is None:
        tokens = token_stream(model, prompt, cache, request.sampling, limit, device, stats, step, shift, constraint,
                              recorder)
    else:
        tokens = stream(model, prompt, cache, request.sampling, limit, device, stats, step, shift)
    chunks = text_stream(tokens, tokenizer, tuple(s for s in request.stop if s), prompt, stats,
                         limit_reason(limit, request.max_tokens), request.ignore_eos, reasoning)
    return Generation(chunks, constraint, recorder)


def _strategy_stream(request: Request, tokenizer: Tokenizer, draft):
    """token_stream's replacement for the request's strategy (same arguments), or None: beam
    search, or speculative decoding with a draft model's or the context's guesses."""
    from functools import partial

    from . import speculative
    from .beam import beam_stream

    if request.beams > 1:
        return partial(beam_stream, beams=request.beams, length_penalty=request.length_penalty,
                       eos_ids=tokenizer.eos_ids)
    if request.guesses == "lookup":
        return partial(speculative.speculative_stream, proposer=speculative.PromptLookup(request.lookup_ngram),
                       draft_tokens=request.draft_tokens or speculative.LOOKUP_TOKENS)
    if request.guesses == "draft":
        if draft is None:
            raise ValueError("a request with draft guesses needs the draft model")
        return partial(speculative.speculative_stream, proposer=draft,
                       draft_tokens=request.draft_tokens or speculative.DRAFT_TOKENS)
    return None
