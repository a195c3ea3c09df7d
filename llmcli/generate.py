"""Generation as a stack of generators:

    token_stream   prefill the prompt (reusing what the cache already holds), then decode one token
                   per step and yield each id
    text_stream    ids -> text: end-of-sequence ids, stop strings (never printed, even when split
                   across tokens), whole UTF-8 characters only
    generate       the public entry: checks the prompt fits, picks the output limit, yields Chunk

The last chunk carries `finish_reason` ("stop" or "length") and the `Stats`. Two optional
per-sequence objects ride along: a `constraint` (constrained.TokenConstraint: a grammar masks the
logits, and a complete grammar ends the sequence) and `logprobs` (Logprobs: records each sampled
token's log-probability and the top alternatives).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch

from .errors import PromptTooLongError
from .sampling import SamplingParams, make_generator, penalty_history, sample, token_logprobs
from .tokenizer import StreamDecoder, Tokenizer

PREFILL_CHUNK = 512  # tokens per forward pass when prefilling long prompts (bounds activation memory)


@dataclass
class Stats:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV were already in the cache (not prefilled again)
    ttft_s: float = 0.0  # from the call to the first sampled token
    prefill_s: float = 0.0
    decode_s: float = 0.0
    seed: int = -1
    extra: dict = field(default_factory=dict)  # what a decoding strategy adds (beams, draft acceptance)

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def prefill_tps(self) -> float:
        return self.prefilled_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        # the first token comes out of prefill; the rest are decode steps
        steps = max(0, self.completion_tokens - 1)
        return steps / self.decode_s if self.decode_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cached_tokens": self.cached_tokens, "ttft_s": round(self.ttft_s, 4),
                "prefill_s": round(self.prefill_s, 4), "decode_s": round(self.decode_s, 4),
                "prefill_tokens_per_s": round(self.prefill_tps, 2), "decode_tokens_per_s": round(self.decode_tps, 2),
                "seed": self.seed, **self.extra}


@dataclass
class Chunk:
    text: str
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # set on the last chunk: "stop" or "length"
    stats: Stats | None = None


@dataclass
class Logprobs:
    """Per sampled token: (id, logprob, [(id, logprob) of the `top` most likely]), from the model's own
    distribution: before penalties, temperature, truncation and any grammar mask (as OpenAI reports)."""

    top: int = 0
    entries: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)

    def record(self, logits: torch.Tensor, token: int) -> None:
        self.entries.append((token, *token_logprobs(logits, token, self.top)))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@torch.inference_mode()
def prefill(model, ids: list[int], cache, device: torch.device, chunk: int | None = None, hidden: bool = False):
    """Run `ids` into the cache (after what it holds); logits (V,) of the last one (and with
    `hidden`, its final hidden state (H,))."""
    chunk = chunk or PREFILL_CHUNK
    out = None
    for i in range(0, len(ids), chunk):
        piece = torch.tensor([ids[i:i + chunk]], dtype=torch.long, device=device)
        out = model(piece, cache, last_only=True, hidden=hidden)
    return (out[0][0, -1], out[1][0, -1]) if hidden else out[0, -1]


NEAR_TIE = 2.0 ** -6  # relative gap under which half-precision rounding may have decided the top token
RESCORED = 8  # candidates rescored in float32


def rescore_near_ties(head, logits: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Logits (V,) with the best candidates recomputed in float32 when the top two are nearly tied.

    Half-precision kernels give logits 8 significant bits: near 20 they are 0.125 apart, so near-ties
    become ties and greedy decoding would turn on rounding (on SmolLM2 q4, one step in ~50), and on
    which kernels ran (eager or compiled). Rescoring from the head's weight rows and the hidden state
    `h` (H,) costs a few dot products, only then. A quantized head rounds too, whatever the compute
    dtype: its kernels take bfloat16 activations (a float32 model on a CPU without native bf16)."""
    exact = h.dtype == torch.float32 and getattr(getattr(head, "weight", None), "dtype", None) == torch.float32
    if exact or logits.shape[-1] < 2 or getattr(head, "bias", None) is not None or not hasattr(head, "weight_rows"):
        return logits
    top = logits.topk(min(RESCORED, logits.shape[-1]))
    if float(top.values[0] - top.values[1]) > NEAR_TIE * abs(float(top.values[0])):
        return logits
    rows = head.weight_rows(top.indices, torch.float32)
    if rows is None:
        return logits
    return logits.index_put((top.indices,), rows @ h.float())


