"""The half of generation that needs no tensors: token ids -> text chunks (end-of-sequence ids, stop
strings, whole characters, a reasoning model's thinking apart from its answer), the output limit and
which limit ended a sequence, the timing stats, and the Generation a caller iterates. generate.py
(torch), lean.py (numpy) and batched.py all end in text_stream.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from ..errors import PromptTooLongError
from ..formats.tokenizer import StreamDecoder, Tokenizer


@dataclass
class Stats:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV were already in the cache (not prefilled again)
    ttft_s: float = 0.0  # from the call to the first sampled token
    prefill_s: float = 0.0
    decode_s: float = 0.0
    seed: int = -1
    reasoning_tokens: int = 0  # of completion_tokens, those generated while thinking (reasoning.py)
    extra: dict = field(default_factory=dict)  # what a decoding strategy adds (beams, draft acceptance)

    def count_token(self, t0: float) -> None:
        """One more token picked, `t0` (perf_counter) the sequence's start: the first ends the prefill."""
        now = time.perf_counter()
        if self.completion_tokens == 0:
            self.ttft_s = self.prefill_s = now - t0
        else:
            self.decode_s = now - t0 - self.prefill_s
        self.completion_tokens += 1

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
    stopped_by: str | None = None  # with finish_reason "length": "max_tokens" or "context"
    stop: str | None = None  # with finish_reason "stop" by a stop string (not an end token): which one
    reasoning: str = ""  # thinking text of a reasoning model (`text` is then the answer's only)


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
                stats: Stats, stopped_by: str | None = None, ignore_eos: bool = False,
                reasoning=None) -> Iterator[Chunk]:
    """Token ids -> text chunks; ends on an end-of-sequence id (unless `ignore_eos`), a stop string,
    or the token limit (`stopped_by` names it on the last chunk: limit_reason()). `reasoning`
    (reasoning.Reasoning) splits a reasoning model's thinking off into Chunk.reasoning; the stop
    strings apply to the answer only."""
    decoder = StreamDecoder(tokenizer, context)
    pending = ""  # decoded text held back because it might be the start of a stop string

    def split(token, text):
        if reasoning is None:
            return "", text
        think, text = reasoning.push(token, text)
        stats.reasoning_tokens = reasoning.tokens
        return think, text

    def rest():
        return reasoning.finish() if reasoning is not None else ("", "")

    for token in tokens:
        if token in tokenizer.eos_ids and not ignore_eos:
            tokens.close()
            think, more = rest()
            yield _ended(pending + more, [token], "stop", stats, think, stops)
            return
        think, new = split(token, decoder.push(token))
        pending += new
        hits = [(i, s) for i, s in ((pending.find(s), s) for s in stops) if i >= 0]
        if hits:
            tokens.close()
            at, stop = min(hits, key=lambda hit: hit[0])
            yield Chunk(pending[:at], [token], "stop", stats, stop=stop, reasoning=think)
            return
        keep = _partial_stop(pending, stops)
        out, pending = (pending[:-keep], pending[-keep:]) if keep else (pending, "")
        yield Chunk(out, [token], reasoning=think)
    think, new = split(None, decoder.flush())
    more_think, more = rest()
    yield _ended(pending + new + more, [], "length", stats, think + more_think, stops, stopped_by)


def _ended(text: str, tokens: list[int], finish: str, stats: Stats, think: str, stops, stopped_by=None) -> Chunk:
    """The last chunk; a stop string in the answer's held-back end still cuts it."""
    hits = [(i, s) for i, s in ((text.find(s), s) for s in stops) if i >= 0]
    stop = None
    if hits:
        at, stop = min(hits, key=lambda hit: hit[0])
        text, finish, stopped_by = text[:at], "stop", None
    return Chunk(text, tokens, finish, stats, stopped_by, stop, reasoning=think)


def output_limit(prompt_tokens: int, ctx_size: int, max_tokens: int | None) -> int:
    """min(context - prompt, max_tokens); a prompt that leaves no room is an error, never a truncation."""
    room = ctx_size - prompt_tokens
    if room < 1:
        raise PromptTooLongError(
            f"the prompt is {prompt_tokens} tokens but the context holds {ctx_size}; "
            "shorten the prompt or raise --ctx-size")
    return room if max_tokens is None else min(room, max_tokens)


def limit_reason(limit: int, max_tokens: int | None) -> str:
    """Which limit a sequence allowed `limit` (output_limit()) new tokens stops at: "max_tokens"
    when it is -n (the context had room for all of them), else "context"."""
    return "max_tokens" if max_tokens is not None and limit == max_tokens else "context"


@dataclass
class Logprobs:
    """Per sampled token: (id, logprob, [(id, logprob) of the `top` most likely]), from the model's own
    distribution: before penalties, temperature, truncation and any grammar mask (as OpenAI reports).
    The pickers add the entries (picker.py in torch, picker_plain.py in numpy)."""

    top: int = 0
    entries: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)

    def add(self, token: int, logprob: float, alternatives: list[tuple[int, float]]) -> None:
        self.entries.append((token, logprob, alternatives))


class Generation:
    """The chunks of one completion (iterate; close() stops between two tokens), and what rode along:
    `constraint` (None without a grammar) and `logprobs` (None unless the request asks)."""

    def __init__(self, chunks: Iterator[Chunk], constraint, logprobs):  # logprobs: Logprobs or None
        self._chunks, self.constraint, self.logprobs = chunks, constraint, logprobs

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> Chunk:
        return next(self._chunks)

    def close(self) -> None:
        self._chunks.close()
