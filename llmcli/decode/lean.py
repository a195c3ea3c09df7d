"""generate() for the torch-free CPU path: the same prompt reuse, prefill, picks and text as
generate.py's token_stream and Picker, on numpy logits from runtime/lean_step.py's model.

    for chunk in generate_lean(model, tokenizer, prompt_ids, request, cache, constraint): ...

It takes sampling, max_tokens, stop strings, end tokens, grammars and tools (their constraint) and
logprobs; beams, guesses or a context shift need the torch path (`takes()` says which).
"""

from __future__ import annotations

from typing import Iterator

from ..cache import reuse_prefix
from ..formats.tokenizer import Tokenizer
from .picker_plain import PlainPicker
from .request import Request
from .stream import Generation, Logprobs, Stats, limit_reason, output_limit, text_stream


def takes(request: Request) -> bool:
    """Whether this path generates what `request` asks (else the torch path does)."""
    return request.beams == 1 and request.guesses is None and not request.context_shift


def token_stream(model, prompt: list[int], cache, picker: PlainPicker, max_new: int) -> Iterator[int]:
    """Up to `max_new` token ids after `prompt`, reusing what the cache holds of it; a complete
    grammar's end token is yielded without another step (not counted as generated)."""
    reuse = picker.stats.cached_tokens = reuse_prefix(cache, prompt)
    rest, top = prompt[reuse:], picker.wants_top
    logits, h, found = model.prefill(rest, cache, top)
    cache.token_ids.extend(rest)
    for i in range(max_new):
        token = picker.pick(logits[0], h[0], None if found is None else (found[0][0].tolist(), found[1][0].tolist()))
        yield token
        if picker.grammar_done:
            yield picker.constraint.end_token
            return
        if i + 1 < max_new:
            logits, h, found = model([token], cache, top=top)
            cache.token_ids.append(token)


def generate_lean(model, tokenizer: Tokenizer, prompt: list[int], request: Request, cache,
                  constraint=None, reasoning=None) -> Generation:
    """generate.generate's chunks for a request this path takes; `constraint` (one per sequence) where
    the request is constrained (its grammar or its tools'); `reasoning` (reasoning.Reasoning, one per
    sequence) splits a reasoning model's thinking off (its budget and a grammar that waits for the
    answer ride in `constraint`: think_first.py)."""
    if not prompt:
        raise ValueError("empty prompt")
    if not takes(request):
        raise ValueError("this request needs the torch path")
    if request.constrained and constraint is None:
        raise ValueError("a constrained request needs its constraint")
    limit = output_limit(len(prompt), cache.max_len, request.max_tokens)
    stats = Stats(prompt_tokens=len(prompt))
    recorder = Logprobs(request.logprobs) if request.logprobs is not None else None
    picker = PlainPicker(request.sampling, prompt, rescore=model.rescore, constraint=constraint, logprobs=recorder,
                         stats=stats)
    chunks = text_stream(token_stream(model, prompt, cache, picker, limit), tokenizer,
                         tuple(s for s in request.stop if s), prompt, stats, limit_reason(limit, request.max_tokens),
                         request.ignore_eos, reasoning)
    return Generation(chunks, constraint, recorder)
