"""JSON from outside (a request body, a schema file, a batch line, a saved chat): parsed within
explicit limits, or one InvalidParameterError that says which limit.

    obj = load_json(text_or_bytes, "the request body")

Limits: MAX_JSON_BYTES of text and MAX_JSON_DEPTH levels of nesting, checked before parsing, so
that a document nested 10,000 deep is one clear error rather than a RecursionError (or, with a
raised recursion limit, a crashed interpreter). Every string in the result, keys included, is
valid Unicode: a lone surrogate such as "\\ud800" (legal JSON, but not text) is refused, since no
tokenizer or UTF-8 encoder takes it.
"""

from __future__ import annotations

import json
import re

import numpy as np

from .errors import InvalidParameterError

MAX_JSON_BYTES = 8 << 20  # 8 MiB of text
MAX_JSON_DEPTH = 128  # serde_json's limit too, which llguidance parses schemas with

# a JSON string, or an unterminated one up to the end (so that no match fails and rescans: linear time)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_STEP = np.zeros(256, np.int8)  # byte -> its change of depth
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def load_json(data: str | bytes, what: str, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH):
    """The value `data` holds; `what` names it in errors ("the request body", "line 3 of in.jsonl").
    A caller reading a file or a stream reads at most max_bytes + 1 bytes, so that this refuses it."""
    size = len(data) if isinstance(data, bytes) else _utf8_size(data, what)
    if size > max_bytes:
        raise InvalidParameterError(f"{what} is {size} bytes of JSON; the limit is {max_bytes}")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")  # a leading byte order mark is ignored, as RFC 8259 allows
        except UnicodeDecodeError as e:
            raise InvalidParameterError(f"{what} is not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    data = data.removeprefix("\ufeff")  # a str read as text keeps it
    _check_depth(data, what, max_depth)
    try:
        value = json.loads(data)
    except RecursionError:  # cannot happen below the depth cap; kept so that it never escapes as a traceback
        raise InvalidParameterError(f"{what} is nested too deeply; the limit is {max_depth} levels") from None
    except ValueError as e:
        raise InvalidParameterError(f"{what} is not valid JSON: {e}") from None
    if _SURROGATE_ESCAPE.search(data):  # only escapes make surrogates: the text itself is valid UTF-8
        _check_strings(value, what)
    return value


def _utf8_size(text: str, what: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as e:  # a str from argv or a text stream with undecodable bytes
        raise InvalidParameterError(f"{what} is not UTF-8 text (a byte at character {e.start} is not)") from None


def _check_depth(text: str, what: str, max_depth: int) -> None:
    """The deepest bracket nesting outside strings, in C and numpy (a Python loop over 8 MiB of
    brackets takes seconds). Exact for valid JSON; invalid JSON may be refused for its depth."""
    if text.count("[") + text.count("{") <= max_depth:  # cannot be deeper: the common case
        return
    codes = np.frombuffer(_STRING.sub("", text).encode("utf-8"), dtype=np.uint8)
    if codes.size and int(np.cumsum(_STEP[codes], dtype=np.int32).max()) > max_depth:
        raise InvalidParameterError(f"{what} is nested more than {max_depth} levels deep; the limit is {max_depth}")


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
        raise InvalidParameterError(f"{what} holds a lone surrogate ({bad}) in a string"
                                    f"{f' at {where}' if where else ''}: it is not text; send valid Unicode") from None