@torch.inference_mode()
def token_stream(model, prompt: list[int], cache, params: SamplingParams, max_new: int,
                 device: torch.device, stats: Stats, step=None, shift=None, constraint=None,
                 logprobs: Logprobs | None = None) -> Iterator[int]:
    """Yield up to `max_new` token ids. `cache.token_ids` lists the ids in the cache slots; the
    longest prefix shared with `prompt` is reused and only the rest is prefilled. `step` runs the
    one-token decode steps (e.g. a compiled model); prefill always runs `model`. `shift`
    (context_shift.ContextShift) makes room when the cache is full. `constraint` masks each step's
    logits; once it is complete, its end token is yielded without another step (the grammar allows
    nothing else) and not counted as generated. `logprobs` records each sampled token."""
    step = step or model
    t0 = time.perf_counter()
    held = getattr(cache, "token_ids", [])[: cache.length]
    reuse = min(common_prefix(held, prompt), len(prompt) - 1)  # at least one token to get logits from
    cache.truncate(reuse)
    cache.token_ids = list(prompt[:reuse])
    stats.cached_tokens = reuse
    generator, stats.seed = make_generator(params.seed, device)
    history = list(prompt)

    greedy = params.greedy  # near-ties are rescored exactly (rescore_near_ties), which needs the hidden state
    out = prefill(model, prompt[reuse:], cache, device, hidden=greedy)
    logits, h = out if greedy else (out, None)
    cache.token_ids.extend(prompt[reuse:])
    for i in range(max_new):
        hist = penalty_history(history, params, device)
        if greedy:
            logits = rescore_near_ties(getattr(model, "lm_head", None), logits, h)
        allowed = constraint.mask(logits) if constraint is not None else logits
        token = sample(allowed, hist, params, generator)
        if logprobs is not None:
            logprobs.record(logits, token)
        if constraint is not None:
            constraint.advance(token)
        now = time.perf_counter()
        if i == 0:
            stats.ttft_s = stats.prefill_s = now - t0
        else:
            stats.decode_s = now - t0 - stats.prefill_s
        stats.completion_tokens = i + 1
        history.append(token)
        yield token
        if constraint is not None and constraint.is_done():
            yield constraint.end_token
            return
        if i + 1 < max_new:
            if shift is not None and cache.length >= cache.max_len:
                shift.make_room(cache)
            out = step(torch.tensor([[token]], dtype=torch.long, device=device), cache, last_only=True, hidden=greedy)
            logits, h = (out[0][0, -1], out[1][0, -1]) if greedy else (out[0, -1], None)
            cache.token_ids.append(token)


def _partial_stop(text: str, stops: Iterable[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


def text_stream(tokens: Iterator[int], tokenizer: Tokenizer, stops: tuple[str, ...], context: list[int],
                stats: Stats) -> Iterator[Chunk]:
    """Token ids -> text chunks; ends on an end-of-sequence id, a stop string, or the token limit."""
    decoder = StreamDecoder(tokenizer, context)
    pending = ""  # decoded text held back because it might be the start of a stop string
    for token in tokens:
        if token in tokenizer.eos_ids:
            tokens.close()
            yield Chunk(pending, [token], "stop", stats)
            return
        pending += decoder.push(token)
        hits = [i for i in (pending.find(s) for s in stops) if i >= 0]
        if hits:
            tokens.close()
            yield Chunk(pending[: min(hits)], [token], "stop", stats)
            return
        keep = _partial_stop(pending, stops)
        out, pending = (pending[:-keep], pending[-keep:]) if keep else (pending, "")
        yield Chunk(out, [token])
    yield Chunk(pending + decoder.flush(), [], "length", stats)


def output_limit(prompt_tokens: int, ctx_size: int, max_tokens: int | None) -> int:
    """min(context - prompt, max_tokens); a prompt that leaves no room is an error, never a truncation."""
    room = ctx_size - prompt_tokens
    if room < 1:
        raise PromptTooLongError(
            f"the prompt is {prompt_tokens} tokens but the context holds {ctx_size}; "
            "shorten the prompt or raise --ctx-size")
    return room if max_tokens is None else min(room, max_tokens)


def generate(model, tokenizer: Tokenizer, prompt: list[int], params: SamplingParams, cache, *,
             max_tokens: int | None = None, stop: tuple[str, ...] = (), device: torch.device | None = None,
             step=None, shift=None, constraint=None, logprobs: Logprobs | None = None,
             stream=None) -> Iterator[Chunk]:
    """Stream the completion of `prompt` (token ids) as Chunks; `step` runs decode steps (default: model).
    With `shift` (context_shift.ContextShift) generation goes past the context: only `max_tokens` ends it.
    `constraint` (constrained.TokenConstraint, one per sequence) keeps the output inside a grammar;
    `logprobs` (Logprobs) collects each sampled token's log-probabilities. `stream` replaces
    token_stream (same arguments): another decoding strategy, e.g. beam.py's or speculative.py's,
    under the same stop, end-token and UTF-8 handling; it takes no constraint or logprobs."""
    if not prompt:
        raise ValueError("empty prompt")
    device = device or next(model.parameters()).device
    limit = output_limit(len(prompt), cache.max_len, max_tokens)
    if shift is not None:
        limit = max_tokens or sys.maxsize
    stats = Stats(prompt_tokens=len(prompt))
    if stream is None:
        tokens = token_stream(model, prompt, cache, params, limit, device, stats, step, shift, constraint, logprobs)
    elif constraint is not None or logprobs is not None:
        raise ValueError("a constraint or logprobs need token-by-token decoding")
    else:
        tokens = stream(model, prompt, cache, params, limit, device, stats, step, shift)
    stops = tuple(s for s in stop if s)
    yield from text_stream(tokens, tokenizer, stops, prompt, stats)
