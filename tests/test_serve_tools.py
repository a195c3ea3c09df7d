"""Tool calling through `llmcli serve`, with the real `openai` client: one tiny model per template
family (Qwen2.5, Qwen3, Llama 3.1, Llama 3.2, Phi-4-mini), edited to open a call at once
(tiny.eager_caller), since random weights rarely would; a plain tiny model that answers in text;
the real SmolLM2, whose template takes no tools (a 400), and SmolLM2 given Qwen2.5's template,
calling with the grammar from the first token."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import openai
import pytest
from tiny import eager_caller, hf_model, save_hf, tool_tokenizer_json
from tool_templates import ASK, QWEN25, TEMPLATES, TIME, WEATHER

from llmcli.formats.tools import parse_tools
from llmcli.runtime.runtime import Runtime, open_model
from llmcli.serve.http import Server
from llmcli.serve.listener import bind

TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# what opens a call in each family's reply (its first token)
OPENS = {"qwen2.5": "<tool_call>", "qwen3": "<tool_call>", "llama3.1": "{", "llama3.2": "{", "phi4-mini": "<|tool_call|>"}


def _token(text: str) -> int:
    data = json.loads(tool_tokenizer_json())
    return {**data["model"]["vocab"], **{t["content"]: t["id"] for t in data["added_tokens"]}}[text]


def serve(rt, **kw):
    return Server(rt, bind("127.0.0.1", 0), model_id="tiny", rows=4, **kw).start()


def client_of(srv):
    return openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module", params=list(TEMPLATES))
def family(request, tmp_path_factory, one_thread):
    """(name, server, client): a tiny model that opens a call at once, with that family's template."""
    name = request.param
    template, bos, eos = TEMPLATES[name]
    model = eager_caller(hf_model("llama", max_position_embeddings=2048), _token(OPENS[name]))
    folder = save_hf(model, tmp_path_factory.mktemp(name.replace(".", "_")), template, tools=True, bos=bos, eos=eos)
    srv = serve(open_model(str(folder), device="cpu", dtype="float32", threads=1))
    yield name, srv, client_of(srv)
    srv.close()


def check_call(call, names=("get_weather", "get_time")):
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
    args = json.loads(call.function.arguments)  # a JSON string, as OpenAI sends them
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return call.function.name, args


def stream_calls(chunks):
    """The calls of a streamed answer, put together as OpenAI clients do (by index)."""
    calls, content, finish = {}, "", None
    for c in chunks:
        if not c.choices:
            continue
        d = c.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            got = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
            got["name"] += tc.function.name or ""
            got["arguments"] += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    return content, [(v["name"], json.loads(v["arguments"])) for _, v in sorted(calls.items())], finish


def test_each_family_calls_a_tool_plain_and_streamed(family):
    name, srv, client = family
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, temperature=0, max_tokens=100,
                                       parallel_tool_calls=False)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", (name, choice)
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    want = check_call(choice.message.tool_calls[0])
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, temperature=0,
                                                 max_tokens=100, parallel_tool_calls=False, stream=True))
    assert stream_calls(chunks) == ("", [want], "tool_calls")


def test_each_family_required_and_named(family):
    name, srv, client = family
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                       temperature=0.9, seed=3, max_tokens=100, parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls"
    check_call(r.choices[0].message.tool_calls[0])
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=100,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = r.choices[0].message.tool_calls
    assert check_call(call, ("get_time",))[0] == "get_time"


def test_each_family_takes_past_calls_and_results(family):
    """A second turn: the assistant's call (arguments as OpenAI's JSON string) and the tool's result."""
    name, srv, client = family
    first = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, temperature=0, max_tokens=100,
                                           parallel_tool_calls=False).choices[0].message
    call = first.tool_calls[0]
    turn = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny"}'}]
    r = client.chat.completions.create(model="tiny", messages=turn, tools=TOOLS, temperature=0, max_tokens=100,
                                       parallel_tool_calls=False)
    ids = srv.rt.prompt_ids(turn, tools=parse_tools(TOOLS))
    assert r.usage.prompt_tokens == len(ids)
    text = srv.rt.loaded.tokenizer.decode(ids, skip_special=False)
    assert '{"forecast": "sunny"}' in text or '"{\\"forecast\\": \\"sunny\\"}"' in text  # Llama's template tojson's it
    assert '"city": ' in text and call.function.name in text  # the past call, as the family writes it


