"""`llmcli embed MODEL [TEXT|-]`: texts -> JSON vectors on stdout.

One text (TEXT, or all of stdin) gives one JSON object; with --lines every non-empty line of the
input is a text, and with --jsonl every line is {"id": ..., "text": ...}: one JSON object a line
comes out for each, in the input's order, written as each batch is done.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Optional

import typer

from ..errors import InvalidParameterError
from .options import CtxSize, Device, Dtype, ModelArg, Offline, RegistryFile, Threads, model_flags, stderr_console

CHUNK = 256  # texts read, embedded and written at a time (--lines, --jsonl)
POOLINGS = ("mean", "cls", "last", "max")


def embed(
    model: ModelArg,
    text: Annotated[Optional[str], typer.Argument(help="The text; read from stdin when absent or '-'.", show_default=False)] = None,
    lines: Annotated[bool, typer.Option("--lines", help="Each non-empty line of the input is a text: one JSON object a line, {\"index\", \"tokens\", \"embedding\"}, in input order.")] = False,
    jsonl: Annotated[bool, typer.Option("--jsonl", help="Each line of the input is {\"id\": ..., \"text\": ...}: one JSON object a line, {\"id\", \"tokens\", \"embedding\"}.")] = False,
    pooling: Annotated[Optional[str], typer.Option("--pooling", help="mean | cls | last | max (default: as the model's files say; a text-generation model needs one, e.g. last).", show_default=False)] = None,
    normalize: Annotated[Optional[bool], typer.Option("--normalize/--no-normalize", help="Unit-length vectors (default: as the model says; normalized when it says nothing).", show_default=False)] = None,
    truncate: Annotated[bool, typer.Option("--truncate", help="Cut a text longer than the model takes to fit (its end is dropped); without it such a text is an error.")] = False,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Texts embedded together in one pass.")] = 32,
    ctx_size: CtxSize = None, device: Device = "auto", dtype: Dtype = "auto", threads: Threads = None,
    registry: RegistryFile = None, offline: Offline = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="The pooling, the vectors' size and the speed on stderr.")] = False,
):
    """Write the embedding of TEXT as JSON: {"tokens": N, "embedding": [...]}. With --lines or --jsonl,
    one JSON object a line for each line of the input."""
    from ..runtime.lean import open_lean
    from .startup import opening

    if lines and jsonl:
        raise InvalidParameterError("--lines and --jsonl read the input in two different ways; pass one")
    if pooling is not None and pooling not in POOLINGS:
        raise InvalidParameterError(f"--pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    if batch_size < 1:
        raise InvalidParameterError(f"--batch-size must be at least 1, got {batch_size}")
    source = _input(text, lines or jsonl)
    err = stderr_console()
    with opening(err) as progress:
        flags = model_flags(model, device=device, dtype=dtype, threads=threads, ctx_size=ctx_size,
                            registry=registry, offline=offline, allow_encoder=True)
        rt = open_lean(flags, progress=progress)  # a causal GGUF on the CPU: without torch (runtime/lean.py)
        if rt is None:
            from ..runtime.runtime import open_model

            rt = open_model(flags, progress)
    embedder = rt.embedder(pooling, normalize, batch_size)
    if verbose:
        err.print(f"{rt.loaded.name}: {embedder.dimensions} dimensions, {embedder.pooling.describe()}, at most "
                  f"{embedder.max_tokens} tokens a text; {rt.placement.reason}", markup=False, style="dim")
    t0, count, tokens = time.perf_counter(), 0, 0
    if not (lines or jsonl):
        ids = embedder.ids(source, truncate)
        _write({"tokens": len(ids)}, embedder.embed([ids])[0])
        count, tokens = 1, len(ids)
    else:
        for batch in _chunks(_records(source, jsonl)):
            framed = [embedder.ids(t, truncate, f"line {n}") for n, _, t in batch]
            for (n, key, _), ids, vector in zip(batch, framed, embedder.embed(framed)):
                _write({("id" if jsonl else "index"): key, "tokens": len(ids)}, vector)
            sys.stdout.flush()
            count, tokens = count + len(batch), tokens + sum(map(len, framed))
    if verbose:
        seconds = time.perf_counter() - t0
        err.print(f"{count} texts, {tokens} tokens in {seconds:.2f} s ({count / max(seconds, 1e-9):.1f} texts/s)",
                  markup=False, style="dim")


def _input(text: str | None, by_line: bool):
    """TEXT, or stdin: the whole of it for one text; for --lines/--jsonl an iterator of (line number, line)."""
    from ..json_input import jsonl_lines
    from ..text_input import check_text, line_text, read_stdin, stdin_lines

    if text is not None and text != "-":
        check_text(text, "the text")
        if by_line:  # lines end at \n alone, as stdin's do (a text may hold U+2028)
            return enumerate((line.removesuffix("\r") for line in jsonl_lines(text)), 1)
        if not text.strip():
            raise InvalidParameterError("the text is empty; pass some text")
        return text
    if sys.stdin is None or sys.stdin.isatty():
        raise InvalidParameterError("no text: pass TEXT as an argument or pipe it on stdin")
    if by_line:
        return ((n, line_text(n, line)) for n, line in stdin_lines())
    whole = read_stdin()
    if not whole.strip():
        raise InvalidParameterError("stdin was empty; pipe some text in or pass TEXT as an argument")
    return whole


def _records(numbered, jsonl: bool):
    """(line number, index or id, text) of each non-empty line."""
    from ..json_input import load_json

    index = 0
    for n, line in numbered:
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        if not jsonl:
            yield n, index, line
            index += 1
            continue
        record = load_json(line, f"line {n}")
        if not isinstance(record, dict) or not isinstance(record.get("text"), str) or not record["text"].strip():
            raise InvalidParameterError(f"line {n} must be a JSON object with a non-empty \"text\" (and an optional \"id\")")
        key = record.get("id", index)
        if not isinstance(key, (str, int)) or isinstance(key, bool):
            raise InvalidParameterError(f"line {n}: \"id\" must be a string or a whole number")
        yield n, key, record["text"]
        index += 1


def _chunks(records):
    batch = []
    for record in records:
        batch.append(record)
        if len(batch) == CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


def _write(obj: dict, vector) -> None:
    """One line: `obj`, then "embedding" in the shortest decimals that read back as the same float32s."""
    from ..runtime.embedder import floats_json

    sys.stdout.write(f'{json.dumps(obj, ensure_ascii=False)[:-1]}, "embedding": {floats_json(vector)}}}\n')
