"""Speculative decoding: cheap guesses of the next K tokens, checked by the model in one forward pass.

A proposer guesses: a small or quantized draft model decoding greedily (`DraftModel`), or prompt
lookup (`PromptLookup`: the last n-gram of the context found earlier in it, and what followed). The
model runs the pending token and the K guesses as one (1, K+1) forward and picks, at each of the K+1
positions, the token greedy decoding would pick there; the guesses are accepted up to the first one
that differs, and the model's own pick follows them, so every pass yields 1..K+1 tokens. The cache
is truncated back to the accepted tokens.

Greedy only. The picks are plain greedy's: the same Picker (penalties included) over the same
history, and near-ties rescored in float32 from each position's hidden state.
The one difference is arithmetic: a (K+1)-token forward rounds differently from a one-token one
(GEMM vs GEMV), so in bfloat16 a token whose top two logits are closer than that rounding, and not
caught by the rescoring, differs from plain greedy's, and the answers part from there (SmolLM2 bf16,
a story prompt: after 5 tokens); in float32 the differences are ~1e-6 and the outputs are the
same (tests/test_speculative.py).
"""

from __future__ import annotations

import time
from typing import Iterator

import torch

from ..cache import reuse_prefix
from ..errors import InvalidParameterError
from .prefill import prefill
from .picker import Picker, Stats
from .sampling import SamplingParams, argmax

DRAFT_TOKENS = 8  # guesses per pass with a draft model (SmolLM2 bf16 + its q4 copy: see the README)
LOOKUP_TOKENS = 3  # at most, with prompt lookup (Reach: 2, and 3 after a pass whose guesses were all accepted): see Reach
LOOKUP_NGRAM = 3  # longest n-gram matched (transformers' max_matching_ngram_size is 2; llama.cpp's lookup 4)


class PromptLookup:
    """Guesses from the context itself: the latest earlier occurrence of its last n tokens (n from
    `ngram` down to 1) and the tokens that followed it. Good at copying: code edits, quotes, summaries."""

    def __init__(self, ngram: int = LOOKUP_NGRAM):
        self.ngram = ngram
        self.seen: list[dict[tuple[int, ...], int]] = [{} for _ in range(ngram + 1)]  # n -> n-gram -> start
        self.indexed = 0  # n-grams ending before this position are in `seen`
        self.context: list[int] = []

    def propose(self, context: list[int], k: int) -> list[int]:
        if context[: self.indexed] != self.context[: self.indexed]:  # another context: start over
            self.seen, self.indexed = [{} for _ in range(self.ngram + 1)], 0
        self.context = context
        for end in range(max(self.indexed, 1), len(context)):  # n-grams followed by at least one token
            for n in range(1, min(self.ngram, end) + 1):
                self.seen[n][tuple(context[end - n:end])] = end - n
        self.indexed = max(self.indexed, len(context))
        for n in range(min(self.ngram, len(context) - 1), 0, -1):
            start = self.seen[n].get(tuple(context[-n:]))
            if start is not None:
                return context[start + n: start + n + k]
        return []


class DraftModel:
    """Guesses from a draft model decoding greedily, with its own cache kept in step with the context."""

    def __init__(self, model, cache, device: torch.device, step=None):
        self.model, self.cache, self.device, self.step = model, cache, device, step or model

    def propose(self, context: list[int], k: int) -> list[int]:
        keep = reuse_prefix(self.cache, context)
        # the few tokens a pass accepted through the native step, which takes several; else the model
        catch_up = self.step if getattr(self.step, "native", False) else self.model
        logits = prefill(catch_up, context[keep:], self.cache, self.device)
        self.cache.token_ids = list(context)
        guesses = []
        for i in range(k):
            guesses.append(argmax(logits))
            if i + 1 < k:
                out = self.step(torch.tensor([[guesses[-1]]], device=self.device), self.cache, last_only=True)
                logits = out[0, -1]
                self.cache.token_ids.append(guesses[-1])
        return guesses


class Reach:
    """How many guesses the next pass makes: few after a miss, twice as many after a pass whose
    guesses were all accepted, up to `most`. A pass checks its tokens in one call of the native step,
    which costs about one step for 2-3 tokens but several for 8 or more (docs/performance-choices.md):
    guesses that copy a long stretch pay in long passes, doubtful ones only in short ones."""

    START = 2

    def __init__(self, most: int):
        self.most = most
        self.k = min(self.START, most)

    def record(self, guessed: int, accepted: int) -> None:
        self.k = min(2 * guessed, self.most) if accepted == guessed else min(self.START, self.most)