def test_tool_choice_none_answers_in_text(family):
    name, srv, client = family
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="none", temperature=0,
                                       max_tokens=8)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")
    no_tools = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=8)
    assert r.usage.prompt_tokens == no_tools.usage.prompt_tokens  # the tools were not in the prompt


@pytest.fixture(scope="module")
def plain(tmp_path_factory, one_thread):
    """An unedited tiny model with Qwen2.5's template: it answers in text (it never opens a call)."""
    folder = save_hf(hf_model("llama", max_position_embeddings=2048), tmp_path_factory.mktemp("plain"), QWEN25,
                     tools=True)
    srv = serve(open_model(str(folder), device="cpu", dtype="float32", threads=1))
    yield srv, client_of(srv)
    srv.close()


def test_a_model_that_answers_in_text_gets_no_tool_calls(plain):
    srv, client = plain
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, temperature=0, max_tokens=12)
    choice = r.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, temperature=0,
                                                 max_tokens=12, stream=True))
    content, calls, finish = stream_calls(chunks)
    assert calls == [] and content == choice.message.content and finish == choice.finish_reason


@pytest.mark.parametrize("extra, needle", [
    ({"tool_choice": "get_weather"}, "tool_choice must be"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools"),
    ({"response_format": {"type": "json_object"}}, "tools and response_format or grammar exclude each other"),
    ({"stop": ["x"]}, "stop does not combine with tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "if": {}}}}]},
     "cannot be used for constrained output"),
])
def test_bad_tool_requests_are_400(plain, extra, needle):
    srv, client = plain
    with pytest.raises(openai.BadRequestError, match=needle):
        client.chat.completions.create(**{"model": "tiny", "messages": ASK, "tools": TOOLS, **extra})


# ------------------------------------------------------------------------------ the real model


@pytest.fixture(scope="module")
def smollm2_server(smollm2_loaded):
    srv = Server(Runtime(smollm2_loaded, 1024), bind("127.0.0.1", 0), model_id="smollm2", rows=2).start()
    yield srv, client_of(srv)
    srv.close()


@pytest.mark.slow
def test_smollm2_template_takes_no_tools_and_is_refused(smollm2_server):
    srv, client = smollm2_server
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS)
    assert e.value.status_code == 400 and e.value.code == "tools_not_supported"
    assert "does not take tools" in e.value.message and "Qwen2.5" in e.value.message
    # without tools (or with tool_choice "none") it answers as ever
    r = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=2)
    assert r.choices[0].finish_reason == "length"


@pytest.mark.slow
def test_smollm2_with_a_tools_template_calls_from_the_first_token(smollm2_loaded):
    """SmolLM2 (ChatML) given Qwen2.5's template: its vocabulary has no <tool_call> token, so the
    markers are text; with tool_choice required or a named function the grammar writes them."""
    loaded = dataclasses.replace(smollm2_loaded, chat_template=QWEN25)
    srv = Server(Runtime(loaded, 1024), bind("127.0.0.1", 0), model_id="smollm2", rows=2).start()
    try:
        client = client_of(srv)
        r = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=80, parallel_tool_calls=False)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        name, args = check_call(r.choices[0].message.tool_calls[0])
        chunks = list(client.chat.completions.create(
            model="smollm2", messages=ASK, tools=TOOLS, temperature=0, max_tokens=80, stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}}))
        content, calls, finish = stream_calls(chunks)
        assert finish == "tool_calls" and [c[0] for c in calls] == ["get_weather"]
        jsonschema.validate(calls[0][1], SCHEMAS["get_weather"])
    finally:
        srv.close()


