"""`llmcli batch IN.jsonl -o OUT.jsonl`: every request of a file, several decoded together.

Resumable (ids already in OUT are skipped), results appended a whole line at a time, and a
catch-up pass: a result that hits its token cap or fails its schema is tried again with twice the
cap, up to --retries times, then written as the --fallback value with `"fallback": true`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ..errors import InvalidParameterError
from .options import (CacheRam, CtxSize, Device, Dtype, FrequencyPenalty, GrammarFile, JsonSchema, MinP, Offline, PresencePenalty,
                      Quant, ReasoningBudget, Regex, RegistryFile, RepeatLastN, RepeatPenalty, Seed, Stop, System, Temp,
                      Think, Threads, TopK, TopP, Verbose, cache_ram_bytes, check_text_options, check_thinks,
                      model_flags, read_grammar, sampling_params, stderr_console)


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
    cache_ram: CacheRam = None, think: Think = None, reasoning_budget: ReasoningBudget = None,
):
    """Answer every request in INPUT (JSONL) into --output (JSONL), several sequences at a time."""
    from ..decode.request import Request
    from ..serve import batch_jobs as bj

    _check_numbers(rows, retries)
    request = Request(sampling_params(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty,
                                      frequency_penalty, seed),
                      max_tokens, tuple(stop or ()), grammar=read_grammar(json_schema, regex, grammar), think=think,
                      reasoning_budget=reasoning_budget)
    prompt_cache = cache_ram_bytes(cache_ram)
    fallback_value = _fallback(fallback)
    check_text_options(system)
    lines = _read_lines(input, output)
    with bj.output_lock(output):  # a second run on the same -o would write every result again
        parsed = list(bj.read_jobs(lines, bj.done_ids(output), system, request))
        jobs = [j for j in parsed if isinstance(j, bj.Job)]
        bad = [e for e in parsed if isinstance(e, bj.LineError)]
        err = stderr_console()
        for e in bad:
            err.print(f"warning: {e}", markup=False, highlight=False)
        skipped = sum(1 for t in lines if t.strip()) - len(jobs) - len(bad)
        if skipped:
            err.print(f"{skipped} requests already in {output}; skipped", markup=False, highlight=False)
        if jobs:
            flags = model_flags(model, device=device, dtype=dtype, threads=threads, ctx_size=ctx_size, quant=quant,
                                registry=registry, offline=offline, rows=min(rows, len(jobs)))
            bad += _run(err, flags, jobs, output, verbose, prompt_cache, request, raw=raw, retries=retries,
                        fallback=fallback_value)
        if bad:
            err.print(f"error: {len(bad)} input lines were skipped (see the warnings above); fix them and run again "
                      "to add their results", markup=False, highlight=False)
            raise typer.Exit(1)


def _check_numbers(rows: int, retries: int) -> None:
    if rows < 1:
        raise InvalidParameterError(f"--rows must be at least 1, got {rows}")
    if retries < 0:
        raise InvalidParameterError(f"--retries must be >= 0, got {retries}")


def _fallback(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidParameterError(f"--fallback must be JSON (null, \"text\", {{...}}), got {text!r} ({e.msg})") from None


def _run(err, flags, jobs, output: Path, verbose: bool, prompt_cache: int | None, request, **settings) -> list:
    """Load the model, answer the jobs into `output`; returns the lines that could not start.
    `settings`: BatchRunner's (raw, retries, fallback)."""
    from ..runtime.lean import open_lean
    from ..serve.batch_jobs import ResultWriter
    from ..serve.batch_runner import BatchRunner
    from .startup import opening

    with opening(err) as progress:  # (the torch-free path where it runs the model: runtime/lean.py)
        rt = open_lean(flags, None, progress)
        if rt is None:
            from ..runtime.runtime import open_model

            rt = open_model(flags, progress)
    check_thinks(rt, request)  # the command's --think and --reasoning-budget
    engine = rt.batch_engine(flags.rows, prompt_cache=prompt_cache)  # retries and shared system prompts reuse KV
    runner = BatchRunner(rt, engine, **settings)
    t0, bad = time.perf_counter(), []
    with ResultWriter(output) as writer, _progress(err, len(jobs)) as bar:
        for kind, what in runner.run(jobs, writer):
            if kind == "bad":
                bad.append(what)
                err.print(f"warning: {what}", markup=False, highlight=False)
            else:
                bar.advance(f"{runner.tokens / (time.perf_counter() - t0):.1f} tokens/s")
    seconds = time.perf_counter() - t0
    mean_batch = engine.row_steps / engine.steps if engine.steps else 0.0
    err.print(f"{writer.written} results in {seconds:.1f} s ({runner.retried} retried, {runner.fallbacks} fallbacks): "
              f"{runner.tokens} tokens, {runner.tokens / max(seconds, 1e-9):.1f} tokens/s; "
              f"{engine.rows} rows, {mean_batch:.1f} decoded together on average", markup=False, highlight=False)
    if verbose:
        cache = engine.prompt_cache
        reused = f"; {cache.reused_tokens} prompt tokens taken from the prompt cache" if cache is not None else ""
        err.print(f"[dim]{rt.placement.reason}; context {rt.ctx_size}; {engine.steps} batched steps{reused}[/dim]")
    return bad


def _read_lines(input: str, output: Path) -> list[str]:
    from ..json_input import jsonl_lines
    from ..text_input import MAX_DATA_BYTES, read_stdin, read_text_file

    if input == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise InvalidParameterError("no input: pipe JSONL on stdin or pass a file")
        text = read_stdin(limit=MAX_DATA_BYTES)
    else:
        path = Path(input)
        if not path.exists():
            raise InvalidParameterError(f"{path}: no such file; pass a JSONL file of requests (or - for stdin)")
        if output.exists() and path.resolve() == output.resolve():
            raise InvalidParameterError("-o/--output is the input file; results go to a file of their own")
        text = read_text_file(path, limit=MAX_DATA_BYTES)
    if output.exists() and not output.is_file():
        raise InvalidParameterError(f"-o {output} is not a file")
    if not output.parent.is_dir():
        raise InvalidParameterError(f"-o {output}: the folder {output.parent} does not exist")
    return jsonl_lines(text)


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


