"""`llmcli serve`'s OpenAI Responses API (/v1/responses), with the real `openai` client: the same
answers as the chat endpoint's generation, whole and streamed as named events, previous_response_id
from the server's store (and store: false), a reasoning model's reasoning item, and mistakes in
OpenAI's error shape. (Function calling per template family: tests/test_serve_tools.py.)"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import test_serve_reasoning

from llmcli import native
from llmcli.decode.request import Request
from llmcli.decode.sampling_plain import SamplingParams
from llmcli.runtime.flags import ModelFlags
from llmcli.runtime.lean import open_lean
from llmcli.runtime.runtime import open_model
from llmcli.serve.http import Server
from llmcli.serve.listener import bind
from llmcli.serve.responses_api import Store, responses_job

ASK = "What is the capital of France?"
SYSTEM = "Be brief."


@pytest.fixture(scope="module")
def served(tiny_gguf, tiny_folder):
    """(server, client): the tiny model on the torch-free path where it runs."""
    rt = open_lean(ModelFlags(str(tiny_gguf), threads=1, rows=2)) if native.int8_dot() else None
    rt = rt or open_model(str(tiny_folder), device="cpu", dtype="float32", threads=1)
    srv = Server(rt, bind("127.0.0.1", 0), model_id="tiny", rows=2).start()
    yield srv, openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
    srv.close()


def _reference(srv, max_tokens: int, messages):
    rt = srv.rt
    ids = rt.prompt_ids(messages)
    chunks = list(rt.generate(ids, Request(SamplingParams(temperature=0), max_tokens), rt.new_cache()))
    return "".join(c.text for c in chunks), chunks[-1], len(ids)


def test_a_response_is_the_chat_endpoint_s_answer_whole_and_streamed(served):
    srv, client = served
    want, last, prompt_tokens = _reference(srv, 12, [{"role": "system", "content": SYSTEM},
                                                     {"role": "user", "content": ASK}])
    r = client.responses.create(model="tiny", instructions=SYSTEM, input=ASK, max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert [item.type for item in r.output] == ["message"] and r.output_text == want
    incomplete = last.finish_reason == "length"
    assert r.status == ("incomplete" if incomplete else "completed")
    assert (r.incomplete_details.reason if incomplete else r.incomplete_details) == (
        "max_output_tokens" if incomplete else None)
    assert (r.usage.input_tokens, r.usage.output_tokens) == (prompt_tokens, last.stats.completion_tokens)
    assert r.usage.total_tokens == prompt_tokens + last.stats.completion_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0

    events = list(client.responses.create(model="tiny", instructions=SYSTEM, input=ASK, max_output_tokens=12,
                                          temperature=0, stream=True))
    names = [e.type for e in events]
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete" if incomplete else "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want
    final = events[-1].response
    assert final.output_text == want and final.usage.output_tokens == r.usage.output_tokens
    assert final.output[0].id == events[2].item.id  # the item streamed is the one in the response


SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
          "additionalProperties": False}
FORMAT = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}


def test_text_format_json_schema_and_the_client_s_stream_helper(served):
    """The schema ends the answer (the tiny model would run to max_output_tokens), so the response
    completes, as the client's stream helper wants."""
    srv, client = served
    r = client.responses.create(model="tiny", input=ASK, max_output_tokens=60, temperature=0, text=FORMAT)
    assert r.status == "completed" and json.loads(r.output_text)["city"] in ("Paris", "Rome")
    with client.responses.stream(model="tiny", input=ASK, max_output_tokens=60, temperature=0, text=FORMAT) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == r.output_text == final.output_text and final.status == "completed"


