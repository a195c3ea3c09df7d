"""`llmcli batch IN.jsonl -o OUT.jsonl`: every request of a file, several decoded together.

Resumable (ids already in OUT are skipped), results appended a whole line at a time, and a
catch-up pass: a result that hits its token cap or fails its schema is tried again with twice the
cap, up to --retries times, then written as the --fallback value with `"fallback": true`.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from .cli import (CtxSize, Device, Dtype, FrequencyPenalty, GrammarFile, JsonSchema, MinP, Offline, PresencePenalty,
                  Quant, Regex, RegistryFile, RepeatLastN, RepeatPenalty, Seed, Stop, System, Temp, Threads, TopK, TopP,
                  Verbose, _stderr, app, check_text_options, read_grammar, sampling_params)
from .errors import InvalidParameterError, LlmcliError


@dataclass
class _Pending:
    """One job's current attempt."""

    job: object  # batch_jobs.Job
    prompt: list[int]
    grammar: object  # constrained.Grammar or None
    cap: int | None
    attempts: int = 1
    pieces: list[str] = field(default_factory=list)


@app.command()
def batch(
    model: Annotated[str, typer.Argument(help="The model (as for `llmcli run`).", show_default=False)],
    input: Annotated[str, typer.Argument(help="Requests, one JSON object a line: {\"id\": ..., \"prompt\": ...} or {\"id\": ..., \"messages\": [...]}; - reads stdin.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Results, one JSON object a line, appended; ids already in it are skipped (resume).", show_default=False)],
    rows: Annotated[int, typer.Option("--rows", help="Sequences decoded together (1: one at a time).")] = 8,
    retries: Annotated[int, typer.Option("--retries", help="Catch-up: tries again, with twice the token cap, after a result that hits its cap or fails its schema.")] = 2,
    fallback: Annotated[str, typer.Option("--fallback", help="The value (JSON) written, marked \"fallback\": true, when the retries run out.")] = "null",
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="Token cap per request (a line's max_tokens wins); doubled on each retry.")] = 256,
    temp: Temp = 0.8, top_k: TopK = 40, top_p: TopP = 0.95, min_p: MinP = 0.05,
    repeat_penalty: RepeatPenalty = 1.0, repeat_last_n: RepeatLastN = 64,
    presence_penalty: PresencePenalty = 0.0, frequency_penalty: FrequencyPenalty = 0.0,
    seed: Seed = -1, stop: Stop = None, system: System = None,
    raw: Annotated[bool, typer.Option("--raw", help="Send prompts as they are, without the chat template.")] = False,
    json_schema: JsonSchema = None, regex: Regex = None, grammar: GrammarFile = None,
    ctx_size: CtxSize = None, device: Device = "auto", dtype: Dtype = "auto", threads: Threads = None,
    quant: Quant = None, verbose: Verbose = False, registry: RegistryFile = None, offline: Offline = False,
):
    """Answer every request in INPUT (JSONL) into --output (JSONL), several sequences at a time."""
    from . import batch_jobs as bj
    from .cli_progress import download_progress
    from .runtime import open_model

    params = sampling_params(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n,
                             presence_penalty, frequency_penalty, seed)
    if rows < 1:
        raise InvalidParameterError(f"--rows must be at least 1, got {rows}")
    if retries < 0:
        raise InvalidParameterError(f"--retries must be >= 0, got {retries}")
    if max_tokens < 1:
        raise InvalidParameterError(f"--max-tokens must be at least 1, got {max_tokens}")
    try:
        fallback_value = json.loads(fallback)
    except json.JSONDecodeError as e:
        raise InvalidParameterError(f"--fallback must be JSON (null, \"text\", {{...}}), got {fallback!r} ({e.msg})") from None
    check_text_options(system, stop)
    command_grammar = read_grammar(json_schema, regex, grammar, stop)
    lines = _read_lines(input, output)
    done = bj.done_ids(output)
    parsed = list(bj.read_jobs(lines, done, system))
    jobs = [j for j in parsed if isinstance(j, bj.Job)]
    bad = [e for e in parsed if isinstance(e, bj.LineError)]
    err = _stderr()
    for e in bad:
        err.print(f"warning: {e}", markup=False, highlight=False)
    skipped = sum(1 for t in lines if t.strip()) - len(jobs) - len(bad)
    if skipped:
        err.print(f"{skipped} requests already in {output}; skipped", markup=False, highlight=False)
    if not jobs:
        _finish(err, bad, 0)
        return

    with download_progress(err) as progress:
        rt = open_model(model, device=device, dtype=dtype, threads=threads, ctx_size=ctx_size, quant=quant,
                        registry=registry, offline=offline, progress=progress)
    from .batched import BatchEngine

    engine = BatchEngine(rt.loaded.model, rt.loaded.tokenizer, rt.placement.device, rt.placement.dtype,
                         min(rows, len(jobs)), rt.ctx_size)
    runner = _Runner(rt, engine, params, max_tokens, tuple(stop or ()), raw, command_grammar, retries,
                     fallback_value, err)
    t0 = time.perf_counter()
    with bj.ResultWriter(output) as writer, _progress(err, len(jobs)) as bar:
        runner.run(jobs, writer, bar)
    seconds = time.perf_counter() - t0
    bad += runner.bad
    mean_batch = engine.row_steps / engine.steps if engine.steps else 0.0
    err.print(f"{writer.written} results in {seconds:.1f} s ({runner.retried} retried, {runner.fallbacks} fallbacks): "
              f"{runner.tokens} tokens, {runner.tokens / max(seconds, 1e-9):.1f} tokens/s; "
              f"{engine.rows} rows, {mean_batch:.1f} decoded together on average", markup=False, highlight=False)
    if verbose:
        err.print(f"[dim]{rt.placement.reason}; context {rt.ctx_size}; {engine.steps} batched steps[/dim]")
    _finish(err, bad, writer.written)


