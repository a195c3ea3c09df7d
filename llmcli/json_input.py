"""JSON from outside (a schema file, a JSONL line, a saved chat, a request body), parsed within limits.

Python's parser recurses once per level of nesting: 10,000 levels end in a RecursionError, and a
few hundred get through it only to overflow what reads the result next (jsonschema recurses too,
and llguidance compiles a schema on its native stack). So the size and the depth are capped before
anything else sees the value, and every failure is one InvalidParameterError:

    load_json(text, "--json-schema person.json")   -> the value, or the error naming it

No real input comes near the limits: JSON Schemas nest a few levels, OpenAI's API allows 5 to 10.
"""

from __future__ import annotations

import json

from .errors import InvalidParameterError

MAX_JSON_BYTES = 16 << 20  # bytes of JSON text (UTF-8) (a chat at a 128k-token context is ~1 MB)
MAX_JSON_DEPTH = 64  # levels of nested objects and arrays


class JsonInputError(InvalidParameterError):
    """JSON that is malformed or over a limit. `detail` is the message without the name of the
    input, for callers that put it in their own words (`line 3: not valid JSON ...`)."""

    def __init__(self, what: str, detail: str):
        super().__init__(f"{what} is {detail}")
        self.detail = detail


def limits() -> str:
    return f"llmcli reads JSON of up to {MAX_JSON_BYTES >> 20} MiB and {MAX_JSON_DEPTH} levels of nesting"


def load_json(text: str, what: str) -> object:
    """`text` parsed as JSON; `what` names it in the error. Over MAX_JSON_BYTES characters, or
    nested deeper than MAX_JSON_DEPTH objects and arrays, it is refused, never half-parsed."""
    if len(text) > MAX_JSON_BYTES or (len(text) > MAX_JSON_BYTES // 4
                                      and len(text.encode("utf-8", "surrogatepass")) > MAX_JSON_BYTES):
        raise JsonInputError(what, f"larger than {MAX_JSON_BYTES >> 20} MiB ({limits()})")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise JsonInputError(what, f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:  # deeper than the interpreter's recursion limit (~1000)
        raise JsonInputError(what, f"nested more than {MAX_JSON_DEPTH} levels deep ({limits()})") from None
    except ValueError as e:  # an integer of more than 4300 digits (int_max_str_digits)
        raise JsonInputError(what, f"not usable JSON: {' '.join(str(e).split())[:120]}") from None
    if depth(value) > MAX_JSON_DEPTH:
        raise JsonInputError(what, f"nested more than {MAX_JSON_DEPTH} levels deep ({limits()})")
    return value


def depth(value: object) -> int:
    """Levels of nested objects and arrays in a parsed value (a scalar: 0), without recursing."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_JSON_DEPTH:  # below the cap the exact depth does not matter
            todo.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
