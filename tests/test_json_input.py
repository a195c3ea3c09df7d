"""json_input.load_json: the shared caps on JSON from outside (depth, size, lone surrogates), each
one InvalidParameterError naming the input, never a RecursionError; fast on hostile input."""

from __future__ import annotations

import time

import pytest

from llmcli.errors import InvalidParameterError
from llmcli.json_input import MAX_JSON_DEPTH, load_json


def refused(data, **limits) -> str:
    with pytest.raises(InvalidParameterError) as e:
        load_json(data, "the thing", **limits)
    return str(e.value)


def test_depth_is_capped_before_parsing():
    assert f"nested more than {MAX_JSON_DEPTH} levels deep" in refused("[" * 10_000 + "]" * 10_000)
    assert "nested more than" in refused('{"a": ' * 5000 + "1" + "}" * 5000)
    deepest = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert load_json(deepest, "x") == eval(deepest)
    assert "nested more than 3" in refused("[[[[1]]]]", max_depth=3)
    # brackets inside strings (escaped quotes too) do not count
    text = '{"a": "' + "[" * 500 + '\\"' + "{" * 500 + '", "b": ["\\\\"]}'
    assert load_json(text, "x")["b"] == ["\\"]


def test_size_utf8_and_syntax():
    assert refused(b"[1, 2]", max_bytes=5).startswith("the thing is 6 bytes of JSON, larger than the limit of 5")
    assert refused("\u00e9\u00e9\u00e9", max_bytes=5).startswith("the thing is 6 bytes")  # counted in UTF-8
    assert "is not UTF-8 (byte 0xff at offset 1)" in refused(b"[\xff]")
    assert "is not valid JSON" in refused('{"a": 1')
    assert load_json(b"\xef\xbb\xbf[1]", "x") == load_json("\ufeff[1]", "x") == [1]  # a BOM, as RFC 8259 allows
    assert "is not UTF-8 text" in refused("\udcff")  # surrogateescape'd argv


def test_lone_surrogates_are_refused_pairs_are_not():
    assert load_json('{"a": "\\ud83d\\ude00"}', "x") == {"a": "\U0001F600"}
    said = refused('{"messages": [{"content": "x\\ud800"}]}')
    assert "lone surrogate (\\ud800)" in said and "messages[0].content" in said
    said.encode("utf-8")  # the message itself is text
    assert "(a key)" in refused('{"\\udc00": 1}')
    assert load_json('"\\\\ud800"', "x") == "\\ud800"  # an escaped backslash: six characters of text


@pytest.mark.parametrize("text", [
    "[" * 300 + '"' + '\\"' * 2_000_000,  # an unterminated string full of escaped quotes
    '"' + '\\"' * 2_000_000 + "[" * 300,
    "[" + "[]," * 300_000 + "[]]",  # wide, not deep: parsed
])
def test_hostile_text_is_handled_in_linear_time(text):
    t0 = time.perf_counter()
    try:
        load_json(text, "x")
    except InvalidParameterError:
        pass
    assert time.perf_counter() - t0 < 30  # quadratic time would be hours; linear is well under a second alone
