"""Several sequences decoded together: one forward pass per step for every running sequence.

Continuous batching over a KV cache of `rows` rows: the engine's backend holds it and runs the steps,
rows_torch.TorchRows on a torch model (a StaticKVCache) or rows_lean.LeanRows on the torch-free CPU
path (a HostKVCache, numpy pickers; BatchEngine.over). Each sequence owns one row and its own
length; the live rows are always rows [0, n) so that a step is a (n, 1) forward over a plain slice
of the cache (forward_layout's `slots`: row b's token goes to slot length_b and sees slots
0..length_b). A finished sequence's row is refilled from the last live row (one copy of its
slots), and a waiting request is admitted into row n as soon as one is free, between steps:

    submit(sequence)     queue a Sequence: a prompt and its request (thread-safe; checks the prompt fits)
    cancel(sequence)     drop it, queued or running (a client went away); no event follows
    step() -> events     admit what fits, run one decode step, return (Sequence, Chunk) pairs

A new sequence's prompt is prefilled alone through a batch-1 view of its row, exactly as
generate() prefills; through the native step it goes into the next decode step's call instead
(NativeStep.pieces: the running rows' tokens and the prompt in one C++ call, each weight read once
for all of them, and every token's numbers still those it gets alone), so the running rows do not
wait for it (benchmarks/serving/batch_throughput.py: docs/performance-choices.md). Through the native step (Runtime.batch_engine's), a step's rows are one C++ call
that reads each weight once for all of them, and each row's numbers are those it gets alone: a
sequence produces exactly what generate() produces for it. Through the model, batched matrix
products may round differently. With a `prompt_cache` (cache/prompt_cache.py), the longest
prefix of the prompt that an earlier sequence computed, or a running one holds, is copied into the
row first and only the rest is prefilled (as a chat reuses its own cache across turns); every
sequence's row is offered to it when the sequence ends. Requests that arrive together with one
long start (a system prompt) compute it once: the others wait a step and copy it. Sampling, stop
strings, end tokens, constraints and logprobs are generate()'s own (token by token per row): the
chunks and finish reasons are the same; the native step finds each row's largest logits for its
pick (NativeStep's top=k).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

from ..cache import common_prefix
from ..cache.prompt_cache import PromptCache
from .request import Request
from .stream import Chunk, Logprobs, limit_reason, output_limit, text_stream


JOINED_TOKENS = 256  # tokens a decode step takes with new prompts in it (more: a prompt is prefilled alone)
SHARED_WAIT = 16  # prompt tokens a request waits a step for, to copy them from a row that computes them now


@dataclass(eq=False)
class Sequence:
    """One completion to make: `prompt` (token ids) as `request` asks. `constraint`
    (constrained.TokenConstraint, one per sequence) where the request is constrained; `logprobs`
    records its tokens where the request asks; `tag` is the caller's (an id, a reply queue)."""

    prompt: list[int]
    request: Request = field(default_factory=Request)
    constraint: object = None
    tag: object = None
    reasoning: object = None  # reasoning.Reasoning: a reasoning model's thinking split off its answer
    owner: object = None  # whose it is, for the caller (a server: the model it was prepared for)
    logprobs: Logprobs | None = field(default=None, init=False)

    def __post_init__(self):
        if self.request.constrained and self.constraint is None:
            raise ValueError("a constrained request needs its constraint")
        if self.request.logprobs is not None:
            self.logprobs = Logprobs(self.request.logprobs)


class _Running:
    """A running sequence: its row's length, its Picker and its text stream."""

    def __init__(self, req: Sequence, limit: int, picker, tokenizer):
        self.req, self.limit, self.picker = req, limit, picker
        self.stats = self.picker.stats
        self.length = 0  # tokens in its cache row
        self.last = -1  # the token the next step feeds
        self.pending: int | None = None  # the token text_stream reads next
        self.text = text_stream(self._feed(), tokenizer, tuple(s for s in req.request.stop if s), req.prompt,
                                self.stats, limit_reason(limit, req.request.max_tokens), req.request.ignore_eos,
                                req.reasoning)

    def _feed(self) -> Iterator[int]:
        while self.pending is not None:
            token, self.pending = self.pending, None
            yield token

    def push(self, token: int | None) -> Chunk:
        """The next chunk of text after `token` (None: the limit is reached, the last chunk)."""
        self.pending = token
        return next(self.text)