def test_each_family_calls_a_tool_through_anthropic_messages(family):
    """The same call through /v1/messages (the real anthropic client): a tool_use block whose input
    validates, stop_reason tool_use, streamed as a block of its own; its result goes back as a
    tool_result block."""
    import anthropic

    name, srv, _ = family
    client = anthropic.Anthropic(base_url=srv.url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=120)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    ask = dict(model="tiny", max_tokens=100, messages=ASK, tools=tools, extra_body={"temperature": 0},
               tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    r = client.messages.create(**ask)
    assert r.stop_reason == "tool_use", (name, r)
    (use,) = [b for b in r.content if b.type == "tool_use"]
    jsonschema.validate(use.input, SCHEMAS[use.name])
    with client.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [(use.name, use.input)]
    turn = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in r.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": '{"forecast": "sunny"}'}]}]
    again = client.messages.create(**{**ask, "messages": turn})
    assert again.usage.input_tokens > r.usage.input_tokens


def test_each_family_calls_a_tool_through_openai_responses(family):
    """The same call through /v1/responses (the real openai client): a function_call item whose
    arguments validate, whole and streamed (its arguments as function_call_arguments events); its
    output goes back as a function_call_output item, after previous_response_id."""
    name, srv, client = family
    tools = [{"type": "function", **t["function"]} for t in TOOLS]  # Responses' flat shape
    ask = dict(model="tiny", input=ASK, tools=tools, temperature=0, max_output_tokens=100, parallel_tool_calls=False)
    r = client.responses.create(**ask)
    assert r.status == "completed", (name, r)
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.call_id.startswith("call_") and call.name in SCHEMAS
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    with client.responses.stream(**ask) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.function_call_arguments.delta")
        final = stream.get_final_response()
    assert [(c.name, c.arguments) for c in final.output if c.type == "function_call"] == [(call.name, call.arguments)]
    assert deltas == call.arguments
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"forecast": "sunny"}'}
    again = client.responses.create(**{**ask, "previous_response_id": r.id, "input": [result], "max_output_tokens": 1})
    turn = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": '{"forecast": "sunny"}'}]
    assert again.usage.input_tokens == len(srv.rt.prompt_ids(turn, tools=parse_tools(TOOLS)))
    # the same turn sent whole, the first answer's output items as the client returns them
    whole = client.responses.create(**{**ask, "input": [*ASK, *(o.model_dump() for o in r.output), result],
                                       "max_output_tokens": 1})
    assert whole.usage.input_tokens == again.usage.input_tokens


def test_each_family_calls_a_tool_through_ollama_chat(family):
    """The same call through /api/chat (the real ollama client): message.tool_calls in ollama's
    shape, arguments an object that validates, whole and streamed; the call and its result (a tool
    message with tool_name) go back for a second turn. (The client keeps only type, items,
    description and enum of a tool's properties: get_time's enum, as get_weather's bounds are lost.)"""
    import ollama

    name, srv, _ = family
    client = ollama.Client(host=srv.url.removesuffix("/v1"), timeout=120)
    options = {"temperature": 0, "num_predict": 100}
    r = client.chat(model="tiny", messages=ASK, tools=[TIME], options=options)
    assert r.message.tool_calls, (name, r)
    assert r.done and r.done_reason == "stop"
    calls = [(c.function.name, dict(c.function.arguments)) for c in r.message.tool_calls]
    for fn, args in calls:
        jsonschema.validate(args, SCHEMAS[fn])
    parts = list(client.chat(model="tiny", messages=ASK, tools=[TIME], options=options, stream=True))
    streamed = [(c.function.name, dict(c.function.arguments)) for p in parts for c in p.message.tool_calls or []]
    assert streamed == calls and parts[-1].done
    fn, args = calls[0]
    turn = [*ASK, r.message.model_dump(exclude_none=True),
            {"role": "tool", "content": '{"forecast": "sunny"}', "tool_name": fn}]
    again = client.chat(model="tiny", messages=turn, tools=[TIME], options={**options, "num_predict": 4})
    assert again.prompt_eval_count > r.prompt_eval_count
    info = client.show("tiny")
    assert "tools" in info.capabilities
