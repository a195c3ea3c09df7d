"""JSON from outside (a request body, a schema file, a batch line, a saved chat): parsed within
explicit limits, or one InvalidParameterError (JsonInputError) that says which limit.

    obj = load_json(text_or_bytes, "the request body")

Python's parser recurses once per level of nesting: 10,000 levels end in a RecursionError, and a
few hundred get through it only to overflow what reads the result next (jsonschema recurses too,
and llguidance compiles a schema on its native stack; ~100 levels already overflowed jsonschema).
So the size (MAX_JSON_BYTES of UTF-8) and the depth (MAX_JSON_DEPTH levels) are checked before
parsing, in linear time. Every string in the result, keys included, is valid Unicode: a lone
surrogate such as "\\ud800" (legal JSON, but not text) is refused, since no tokenizer or UTF-8
encoder takes it. No real input comes near the limits: JSON Schemas nest a few levels, OpenAI's API
allows 5 to 10.
"""

from __future__ import annotations

import json
import re

import numpy as np

from .errors import InvalidParameterError

MAX_JSON_BYTES = 16 << 20  # bytes of JSON text (UTF-8); a chat at a 128k-token context is ~1 MB
MAX_JSON_DEPTH = 64  # levels of nested objects and arrays

# a JSON string, or an unterminated one up to the end (so that no match fails and rescans: linear time)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_STEP = np.zeros(256, np.int8)  # byte -> its change of depth
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class JsonInputError(InvalidParameterError):
    """JSON that is malformed or over a limit. `detail` is the message without the name of the
    input, for callers that put it in their own words (`line 3: not valid JSON ...`)."""

    def __init__(self, what: str, detail: str):
        super().__init__(f"{what} is {detail}")
        self.detail = detail


def limits() -> str:
    return f"llmcli reads JSON of up to {MAX_JSON_BYTES >> 20} MiB and {MAX_JSON_DEPTH} levels of nesting"


def load_json(data: str | bytes, what: str, *, max_bytes: int | None = None, max_depth: int | None = None):
    """The value `data` holds; `what` names it in errors ("the request body", "line 3 of in.jsonl").
    A caller reading a file or a stream reads at most max_bytes + 1 bytes, so that this refuses it."""
    max_bytes = MAX_JSON_BYTES if max_bytes is None else max_bytes
    max_depth = MAX_JSON_DEPTH if max_depth is None else max_depth
    size = len(data) if isinstance(data, bytes) else _utf8_size(data, what)
    if size > max_bytes:
        raise JsonInputError(what, f"{size} bytes of JSON, larger than the limit of {max_bytes} ({limits()})")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")  # a leading byte order mark is ignored, as RFC 8259 allows
        except UnicodeDecodeError as e:
            raise JsonInputError(what, f"not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    data = data.removeprefix("\ufeff")  # a str read as text keeps it
    _check_depth(data, what, max_depth)
    try:
        value = json.loads(data)
    except json.JSONDecodeError as e:
        raise JsonInputError(what, f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:  # cannot happen below the depth cap; kept so that it never escapes as a traceback
        raise JsonInputError(what, f"nested more than {max_depth} levels deep ({limits()})") from None
    except ValueError as e:  # an integer of more than 4300 digits (int_max_str_digits)
        raise JsonInputError(what, f"not usable JSON: {' '.join(str(e).split())[:120]}") from None
    if _SURROGATE_ESCAPE.search(data):  # only escapes make surrogates: the text itself is valid UTF-8
        _check_strings(value, what)
    return value


def jsonl_lines(text: str) -> list[str]:
    """The lines of JSON Lines text: they end at "\n" alone (a "\r" before it is JSON whitespace).
    Not str.splitlines(), which also splits at U+2028, U+2029 and U+0085, all legal inside a JSON
    string: a good line holding one became two bad ones, and its answer was lost."""
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def _utf8_size(text: str, what: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as e:  # a str from argv or a text stream with undecodable bytes
        raise JsonInputError(what, f"not UTF-8 text (a byte at character {e.start} is not)") from None


def _check_depth(text: str, what: str, max_depth: int) -> None:
    """The deepest bracket nesting outside strings, in C and numpy (a Python loop over megabytes of
    brackets takes seconds). Exact for valid JSON; invalid JSON may be refused for its depth."""
    if text.count("[") + text.count("{") <= max_depth:  # cannot be deeper: the common case
        return
    codes = np.frombuffer(_STRING.sub("", text).encode("utf-8"), dtype=np.uint8)
    if codes.size and int(np.cumsum(_STEP[codes], dtype=np.int32).max()) > max_depth:
        raise JsonInputError(what, f"nested more than {max_depth} levels deep ({limits()})")


def _check_strings(value, what: str) -> None:
    """Every str in `value` encodes to UTF-8; else an error naming where (depth is already capped)."""
    stack = [(value, "")]
    while stack:
        v, where = stack.pop()
        if isinstance(v, str):
            _text(v, what, where)
        elif isinstance(v, list):
            stack += [(x, f"{where}[{i}]") for i, x in enumerate(v)]
        elif isinstance(v, dict):
            for k, x in v.items():
                _text(k, what, f"{where} (a key)")
                stack.append((x, f"{where}.{k}" if where else k))


def _text(s: str, what: str, where: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = f"\\u{ord(s[e.start]):04x}"
        raise JsonInputError(what, f"holding a lone surrogate ({bad}) in a string{f' at {where}' if where else ''}: "
                                   "it is not text; send valid Unicode") from None