def _read_lines(input: str, output: Path) -> list[str]:
    from .text_input import check_text, read_stdin

    if input == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise InvalidParameterError("no input: pipe JSONL on stdin or pass a file")
        text = read_stdin()
    else:
        path = Path(input)
        if not path.is_file():
            raise InvalidParameterError(f"{path}: no such file; pass a JSONL file of requests (or - for stdin)")
        if output.exists() and path.resolve() == output.resolve():
            raise InvalidParameterError("-o/--output is the input file; results go to a file of their own")
        try:
            text = check_text(path.read_text(encoding="utf-8"), str(path))
        except UnicodeDecodeError:
            raise InvalidParameterError(f"{path} is not UTF-8 text; pass a JSONL file") from None
    if output.exists() and not output.is_file():
        raise InvalidParameterError(f"-o {output} is not a file")
    if not output.parent.is_dir():
        raise InvalidParameterError(f"-o {output}: the folder {output.parent} does not exist")
    return text.splitlines()


def _finish(err, bad: list, written: int) -> None:
    if bad:
        err.print(f"error: {len(bad)} input lines were skipped (see the warnings above); fix them and run again "
                  "to add their results", markup=False, highlight=False)
        raise typer.Exit(1)


class _progress:
    """A progress bar on stderr at a terminal; nothing otherwise (a log stays clean)."""

    def __init__(self, err, total: int):
        self.err, self.total, self.bar, self.task = err, total, None, None

    def __enter__(self):
        if self.err.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                                TimeRemainingColumn(), console=self.err, transient=False)
            self.bar.__enter__()
            self.task = self.bar.add_task("batch", total=self.total, rate="")
        return self

    def advance(self, rate: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, rate=rate)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)


class _Runner:
    def __init__(self, rt, engine, params, max_tokens, stop, raw, command_grammar, retries, fallback, err):
        self.rt, self.engine, self.params, self.max_tokens, self.stop, self.raw = rt, engine, params, max_tokens, stop, raw
        self.command_grammar, self.retries, self.fallback, self.err = command_grammar, retries, fallback, err
        self.compiler = None
        self.bad: list = []
        self.retried = self.fallbacks = self.tokens = 0
        self.t0 = time.perf_counter()

    def run(self, jobs, writer, bar) -> None:
        todo = iter(jobs)
        more = True
        while True:
            while more and len(self.engine.waiting) < self.engine.rows:  # a short queue: jobs are prepared as rows free
                job = next(todo, None)
                if job is None:
                    more = False
                else:
                    self._start(job)
            if not self.engine.busy:
                break
            for req, chunk in self.engine.step():
                p = req.tag
                p.pieces.append(chunk.text)
                if chunk.finish_reason is not None:
                    self.tokens += chunk.stats.completion_tokens
                    if self._finished(p, req, chunk, writer):
                        bar.advance(f"{self.tokens / (time.perf_counter() - self.t0):.1f} tokens/s")

    def _start(self, job) -> None:
        from .batch_jobs import LineError

        try:
            grammar = self._grammar(job)
            prompt = self.rt.prompt_ids(job.messages, raw=self.raw)
            p = _Pending(job, prompt, grammar, job.max_tokens or self.max_tokens)
            self._submit(p)
        except LlmcliError as e:
            self.bad.append(LineError(job.line, str(e)))
            self.err.print(f"warning: line {job.line} (id {job.key}): {e}", markup=False, highlight=False)

    def _grammar(self, job):
        if job.schema is None:
            return self.command_grammar
        from .constrained import from_json_schema

        return from_json_schema(json.dumps(job.schema), f"line {job.line}'s json_schema")

    def _submit(self, p: _Pending) -> None:
        from .batched import Request

        constraint = None
        if p.grammar is not None:
            if self.compiler is None:
                from .constrained import GrammarCompiler

                self.compiler = GrammarCompiler(self.rt.loaded.tokenizer)
            constraint = self.compiler.constraint(p.grammar)
        params = self.params.with_(**p.job.sampling) if p.job.sampling else self.params
        p.pieces = []
        # a prompt with no room raises PromptTooLongError here: _start reports it as this line's error
        self.engine.submit(Request(p.prompt, params, p.cap, p.job.stop or self.stop, constraint, tag=p))

    def _finished(self, p: _Pending, req, chunk, writer) -> bool:
        """Write the result, or submit the next attempt (False)."""
        from .batch_jobs import next_cap
        from .errors import InvalidOutputError

        text, reason, stats = "".join(p.pieces), chunk.finish_reason, chunk.stats
        room = self.engine.max_len - len(p.prompt)
        problem, value = None, None
        if reason == "length":
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
                return False
        usage = {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens}
        if problem is not None:
            self.fallbacks += 1
            writer.write({"id": p.job.id, "fallback": True, "value": self.fallback, "error": problem, "text": text,
                          "finish_reason": reason, "attempts": p.attempts, "usage": usage})
        else:
            result = {"id": p.job.id, "text": text, "finish_reason": reason, "attempts": p.attempts, "usage": usage}
            if value is not None or (p.grammar is not None and p.grammar.kind == "json_schema"):
                result["json"] = value
            writer.write(result)
        return True
