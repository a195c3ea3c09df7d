"""decode.Request: one frozen value per generation that checks itself when built, in the words of
whoever set it (flags, the REPL's /set, a server's fields)."""

import dataclasses

import pytest

from llmcli.chat.session import CHAT_SPELLING
from llmcli.decode import constrained
from llmcli.decode.request import Request, RequestError
from llmcli.decode.sampling import SamplingParams
from llmcli.errors import InvalidParameterError
from llmcli.formats.tools import Tool
from llmcli.serve.openai_api import SPELLING as API_SPELLING

GREEDY = SamplingParams(temperature=0)
DIGITS = constrained.from_regex("[0-9]+")
WEATHER = Tool("get_weather", {"type": "object", "properties": {}})


def test_a_plain_request_and_its_defaults():
    r = Request()
    assert r.sampling == SamplingParams() and r.max_tokens is None and r.stop == () and not r.constrained
    assert Request(grammar=DIGITS).constrained and Request(tools=(WEATHER,)).constrained
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.max_tokens = 3


@pytest.mark.parametrize("fields, field, message", [
    (dict(max_tokens=0), "max_tokens", "--max-tokens must be at least 1, got 0"),
    (dict(logprobs=21), "logprobs", "--logprobs must be in 0..20, got 21"),
    (dict(beams=0), "beams", "--beams must be at least 1"),
    (dict(beams=2, guesses="lookup", sampling=GREEDY), "beams", "--beams does not combine with --draft or --lookup"),
    (dict(context_shift=True, beams=2), "context_shift", "--context-shift works with plain decoding only"),
    (dict(guesses="draft"), "guesses", "--draft and --lookup decode greedily for now; add --temp 0"),
    (dict(guesses="lookup", sampling=GREEDY, draft_tokens=0), "draft_tokens", "--draft-tokens must be in 1..64"),
    (dict(draft_tokens=4), "draft_tokens", "--draft-tokens needs --draft or --lookup"),
    (dict(beams=2, logprobs=1), "beams", "do not combine with a grammar or --logprobs"),
    (dict(grammar=DIGITS, stop=("x",)), "stop", "--stop does not combine with --json-schema, --regex or --grammar"),
    (dict(tools=(WEATHER,), stop=("x",)), "stop", "--stop does not combine with --tools: a stop text could cut"),
    (dict(tools=(WEATHER,), grammar=DIGITS), "tools", "--tools and --json-schema, --regex or --grammar exclude"),
    (dict(tool_choice="required"), "tool_choice", "--tool-choice 'required' needs --tools"),
    (dict(tools=(WEATHER,), tool_choice="nope"), "tool_choice", "--tool-choice 'nope' is not among the tools"),
])
def test_what_does_not_combine_is_refused_naming_the_field(fields, field, message):
    with pytest.raises(RequestError, match=message) as e:
        Request(**fields)
    assert e.value.field == field and isinstance(e.value, InvalidParameterError) and "\n" not in str(e.value)


def test_each_front_end_names_the_fields_its_way():
    with pytest.raises(RequestError, match=r"^stop texts do not combine with .*; /set parameter stop none$"):
        Request(grammar=DIGITS, stop=("}",), spelling=CHAT_SPELLING)
    with pytest.raises(RequestError, match="^stop does not combine with response_format or grammar"):
        Request(grammar=DIGITS, stop=("}",), spelling=API_SPELLING)
    with pytest.raises(RequestError, match="^tool_choice 'required' needs tools$"):
        Request(tool_choice="required", spelling=API_SPELLING)


def test_with_makes_a_new_request_and_checks_it_again():
    r = Request(GREEDY, grammar=DIGITS)
    longer = r.with_(max_tokens=8)
    assert (longer.max_tokens, r.max_tokens, longer.grammar) == (8, None, DIGITS)
    with pytest.raises(RequestError, match="stop texts do not combine"):
        r.with_(CHAT_SPELLING, stop=("x",))
    assert r.with_(sampling=r.sampling.with_(seed=3)).sampling.seed == 3


def test_a_stop_text_that_is_not_utf8_is_refused():
    with pytest.raises(InvalidParameterError, match="--stop"):
        Request(stop=("\udcff",))