class BatchEngine:
    def __init__(self, model, tokenizer, device, dtype, rows: int, max_len: int, kv_type: str | None = None,
                 prompt_cache: PromptCache | None = None, step=None):
        """`rows` sequences at most at once, each up to `max_len` tokens (prompt + output), on a torch
        model (rows_torch.py); the cache stores keys and values as `kv_type` says (None: the compute
        `dtype`; "bf16" or "f16": that storage type; the rows need a static cache). `prompt_cache`:
        finished sequences' KV, reused by later prompts that start the same way (None: every prompt
        is prefilled whole). `step` runs the decode steps, called as the model with `slots`
        (Runtime.decode_step's native step; default: the model); prefill runs the model.
        BatchEngine.over() takes the torch-free path's rows (rows_lean.py)."""
        from .rows_torch import TorchRows

        if rows < 1:
            raise ValueError("rows must be at least 1")
        self._start(TorchRows(model, device, dtype, rows, max_len, kv_type, step), tokenizer, rows, max_len, prompt_cache)

    @classmethod
    def over(cls, backend, tokenizer, rows: int, max_len: int, prompt_cache: PromptCache | None = None) -> "BatchEngine":
        """An engine whose cache, pickers, prefill and steps are `backend`'s (rows_lean.LeanRows)."""
        engine = object.__new__(cls)
        engine._start(backend, tokenizer, rows, max_len, prompt_cache)
        return engine

    def _start(self, backend, tokenizer, rows: int, max_len: int, prompt_cache: PromptCache | None) -> None:
        self.backend, self.tokenizer = backend, tokenizer
        self.cache, self.step_fn = backend.cache, backend.step_fn
        self.rows, self.max_len = rows, max_len
        self.prompt_cache = prompt_cache
        self.waiting: deque[Sequence] = deque()
        self.running: list[_Running] = []  # running[i] holds cache row i
        self.cancelled: set[Sequence] = set()  # sequences to drop (held, not id()s: a freed id can be reused)
        self.lock = threading.Lock()
        self.steps = 0  # decode steps run
        self.row_steps = 0  # rows decoded over all steps (steps x batch size)

    # ------------------------------------------------------------------ the caller's side

    def submit(self, req: Sequence) -> None:
        output_limit(len(req.prompt), self.max_len, req.request.max_tokens)  # PromptTooLongError now, not later
        with self.lock:
            self.waiting.append(req)

    def cancel(self, req: Sequence) -> None:
        with self.lock:
            self.cancelled.add(req)

    @property
    def busy(self) -> bool:
        with self.lock:
            return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ the engine's side

    def step(self) -> list[tuple[Sequence, Chunk]]:
        """Admit waiting requests into free rows (prefilling each), then one decode step for every
        running sequence. Returns the chunks made, in row order; a chunk with a finish_reason is its
        request's last."""
        with self.backend.mode():
            return self._step()

    def _step(self) -> list[tuple[Sequence, Chunk]]:
        events: list[tuple[Sequence, Chunk]] = []
        self._drop_cancelled()
        prompts: dict[int, list[int]] = {}  # row: the prompt tokens the decode step runs for it
        while len(self.running) < self.rows:
            with self.lock:
                if not self.waiting or self._waits_for_a_prefix(self.waiting[0], prompts):
                    break
                req = self.waiting.popleft()
            self._admit(req, events, prompts)
        if self.running:
            self._decode(events, prompts)
        return events

    def _drop_cancelled(self) -> None:
        with self.lock:
            if not self.cancelled:
                return
            gone, self.cancelled = self.cancelled, set()
            self.waiting = deque(r for r in self.waiting if r not in gone)
        for i in reversed(range(len(self.running))):
            if self.running[i].req in gone:
                self._free(i)

    def _admit(self, req: Sequence, events, prompts: dict[int, list[int]]) -> None:
        seq = _Running(req, output_limit(len(req.prompt), self.max_len, req.request.max_tokens),
                       self.backend.picker(req), self.tokenizer)
        row = len(self.running)
        # what an earlier or a running sequence computed of this prompt (one token is left to run for the logits)
        reuse = seq.stats.cached_tokens = self._reuse(req, row)
        rest = req.prompt[reuse:]
        if self._joins_step(rest, prompts):  # prefilled by the next decode step
            prompts[row] = rest
            seq.length = reuse
            self.running.append(seq)
            return
        logits, h = self.backend.prefill(rest, row, reuse, seq.picker.wants_hidden)
        seq.length = len(req.prompt)
        self.running.append(seq)
        if not self._emit(row, logits, h, events):
            self._free(row)

    def _reuse(self, req: Sequence, row: int) -> int:
        """Copy into `row` the longest start of req's prompt that the prompt cache holds or a running
        row has computed (at most all but its last token); its length (0 without a prompt cache)."""
        if self.prompt_cache is None or not req.request.cache_prompt:
            return 0
        limit = len(req.prompt) - 1
        shared, source = self._computed_prefix(req.prompt, limit)
        if shared > self.prompt_cache.longest_prefix(req.prompt)[0]:
            self.cache.move_row(source, row, shared)
            self.prompt_cache.hits += 1
            self.prompt_cache.reused_tokens += shared
            return shared
        return self.prompt_cache.restore(req.prompt, self.cache, row, limit)

    def _computed_prefix(self, prompt: list[int], limit: int) -> tuple[int, int | None]:
        """(n, row): the running row whose cache slots hold the longest start of `prompt`, its length
        (at most `limit`)."""
        best, source = 0, None
        for i, seq in enumerate(self.running):
            n = min(common_prefix(seq.picker.history[:seq.length], prompt), limit)
            if n > best:
                best, source = n, i
        return best, source

    def _waits_for_a_prefix(self, req: Sequence, prompts: dict[int, list[int]]) -> bool:
        """Whether `req` waits a step: a prompt that joins this step starts as req's does, for
        SHARED_WAIT tokens more than anything computed. Requests that arrive together with one
        system prompt then compute it once, and the others copy it from that row next step."""
        if self.prompt_cache is None or not req.request.cache_prompt or not prompts:
            return False
        limit = len(req.prompt) - 1
        coming = max(min(common_prefix(self.running[r].req.prompt, req.prompt), limit) for r in prompts)
        if coming < SHARED_WAIT:
            return False
        have = max(self._computed_prefix(req.prompt, limit)[0], self.prompt_cache.longest_prefix(req.prompt)[0])
        return coming - have >= SHARED_WAIT

    def _joins_step(self, rest: list[int], prompts: dict[int, list[int]]) -> bool:
        """Whether a new prompt's `rest` can go into the next decode step's call (the native step's
        pieces), beside the running rows' tokens and the prompts already joining it."""
        if not self.backend.joins:
            return False
        taken = len(self.running) + sum(len(p) - 1 for p in prompts.values())
        return taken + len(rest) <= JOINED_TOKENS

    def _decode(self, events, prompts: dict[int, list[int]]) -> None:
        n = len(self.running)
        ends = [s.length + len(prompts.get(i, (0,))) for i, s in enumerate(self.running)]
        self.cache.length = max(ends)
        self.backend.clean_up_to(self.cache.length, [s.length for s in self.running])
        top = max(s.picker.wants_top for s in self.running) if self.backend.finds_top else 0
        pieces = [(i, s.length, prompts.get(i) or [s.last]) for i, s in enumerate(self.running)]
        row_logits, row_h, found = self.backend.decode(pieces, bool(prompts), top)
        self.steps += 1
        self.row_steps += n
        done = []
        for i, seq in enumerate(self.running):
            seq.length = ends[i]
            top_i = None if found is None else (found[0][i], found[1][i])
            if not self._emit(i, row_logits[i], row_h[i], events, top_i):
                done.append(i)
        for i in reversed(done):
            self._free(i)

    def _emit(self, row: int, logits, h, events, top=None) -> bool:
        """Pick row's next token from logits (V,) (`top`: their largest, where the step found them),
        push it through its text stream; False once the sequence has finished."""
        seq = self.running[row]
        token = seq.picker.pick(logits, h, top)
        seq.last = token
        chunk = seq.push(token)
        if chunk.finish_reason is None and seq.picker.grammar_done:
            events.append((seq.req, chunk))
            chunk = seq.push(seq.req.constraint.end_token)  # the grammar allows nothing else: it ends here
        elif chunk.finish_reason is None and seq.stats.completion_tokens >= seq.limit:
            events.append((seq.req, chunk))
            chunk = seq.push(None)
        events.append((seq.req, chunk))
        return chunk.finish_reason is None

    def _free(self, row: int) -> None:
        """Drop row's sequence (its KV offered to the prompt cache); the last live row moves into its place."""
        seq = self.running[row]
        if self.prompt_cache is not None and seq.req.request.cache_prompt:
            self.prompt_cache.store(seq.picker.history[:seq.length], self.cache, row)  # its slots hold these
        last = len(self.running) - 1
        if row != last:
            moved = self.running[last]
            self.cache.move_row(last, row, moved.length)
            self.running[row] = moved
        self.running.pop()

    def run(self, requests: list[Sequence]) -> Iterator[tuple[Sequence, Chunk]]:
        """Every request to its end: the events as they come."""
        for r in requests:
            self.submit(r)
        while self.busy:
            yield from self.step()