class Pacer:
    """Whether the next pass guesses: only while guessing beats plain one-token steps.

    A pass with guesses runs the model on 1+K tokens (and a draft model K steps); it pays when the
    tokens it yields come faster than plain steps would make them. The first passes are plain (they
    measure a step); then each guessed pass is timed, and when guessed passes yield fewer tokens a
    second than plain steps do, the next 1, 2, 4 ... 64 passes are plain before guessing is tried again.
    """

    CALIBRATE = 2  # plain steps measured first
    SMOOTH = 0.3  # weight of the newest measurement in the running averages

    def __init__(self):
        self.plain_s: float | None = None  # seconds of a plain step (running average)
        self.guessed_tps: float | None = None  # tokens a second from guessed passes (running average)
        self.wait = self.CALIBRATE  # plain passes before the next guessed one
        self.backoff = 1

    def guess(self) -> bool:
        if self.wait > 0:
            self.wait -= 1
            return False
        return True

    def record(self, guessed: bool, tokens: int, seconds: float) -> None:
        if seconds <= 0:
            return
        if not guessed:
            self.plain_s = seconds if self.plain_s is None else _blend(self.plain_s, seconds, self.SMOOTH)
            return
        tps = tokens / seconds
        self.guessed_tps = tps if self.guessed_tps is None else _blend(self.guessed_tps, tps, self.SMOOTH)
        if self.plain_s is not None and self.guessed_tps * self.plain_s < 1:  # slower than plain steps
            self.wait, self.backoff = self.backoff, min(2 * self.backoff, 64)
        else:
            self.backoff = 1

    @property
    def plain_tps(self) -> float | None:
        return 1 / self.plain_s if self.plain_s else None


def _blend(old: float, new: float, weight: float) -> float:
    return (1 - weight) * old + weight * new


@torch.inference_mode()
def speculative_stream(model, prompt: list[int], cache, params: SamplingParams, max_new: int,
                       device: torch.device, stats: Stats, step=None, shift=None, *, proposer,
                       draft_tokens: int) -> Iterator[int]:
    """generate()'s token stream for a request with guesses: the same tokens as greedy decoding, 1..K+1 per
    forward pass of `model`. `step` runs the passes that have no guess (one token); a Pacer decides
    when guessing pays. The stats gain `draft_tokens` (guessed), `accepted_tokens`, `acceptance_rate`
    and `plain_step_tokens_per_s` (what plain steps made here, for "it did not pay")."""
    if not params.greedy:
        raise InvalidParameterError("--draft and --lookup decode greedily for now; add --temp 0")
    if shift is not None:
        raise InvalidParameterError("--context-shift does not work with --draft or --lookup")
    step = step or model
    checks = step if getattr(step, "native", False) else model  # runs a pass's 1+K tokens
    t0 = time.perf_counter()
    picker = Picker(params, prompt, device, head=getattr(model, "lm_head", None), stats=stats)
    reuse = stats.cached_tokens = reuse_prefix(cache, prompt)
    logits, h = prefill(checks, prompt[reuse:], cache, device, hidden=True)
    cache.token_ids.extend(prompt[reuse:])
    context = list(prompt)  # the ids in the cache, then `token`, pending
    token = picker.pick(logits, h)
    proposer.propose(context, 0)  # the draft reads the prompt now, as part of prefill
    stats.ttft_s = stats.prefill_s = time.perf_counter() - t0
    drafted = accepted = 0
    pacer, reach = Pacer(), Reach(draft_tokens)
    yield token
    while stats.completion_tokens < max_new:
        t_pass = time.perf_counter()
        k = min(reach.k, max_new - stats.completion_tokens - 1)  # never past max_new (nor the context)
        guesses = proposer.propose(context + [token], k) if k and pacer.guess() else []
        run = step if not guesses else checks
        logits, h = run(torch.tensor([[token] + guesses], device=device), cache, hidden=True)  # (1, 1+G, V)
        context.append(token)
        new = []
        for i in range(len(guesses) + 1):
            new.append(picker.pick(logits[0, i], h[0, i]))
            if i == len(guesses) or new[-1] != guesses[i]:
                break
        ok = len(new) - 1  # guesses accepted; new[-1] is the model's own pick after them
        cache.truncate(len(context) + ok)
        cache.token_ids.extend([context[-1]] + guesses[:ok])
        pacer.record(bool(guesses), len(new), time.perf_counter() - t_pass)
        if guesses:
            reach.record(len(guesses), ok)
        drafted, accepted = drafted + len(guesses), accepted + ok
        if drafted:
            stats.extra.update({"draft_tokens": drafted, "accepted_tokens": accepted,
                                "acceptance_rate": round(accepted / drafted, 4)})
        if pacer.plain_tps:
            stats.extra["plain_step_tokens_per_s"] = round(pacer.plain_tps, 2)
        context.extend(new[:-1])
        token = new[-1]
        yield from new


def check_draft(target, draft, sample: str) -> None:
    """`target`, `draft`: loader.LoadedModel. A draft must speak the target's token ids."""
    a, b = target.args.vocab_size, draft.args.vocab_size
    same = a == b and target.tokenizer.vocab_size == draft.tokenizer.vocab_size
    if same and target.tokenizer.encode(sample) != draft.tokenizer.encode(sample):
        same = False
    if not same:
        raise InvalidParameterError(f"the draft model's vocabulary ({b} tokens) is not the model's ({a}); "
                                    "--draft needs a model with the same tokenizer")