def test_previous_response_id_continues_the_conversation(served):
    srv, client = served
    first = client.responses.create(model="tiny", instructions=SYSTEM, input=ASK, max_output_tokens=6, temperature=0)
    second = client.responses.create(model="tiny", previous_response_id=first.id, input="And of Italy?",
                                     max_output_tokens=6, temperature=0)
    # instructions do not carry over (OpenAI's rule): the conversation is the input and output items
    turn = [{"role": "user", "content": ASK}, {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And of Italy?"}]
    want, _, prompt_tokens = _reference(srv, 6, turn)
    assert second.usage.input_tokens == prompt_tokens and second.output_text == want
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(second.id).output_text == want  # GET /v1/responses/{id}
    # the same conversation sent whole, as items, gives the same answer
    items = [{"role": "user", "content": ASK},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
             {"role": "user", "content": [{"type": "input_text", "text": "And of Italy?"}]}]
    whole = client.responses.create(model="tiny", input=items, max_output_tokens=6, temperature=0)
    assert whole.output_text == want and whole.usage.input_tokens == prompt_tokens


def test_store_false_keeps_a_response_out_and_unknown_ids_are_404(served):
    srv, client = served
    r = client.responses.create(model="tiny", input=ASK, max_output_tokens=2, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="tiny", input="more", previous_response_id=r.id, max_output_tokens=2)
    assert e.value.code == "previous_response_not_found" and e.value.param == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    kept = client.responses.create(model="tiny", input=ASK, max_output_tokens=2)
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


def test_the_store_keeps_the_most_recently_used():
    store = Store(count=2)
    for i in range(3):
        store.put({"id": f"resp_{i}"}, [{"type": "message", "role": "user", "content": str(i)}])
    with pytest.raises(Exception):
        store.items("resp_0")
    store.items("resp_1")  # used: now the most recent
    store.put({"id": "resp_3"}, [])
    assert list(store.kept) == ["resp_1", "resp_3"]
    small = Store(size=300)
    for i in range(5):
        small.put({"id": f"resp_{i}"}, [{"type": "message", "role": "user", "content": "x" * 100}])
    assert list(small.kept) == ["resp_4"]


@pytest.mark.parametrize("body, param, needle", [
    ({"input": []}, "input", "input must be a string or a non-empty list"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
     "input[0].content", "only text parts"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0]", "'web_search_call' item is not supported"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools", "'web_search' tool is not supported"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens", "at least 1"),
    ({"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning", "effort one of"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "needs a schema"),
    ({"input": "hi", "background": True}, "background", "background responses are not supported"),
    ({"input": "hi", "temperature": 3}, "temperature", "temperature must be from 0 to 2"),
])
def test_mistakes_are_openai_errors(served, body, param, needle):
    srv, _ = served
    r = httpx.post(srv.url + "/responses", json={"model": "tiny", **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and needle in err["message"], err


def test_unknown_model_and_not_json(served):
    srv, client = served
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-5", input=ASK)
    r = httpx.post(srv.url + "/responses", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()


def test_items_become_the_chat_messages_a_template_takes():
    job, turn = responses_job({"instructions": "sys", "input": [
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "look"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
        "tools": [{"type": "function", "name": "get_weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": False,
        "max_output_tokens": 5, "reasoning": {"effort": "minimal"}})
    assert [m["role"] for m in job.messages] == ["system", "user", "assistant", "tool"]
    call = job.messages[2]["tool_calls"][0]
    assert call["id"] == "call_1" and call["function"]["name"] == "get_weather"
    assert job.messages[2]["reasoning_content"] == "look"
    assert job.messages[3] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert job.request.tool_choice == "get_weather" and not job.request.parallel_tool_calls
    assert job.request.max_tokens == 5 and job.request.reasoning_effort == "low"
    assert [t.name for t in job.request.tools] == ["get_weather"]
    assert turn.echo["instructions"] == "sys" and len(turn.items) == 4


# ------------------------------------------------------------------------------ a reasoning model


# (server, client): test_serve_reasoning's fixture, module-scoped: this module starts and closes its own server
qwen3 = test_serve_reasoning.qwen3


def test_a_reasoning_model_s_thinking_is_a_reasoning_item(qwen3):
    from test_reasoning import THOUGHT

    _, client = qwen3
    r = client.responses.create(model="", input=ASK, temperature=0)
    assert [item.type for item in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == THOUGHT and r.output_text == "Paris."
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    events = list(client.responses.create(model="", input=ASK, temperature=0, stream=True))
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thought, text) == (THOUGHT, "Paris.")
    assert [item.type for item in events[-1].response.output] == ["reasoning", "message"]
    off = client.responses.create(model="", input=ASK, temperature=0, reasoning={"effort": "none"})
    assert [item.type for item in off.output] == ["message"]


def test_streamed_items_are_the_whole_response_s():
    """Answer's events against whole() for one finished choice: thinking, blank text, then a call
    (blank text before a call is no message either way); an error event carries its number."""
    from types import SimpleNamespace

    from llmcli.formats.tool_reply import Call
    from llmcli.serve.openai_api import ApiError
    from llmcli.serve.responses_api import Answer, Turn

    stats = SimpleNamespace(prompt_tokens=5, cached_tokens=0, completion_tokens=9, reasoning_tokens=3)
    call = Call("get_weather", {"city": "Paris"})
    choice = SimpleNamespace(pieces=["", "\n"], thoughts=["hm", ""], calls=[call],
                             last=SimpleNamespace(finish_reason="stop", stats=stats))
    whole = Answer(Turn("resp_1", 0, {}, [], False), "tiny").whole(choice)
    stream = Answer(Turn("resp_2", 0, {}, [], False), "tiny")
    events = stream.start() + stream.thinking("hm") + stream.text("\n") + stream.call(call) + stream.finish(choice)
    final = events[-1][1]["response"]
    assert events[-1][0] == "response.completed" and [e[1]["sequence_number"] for e in events] == list(range(len(events)))
    strip = [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in final["output"]]
    assert strip == [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in whole["output"]]
    assert [item["type"] for item in final["output"]] == ["reasoning", "function_call"]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 3
    err = stream.error(ApiError(503, "the server is stopping"))
    assert err["type"] == "error" and err["sequence_number"] == len(events) and err["message"] == "the server is stopping"
