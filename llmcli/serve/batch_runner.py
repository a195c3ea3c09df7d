"""The scheduler behind `llmcli batch`: every job of a JSONL file through one BatchEngine, with
catch-up retries and a marked fallback.

A job is submitted as rows free up (a short queue, so prompts are tokenized as they are needed). A
result that hits its token cap, or fails its schema, is tried again with twice the cap, up to
`retries` times, then written as the `fallback` value with `"fallback": true`. Results are written
as they finish (batch_jobs.ResultWriter); `run` yields what happened, for the CLI to show.

    runner = BatchRunner(rt, engine, params, max_tokens=256, stop=(), raw=False, grammar=None,
                         retries=2, fallback=None)
    for kind, what in runner.run(jobs, writer):   # ("written", result) or ("bad", LineError)
        ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..decode.batched import Request
from ..decode.constrained import GrammarCompiler, from_json_schema
from ..errors import InvalidOutputError, LlmcliError
from .batch_jobs import LineError, next_cap


@dataclass
class Pending:
    """One job's current attempt."""

    job: object  # batch_jobs.Job
    prompt: list[int]
    grammar: object  # constrained.Grammar or None
    cap: int | None
    attempts: int = 1
    pieces: list[str] = field(default_factory=list)


class BatchRunner:
    """`rt` a runtime.Runtime; `engine` its BatchEngine; `params` the command's SamplingParams (a
    line's own fields override them); `grammar` the command's constraint (a line's json_schema wins)."""

    def __init__(self, rt, engine, params, *, max_tokens: int, stop: tuple[str, ...], raw: bool, grammar,
                 retries: int, fallback):
        self.rt, self.engine, self.params, self.max_tokens, self.stop, self.raw = rt, engine, params, max_tokens, stop, raw
        self.command_grammar, self.retries, self.fallback = grammar, retries, fallback
        self.compiler = None  # GrammarCompiler, built with the first constrained job
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
                if chunk.finish_reason is not None:
                    self.tokens += chunk.stats.completion_tokens
                    result = self._finished(p, chunk)
                    if result is not None:
                        writer.write(result)
                        yield "written", result

    def _start(self, job) -> LineError | None:
        try:
            grammar = self._grammar(job)
            prompt = self.rt.prompt_ids(job.messages, raw=self.raw)
            self._submit(Pending(job, prompt, grammar, job.max_tokens or self.max_tokens))
        except LlmcliError as e:  # a prompt with no room raises PromptTooLongError in submit
            return LineError(job.line, str(e), job.key)
        return None

    def _grammar(self, job):
        if job.schema is None:
            return self.command_grammar
        return from_json_schema(json.dumps(job.schema), f"line {job.line}'s json_schema")

    def _submit(self, p: Pending) -> None:
        constraint = None
        if p.grammar is not None:
            if self.compiler is None:
                self.compiler = GrammarCompiler(self.rt.loaded.tokenizer)
            constraint = self.compiler.constraint(p.grammar)
        params = self.params.with_(**p.job.sampling) if p.job.sampling else self.params
        p.pieces = []
        self.engine.submit(Request(p.prompt, params, p.cap, p.job.stop or self.stop, constraint, tag=p))

    def _finished(self, p: Pending, chunk) -> dict | None:
        """The result to write, or None when the next attempt was submitted instead."""
        text, reason, stats = "".join(p.pieces), chunk.finish_reason, chunk.stats
        room = self.engine.max_len - len(p.prompt)
        problem, value = None, None
        if reason == "length" and chunk.stopped_by == "context":
            problem = f"the context ({self.engine.max_len} tokens) filled after {stats.completion_tokens} tokens"
        elif reason == "length":
            problem = f"the output reached its cap of {stats.completion_tokens} tokens"
        elif p.grammar is not None:
            try:
                p.grammar.check_output(text)
                value = json.loads(text) if p.grammar.kind == "json_schema" else None
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
        if problem is not None:
            self.fallbacks += 1
            return {"id": p.job.id, "fallback": True, "value": self.fallback, "error": problem, "text": text,
                    "finish_reason": reason, **why, "attempts": p.attempts, "usage": usage}
        result = {"id": p.job.id, "text": text, "finish_reason": reason, **why, "attempts": p.attempts, "usage": usage}
        if value is not None or (p.grammar is not None and p.grammar.kind == "json_schema"):
            result["json"] = value
        return result
