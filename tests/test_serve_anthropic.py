"""`llmcli serve`'s Anthropic Messages API (/v1/messages), with the real `anthropic` client: the same
answers as the chat endpoint's generation, streamed and not, stop sequences, the key in x-api-key,
and mistakes in Anthropic's error shape."""

from __future__ import annotations

import anthropic
import pytest

from llmcli import native
from llmcli.decode.request import Request
from llmcli.decode.sampling_plain import SamplingParams
from llmcli.runtime.flags import ModelFlags
from llmcli.runtime.lean import open_lean
from llmcli.runtime.runtime import open_model
from llmcli.serve.anthropic_api import messages_job
from llmcli.serve.http import Server
from llmcli.serve.listener import bind

ASK = [{"role": "user", "content": "What is the capital of France?"}]
SYSTEM = "Be brief."
GREEDY = {"temperature": 0}  # (the client of 2026 sends no sampling fields of its own)


@pytest.fixture(scope="module")
def served(tiny_gguf, tiny_folder):
    """(server, client): the tiny model on the torch-free path where it runs, with an API key."""
    rt = open_lean(ModelFlags(str(tiny_gguf), threads=1, rows=2)) if native.int8_dot() else None
    rt = rt or open_model(str(tiny_folder), device="cpu", dtype="float32", threads=1)
    srv = Server(rt, bind("127.0.0.1", 0), model_id="tiny", rows=2, api_key="sk-test").start()
    yield srv, anthropic.Anthropic(base_url=srv.url.removesuffix("/v1"), api_key="sk-test", max_retries=0, timeout=60)
    srv.close()


def _reference(srv, max_tokens: int, stop=()):
    rt = srv.rt
    ids = rt.prompt_ids([{"role": "system", "content": SYSTEM}, *ASK])
    chunks = list(rt.generate(ids, Request(SamplingParams(temperature=0), max_tokens, tuple(stop)), rt.new_cache()))
    return "".join(c.text for c in chunks), chunks[-1], len(ids)


def test_a_message_is_the_chat_endpoint_s_answer_plain_and_streamed(served):
    srv, client = served
    want, last, prompt_tokens = _reference(srv, 12)
    r = client.messages.create(model="tiny", max_tokens=12, system=SYSTEM, messages=ASK, extra_body=GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == want
    assert r.stop_reason == ("max_tokens" if last.finish_reason == "length" else "end_turn")
    assert (r.usage.input_tokens, r.usage.output_tokens) == (prompt_tokens, last.stats.completion_tokens)
    with client.messages.stream(model="tiny", max_tokens=12, system=SYSTEM, messages=ASK, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == want and final.content[0].text == want and final.stop_reason == r.stop_reason
    assert final.usage.output_tokens == r.usage.output_tokens


def test_a_stop_sequence_ends_the_message_and_is_named(served):
    srv, client = served
    want, _, _ = _reference(srv, 24)
    stop = want.strip()[3:6]
    assert stop
    r = client.messages.create(model="tiny", max_tokens=24, system=SYSTEM, messages=ASK, extra_body=GREEDY,
                               stop_sequences=[stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == want[:want.find(stop)]


def test_mistakes_are_anthropic_errors(served, tiny_gguf):
    srv, client = served
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "'image' block is not supported" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-other", max_tokens=8, messages=ASK)
    wrong = anthropic.Anthropic(base_url=srv.url.removesuffix("/v1"), api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(model="tiny", max_tokens=8, messages=ASK)
    assert e.value.body["error"]["type"] == "authentication_error"
    import httpx

    r = httpx.post(srv.url.removesuffix("/v1") + "/v1/messages", headers={"x-api-key": "sk-test"},
                   json={"model": "tiny", "messages": ASK})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens is required")
    n = client.messages.count_tokens(model="tiny", system=SYSTEM, messages=ASK)
    assert n.input_tokens == _reference(srv, 1)[2]


def test_content_blocks_become_the_chat_messages_a_template_takes():
    job = messages_job({"max_tokens": 5, "system": [{"type": "text", "text": "sys"}], "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True}})
    roles = [m["role"] for m in job.messages]
    assert roles == ["system", "user", "assistant", "tool"]
    call = job.messages[2]["tool_calls"][0]
    assert call["id"] == "toolu_1" and call["function"]["name"] == "get_weather"
    assert job.messages[3] == {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"}
    assert job.request.tool_choice == "required" and not job.request.parallel_tool_calls
    assert job.request.max_tokens == 5 and [t.name for t in job.request.tools] == ["get_weather"]
