"""`llmcli batch`'s files: requests in (JSONL), results out (JSONL, appended a line at a time).

Input, one JSON object a line:

    {"id": "q1", "prompt": "Name a colour."}                         through the chat template
    {"id": 7, "messages": [{"role": "user", "content": "Hi"}]}        a whole conversation
    optional: "system", "max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "stop",
              "json_schema" (a schema object: this line's output must validate)

Each line's request is the command's (its flags) with the line's own fields: one decode.Request,
checked when the line is read. A bad line (not JSON, no id, a duplicate id, a wrong field, fields
that do not combine) becomes a LineError naming its line number; the other lines go on.

Output: one JSON object a line, each written with a single `write` to a file opened for appending
and synced, so a crash leaves at most a partial last line, which `done_ids` (the resume) cuts off
before anything is appended.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from ..decode.constrained import from_json_schema
from ..decode.request import Request
from ..errors import InvalidParameterError, LlmcliError
from ..json_input import JsonInputError, jsonl_lines, load_json

# line field -> SamplingParams field
SAMPLING_FIELDS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                   "seed": "seed", "repeat_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
                   "frequency_penalty": "frequency_penalty"}
KNOWN_FIELDS = {"id", "prompt", "messages", "system", "max_tokens", "stop", "json_schema", "reasoning_budget",
                *SAMPLING_FIELDS}
ROLES = ("system", "user", "assistant")
SPELLING = {"stop": '"stop"', "max_tokens": '"max_tokens"', "reasoning_budget": '"reasoning_budget"',
            "grammar": '"json_schema" (or --json-schema, --regex, --grammar)'}  # how a line's checks name fields


@dataclass
class Job:
    id: object  # str or int, as written in the input
    line: int  # 1-based line number in the input
    messages: list[dict]
    request: Request  # the command's, with this line's fields

    @property
    def key(self) -> str:
        return id_key(self.id)


@dataclass
class LineError:
    line: int
    message: str
    key: str | None = None  # the job's id (id_key) once the line was read

    def __str__(self) -> str:
        return f"line {self.line}{f' (id {self.key})' if self.key is not None else ''}: {self.message}"


def id_key(value) -> str:
    """Ids compare by their JSON text: 1 and "1" are different ids."""
    return json.dumps(value, ensure_ascii=False)


def read_jobs(lines: Iterable[str], done: set[str] = frozenset(), system: str | None = None,
              request: Request = Request()) -> Iterator[Job | LineError]:
    """Jobs in input order, skipping ids in `done` (already in the output); blank lines are ignored.
    `request`: the command's, which each line's fields change."""
    seen: dict[str, int] = {}
    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            job = parse_line(text, n, system, request)
        except LlmcliError as e:
            yield LineError(n, str(e), getattr(e, "key", None))
            continue
        if job.key in seen:
            yield LineError(n, f"duplicate id {job.key} (first on line {seen[job.key]}); skipped")
            continue
        seen[job.key] = n
        if job.key not in done:
            yield job


def parse_line(text: str, n: int, system: str | None = None, request: Request = Request()) -> Job:
    try:
        obj = load_json(text, f"line {n}")  # bounded in size and depth, as every JSON input
    except JsonInputError as e:
        raise InvalidParameterError(e.detail) from None
    if not isinstance(obj, dict):
        raise InvalidParameterError(f"expected a JSON object, got {type(obj).__name__}")
    if "id" not in obj:
        raise InvalidParameterError('no "id": every line needs a stable id (a string or a whole number)')
    job_id = obj["id"]
    if isinstance(job_id, bool) or not isinstance(job_id, (str, int)):
        raise InvalidParameterError(f'"id" must be a string or a whole number, got {id_key(job_id)}')
    try:
        unknown = sorted(set(obj) - KNOWN_FIELDS)
        if unknown:
            raise InvalidParameterError(f"unknown field {unknown[0]!r}; known: {', '.join(sorted(KNOWN_FIELDS))}")
        messages = _messages(obj, system)
        return Job(job_id, n, messages, request.with_(SPELLING, **_request_fields(obj, request, n)))
    except LlmcliError as e:  # the line's id is known: its error names it
        raise LineRefused(str(e), id_key(job_id)) from None


class LineRefused(InvalidParameterError):
    """A line whose id was read but whose request was not: `key` names the id."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


