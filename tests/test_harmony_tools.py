"""gpt-oss's tool calls (harmony): its template recognised as taking tools, the prompt with tools
and with past calls and results as the template renders them, a reply's call messages read out of
the harmony text (formats/harmony_calls.py through decode/reasoning.py's parser), the grammar
(decode/harmony_grammar.py), and a server whose tiny gpt-oss answers with a call."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from test_gpt_oss import _harmony_folder
from tool_templates import ASK, TIME, WEATHER

from llmcli.decode.harmony_grammar import harmony_grammar
from llmcli.decode.reasoning import HarmonyParser
from llmcli.errors import GrammarError, InvalidOutputError
from llmcli.formats.chat_template import render
from llmcli.formats.harmony_calls import HarmonyCallReader
from llmcli.formats.tools import HARMONY, history, parse_tools, template_support

TEMPLATE = (Path(__file__).parent / "data" / "templates" / "gpt-oss.jinja").read_text()
TOOLS = parse_tools([WEATHER, TIME])


# ------------------------------------------------------------------------------ the template


def test_gpt_oss_template_takes_tools_in_harmony():
    support = template_support(TEMPLATE)
    assert support.format is HARMONY and not support.in_system and support.writes_calls


def test_the_prompt_lists_the_tools_and_renders_past_calls_and_results():
    support = template_support(TEMPLATE)
    messages, more = support.prepare(history(ASK), TOOLS)
    text = render(TEMPLATE, messages, add_generation_prompt=True, **more)
    assert "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {" in text
    assert "type get_weather = (_: {" in text and "type get_time = (_: {" in text
    assert "Calls to these tools must go to the commentary channel: 'functions'." in text
    past = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"}]
    messages, more = support.prepare(history(past), TOOLS)
    text = render(TEMPLATE, messages, add_generation_prompt=True, **more)
    # each call its own message (the template renders a message's first call only)
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
            '{"city": "Paris", "days": 2}<|call|>') in text
    assert '<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"zone": "CET"}<|call|>' in text
    assert '<|start|>functions.get_time to=assistant<|channel|>commentary<|message|>"12:00"<|end|>' in text
    assert text.endswith("<|start|>assistant")


# ------------------------------------------------------------------------------ reading replies

CALLS = {
    "analysis, then the call": "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant"
                               "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                               '{"city": "Paris", "days": 2}<|call|>',
    "recipient first": ' to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Paris","days":2}<|call|>',
    "no format": '<|channel|>commentary to=functions.get_weather<|message|>{"city": "Paris", "days": 2}',
}


def read(text: str, size: int, calls: bool = True, calls_only: bool = False):
    """(thinking, content, calls, whole) of `text` streamed in pieces of `size` characters."""
    parser, reader = HarmonyParser("<|start|>assistant", calls), HarmonyCallReader(TOOLS, calls_only)
    think = content = ""
    for i in range(0, len(text) + 1, size):
        t, a = parser.push(text[i:i + size]) if i < len(text) else parser.finish()
        think += t
        content += reader.push(a, [])[0]
    rest, whole = reader.finish()
    return think, content + rest, reader.calls, whole


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("size", [1, 5, 1000])
def test_a_call_message_is_read_as_a_call(name, size):
    think, content, calls, whole = read(CALLS[name], size)
    assert think == ("The user wants the weather." if name.startswith("analysis") else "")
    assert content == "" and whole
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris", "days": 2})]
    assert json.loads(calls[0].json()) == {"city": "Paris", "days": 2}


def test_analysis_then_final_is_thinking_then_content():
    text = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny."
    for size in (1, 3, 1000):
        assert read(text, size) == ("Easy.", "It is sunny.", [], True)


def test_without_tools_a_message_to_a_function_stays_thinking():
    think, content, calls, _ = read(CALLS["analysis, then the call"], 4, calls=False)
    assert content == "" and not calls and '{"city": "Paris", "days": 2}' in think


def test_a_call_cut_inside_its_json_is_not_whole():
    _, content, calls, whole = read(CALLS["no format"][:-8], 3)
    assert content == "" and not calls and not whole


@pytest.mark.parametrize("body", ['{"city": "Lima", "days": 2}', "[1, 2]"])
def test_arguments_that_do_not_validate_are_a_bug_as_for_the_other_families(body):
    with pytest.raises(InvalidOutputError, match="this is a bug"):
        read(f"<|channel|>commentary to=functions.get_weather json<|message|>{body}<|call|>", 1000)


def test_a_call_to_a_tool_not_offered_is_a_bug():
    with pytest.raises(InvalidOutputError, match="names no offered tool"):
        read('<|channel|>commentary to=functions.launch json<|message|>{"x": 1}<|call|>', 1000)


# ------------------------------------------------------------------------------ the grammar


def test_the_grammar_refuses_a_tool_not_offered(harmony_rt):
    with pytest.raises(GrammarError, match="not among the tools"):
        harmony_grammar(TOOLS, "launch", harmony_rt.loaded.tokenizer)


# ------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def harmony_model(tmp_path_factory) -> Path:
    """A tiny gpt-oss whose greedy pick is a space wherever the grammar allows it: a call opens with
    ` to=functions.` (the recipient before the channel), the rest as the grammar leaves it."""
    return _harmony_folder(tmp_path_factory.mktemp("harmony"), "Ġ", positions=1024)


@pytest.fixture(scope="module")
def harmony_rt(harmony_model, one_thread):
    from llmcli.runtime.runtime import open_model

    return open_model(str(harmony_model), device="cpu", dtype="float32", ctx_size=1024, threads=1)


def test_a_budget_that_would_close_into_a_final_answer_gives_way_to_a_required_call(harmony_rt):
    """The budget forces `<|channel|>final<|message|>` where it may; a required call allows no final
    message, so the forcing stops at the first token the grammar refuses, and the grammar decides."""
    from llmcli.decode.request import Request
    from llmcli.decode.sampling_plain import SamplingParams

    prompt = harmony_rt.prompt_ids(ASK, tools=TOOLS)
    request = Request(SamplingParams(temperature=0), 150, tools=tuple(TOOLS), tool_choice="required",
                      reasoning_budget=0)
    chunks = list(harmony_rt.generate(prompt, request, harmony_rt.new_cache()))
    tok = harmony_rt.loaded.tokenizer
    text = tok.decode([t for c in chunks for t in c.tokens], skip_special=False)
    assert text.startswith("<|channel|>") and "final" not in text


def test_run_prints_the_call_of_a_gpt_oss(harmony_model, tmp_path):
    from conftest import run_cli

    (tmp_path / "tools.json").write_text(json.dumps([WEATHER, TIME]))
    r = run_cli("run", str(harmony_model), "What time is it?", "--tools", str(tmp_path / "tools.json"),
                "--tool-choice", "get_time", "--temp", "0", "--ctx-size", "1024", "-n", "150")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [{"name": "get_time", "arguments": {"zone": "UTC"}}]


@pytest.fixture(scope="module")
def harmony_server(harmony_rt):
    from llmcli.serve.http import Server
    from llmcli.serve.listener import bind

    srv = Server(harmony_rt, bind("127.0.0.1", 0), model_id="tiny", rows=2).start()
    yield srv, openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=120)
    srv.close()


def test_a_served_gpt_oss_calls_a_tool_plain_and_streamed(harmony_server):
    srv, client = harmony_server
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER, TIME], temperature=0,
                                       max_tokens=150)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert args["city"] in ("Paris", "Rome", "Oslo") and 1 <= args["days"] <= 7
    calls, content, finish = {}, "", None
    for c in client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER, TIME], temperature=0,
                                            max_tokens=150, stream=True):
        d = c.choices[0].delta if c.choices else None
        if d is None:
            continue
        content += d.content or ""
        for tc in d.tool_calls or []:
            calls[tc.index] = (tc.function.name, json.loads(tc.function.arguments))
        finish = c.choices[0].finish_reason or finish
    assert (content, list(calls.values()), finish) == ("", [("get_weather", args)], "tool_calls")


def test_a_named_tool_is_the_one_called_and_past_calls_go_back_in(harmony_server):
    srv, client = harmony_server
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER, TIME], temperature=0,
                                       max_tokens=150, tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = r.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_time", {"zone": "UTC"})
    back = ASK + [r.choices[0].message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": "12:00"}]
    again = client.chat.completions.create(model="tiny", messages=back, tools=[WEATHER, TIME], temperature=0,
                                           max_tokens=150, tool_choice="required")
    assert again.choices[0].finish_reason == "tool_calls"


def test_a_served_gpt_oss_calls_through_anthropic_messages_and_openai_responses(harmony_server):
    import anthropic

    srv, client = harmony_server
    claude = anthropic.Anthropic(base_url=srv.url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=120)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in (WEATHER, TIME)]
    r = claude.messages.create(model="tiny", max_tokens=150, messages=ASK, tools=tools, extra_body={"temperature": 0})
    assert r.stop_reason == "tool_use"
    (use,) = [b for b in r.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input["city"] in ("Paris", "Rome", "Oslo")
    flat = [{"type": "function", **t["function"]} for t in (WEATHER, TIME)]
    ask = dict(model="tiny", input=ASK, tools=flat, temperature=0, max_output_tokens=150)
    out = client.responses.create(**ask)
    (call,) = [item for item in out.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == (use.name, use.input)
    with client.responses.stream(**ask) as stream:
        final = stream.get_final_response()
    assert [(c.name, c.arguments) for c in final.output if c.type == "function_call"] == [(call.name, call.arguments)]
