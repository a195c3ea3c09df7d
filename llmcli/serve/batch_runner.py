"""The scheduler behind `llmcli batch`: every job of a JSONL file through one BatchEngine, with
catch-up retries and a marked fallback.

A job is submitted as rows free up (a short queue, so prompts are tokenized as they are needed). A
result that hits its token cap, or fails its schema, is tried again with twice the cap, up to
`retries` times, then written as the `fallback` value with `"fallback": true`. Results are written
as they finish (batch_jobs.ResultWriter); `run` yields what happened, for the CLI to show.

    runner = BatchRunner(rt, engine, raw=False, retries=2, fallback=None)
    for kind, what in runner.run(jobs, writer):   # ("written", result) or ("bad", LineError)
        ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..decode.batched import Sequence
from ..decode.think_first import think_first
from ..errors import InvalidOutputError, LlmcliError
from .batch_jobs import LineError, next_cap


@dataclass
class Pending:
    """One job's current attempt."""

    job: object  # batch_jobs.Job
    prompt: list[int]
    cap: int | None
    attempts: int = 1
    pieces: list[str] = field(default_factory=list)
    thoughts: list[str] = field(default_factory=list)  # a reasoning model's thinking


class BatchRunner:
    """`rt` a runtime.Runtime; `engine` its BatchEngine; each job carries its request (the command's
    flags with its line's fields)."""

    def __init__(self, rt, engine, *, raw: bool, retries: int, fallback):
        self.rt, self.engine, self.raw, self.retries, self.fallback = rt, engine, raw, retries, fallback
        self.retried = self.fallbacks = self.tokens = 0

    def run(self, jobs, writer):
        """Every job to its result, written with `writer`; yields ("written", result dict) as each is
        written, and ("bad", LineError) for a job that cannot start (its line's error)."""
        todo = iter(jobs)
        more = True
        while True:
            while more and len(self.engine.waiting) < self.engine.rows:  # a short queue: jobs are prepared as rows free
                job = next(todo, None)
                if job is None:
                    more = False
                    continue
                bad = self._start(job)
                if bad is not None:
                    yield "bad", bad
            if not self.engine.busy:
                return
            for req, chunk in self.engine.step():
                p = req.tag
                p.pieces.append(chunk.text)
                p.thoughts.append(chunk.reasoning)
                if chunk.finish_reason is not None:
                    self.tokens += chunk.stats.completion_tokens
                    result = self._finished(p, chunk)
                    if result is not None:
                        writer.write(result)
                        yield "written", result

    def _start(self, job) -> LineError | None:
        try:
            prompt = self.rt.prompt_ids(job.messages, raw=self.raw, request=job.request)
            self._submit(Pending(job, prompt, job.request.max_tokens))
        except LlmcliError as e:  # a prompt with no room raises PromptTooLongError in submit
            return LineError(job.line, str(e), job.key)
        return None

    def _submit(self, p: Pending) -> None:
        request = p.job.request.with_(max_tokens=p.cap) if p.cap != p.job.request.max_tokens else p.job.request
        p.pieces, p.thoughts = [], []
        reasoning = self.rt.reasoning(p.prompt, request)
        constraint = think_first(reasoning, self.rt.constraint(request), self.rt.loaded.tokenizer.eos_ids)
        self.engine.submit(Sequence(p.prompt, request, constraint, tag=p, reasoning=reasoning))

    def _finished(self, p: Pending, chunk) -> dict | None:
        """The result to write, or None when the next attempt was submitted instead."""
        text, reason, stats, grammar = "".join(p.pieces), chunk.finish_reason, chunk.stats, p.job.request.grammar
        room = self.engine.max_len - len(p.prompt)
        problem, value = None, None
        if reason == "length" and chunk.stopped_by == "context":
            problem = f"the context ({self.engine.max_len} tokens) filled after {stats.completion_tokens} tokens"
        elif reason == "length":
            problem = f"the output reached its cap of {stats.completion_tokens} tokens"
        elif grammar is not None:
            try:
                grammar.check_output(text)
                value = json.loads(text) if grammar.kind == "json_schema" else None
            except InvalidOutputError as e:
                problem = str(e)
        if problem is not None and p.attempts <= self.retries:
            cap = next_cap(min(p.cap, room) if p.cap else room, room)
            if cap is not None or reason != "length":
                p.cap = cap or p.cap
                p.attempts += 1
                self.retried += 1
                self._submit(p)
                return None
        usage = {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens}
        why = {"stopped_by": chunk.stopped_by} if chunk.stopped_by else {}
        if self.rt.reasoning_format is not None:  # a reasoning model's thinking beside its answer
            why["reasoning"] = "".join(p.thoughts)
            usage["reasoning_tokens"] = stats.reasoning_tokens
        if problem is not None:
            self.fallbacks += 1
            return {"id": p.job.id, "fallback": True, "value": self.fallback, "error": problem, "text": text,
                    "finish_reason": reason, **why, "attempts": p.attempts, "usage": usage}
        result = {"id": p.job.id, "text": text, "finish_reason": reason, **why, "attempts": p.attempts, "usage": usage}
        if value is not None or (grammar is not None and grammar.kind == "json_schema"):
            result["json"] = value
        return result