def _request_fields(obj: dict, request: Request, n: int) -> dict:
    """What a line's own fields change in the command's request."""
    fields = {}
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidParameterError(f'"max_tokens" must be a whole number >= 1, got {id_key(max_tokens)}')
        fields["max_tokens"] = max_tokens
    if obj.get("stop"):
        stop = obj["stop"]
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise InvalidParameterError('"stop" must be a string or a list of strings')
        fields["stop"] = tuple(stop)
    sampling = {}
    for key, name in SAMPLING_FIELDS.items():
        if key in obj:
            value = obj[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidParameterError(f'"{key}" must be a number, got {id_key(value)}')
            sampling[name] = value
    if sampling:
        fields["sampling"] = request.sampling.with_(**sampling)
    budget = obj.get("reasoning_budget")
    if budget is not None:  # a reasoning model's thinking tokens (-1: no limit, as llama-server's)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < -1:
            raise InvalidParameterError(f'"reasoning_budget" must be a whole number >= -1, got {id_key(budget)}')
        fields["reasoning_budget"] = None if budget == -1 else budget
    schema = obj.get("json_schema")
    if schema is not None:
        if not isinstance(schema, (dict, bool)):
            raise InvalidParameterError('"json_schema" must be a JSON Schema object')
        fields["grammar"] = from_json_schema(json.dumps(schema), f"line {n}'s json_schema")
    return fields


def _messages(obj: dict, system: str | None) -> list[dict]:
    if ("prompt" in obj) == ("messages" in obj):
        raise InvalidParameterError('give either "prompt" (a string) or "messages" (a list), not both or neither')
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise InvalidParameterError('"prompt" must be a non-empty string')
        own_system = obj.get("system", system)
        if own_system is not None and not isinstance(own_system, str):
            raise InvalidParameterError('"system" must be a string')
        return ([{"role": "system", "content": own_system}] if own_system else []) + \
            [{"role": "user", "content": obj["prompt"]}]
    messages = obj["messages"]
    if not isinstance(messages, list) or not messages:
        raise InvalidParameterError('"messages" must be a non-empty list')
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise InvalidParameterError(f'each message needs a "role" ({", ".join(ROLES)}) and a string "content"')
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def done_ids(out: Path) -> set[str]:
    """The ids already in the output file (the resume). A partial last line (a crash mid-write) is
    cut off first; any other line that is not a result means the file is not ours: an error."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(out, "r+b") as f:  # drop the torn tail; every complete line stays as it was
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    ids = set()
    for n, line in enumerate(jsonl_lines(data[:end].decode("utf-8", errors="replace")), start=1):
        if not line.strip():
            continue
        try:
            ids.add(id_key(load_json(line, f"{out} line {n}")["id"]))
        except (JsonInputError, KeyError, TypeError):
            raise InvalidParameterError(f"{out} line {n} is not a result of llmcli batch; "
                                        "pass another -o file (results are appended to it)") from None
    return ids


class OutputBusyError(LlmcliError):
    """Another process is writing the same results file."""


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold the output's lock for a whole run, as pip and ollama lock what they write: two runs
    appending to one file would each read the ids done before the other wrote, and answer every
    request twice. The lock is `.NAME.lock` beside the file (the real one, through symlinks), and
    stays there, as filelock leaves it (unlinking a lock file breaks the exclusion)."""
    from filelock import FileLock, Timeout

    real = out.resolve()
    path = real.parent / f".{real.name}.lock"
    lock = FileLock(str(path), blocking=False)
    try:
        lock.acquire()
    except Timeout:
        raise OutputBusyError(f"another llmcli batch is writing {out} (it holds {path}); wait for it to end "
                              "or pass another -o file") from None
    except OSError as e:
        raise OutputBusyError(f"cannot lock {out} ({e.strerror or e}: {path}); pass an -o file in a folder you "
                              "can write to") from None
    try:
        yield
    finally:
        lock.release()


class ResultWriter:
    """Appends one JSON object a line, each with one write() and an fsync: a line is in the file
    whole or (after a crash mid-write) cut off by the next resume, never interleaved."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.written = 0

    def write(self, result: dict) -> None:
        data = (json.dumps(result, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:  # one call for any line a pipe or file takes whole; the loop is for the odd short write
            view = view[os.write(self.fd, view):]
        os.fsync(self.fd)
        self.written += 1

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def next_cap(cap: int | None, room: int) -> int | None:
    """Catch-up: the token cap of a retry after a result hit `cap` (twice as many, up to the room the
    context leaves), or None when it cannot grow."""
    if cap is None or cap >= room:
        return None
    return min(2 * cap, room)
