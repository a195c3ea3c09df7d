"""`llmcli serve` with reasoning models, talked to with the real `openai` client: a tiny model with
each family's tokenizer and published template, made to think and answer by a scripted head
(reasoning_families.ScriptedTorch around the real model, so the server's engine runs as it does)."""

from __future__ import annotations

import json

import openai
import pytest
import torch
from reasoning_families import Script, ScriptedTorch, family_folder
from test_reasoning import SCRIPTS, THOUGHT
from tiny import hf_model, save_hf

from llmcli.runtime.runtime import open_model
from llmcli.serve.http import Server
from llmcli.serve.listener import bind

ASK = [{"role": "user", "content": "What is the capital of France?"}]


def serve(root, name: str):
    folder = save_hf(hf_model("llama", vocab_size=340, max_position_embeddings=2048), root / name, None)
    family_folder(name, folder)
    rt = open_model(str(folder), device="cpu", dtype="float32", threads=1)
    tok = rt.loaded.tokenizer
    rt.loaded.model = ScriptedTorch(Script(tok, *SCRIPTS[name]), tok.vocab_size, inner=rt.loaded.model)
    srv = Server(rt, bind("127.0.0.1", 0), model_id=name, rows=1, prompt_cache=0).start()
    return srv, openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    threads = torch.get_num_threads()
    srv, client = serve(tmp_path_factory.mktemp("serve"), "qwen3")
    yield srv, client
    srv.close()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    srv, client = serve(tmp_path_factory.mktemp("serve"), "gpt-oss")
    yield srv, client
    srv.close()


def ask(client, **extra):
    body = {k: extra.pop(k) for k in list(extra) if k in ("reasoning_format", "reasoning_budget",
                                                             "chat_template_kwargs")}
    return client.chat.completions.create(model="", messages=extra.pop("messages", ASK), temperature=0,
                                          extra_body=body, **extra)


def streamed(client, **extra):
    thinking, content, finish, usage = [], [], None, None
    for event in ask(client, stream=True, stream_options={"include_usage": True}, **extra):
        usage = event.usage or usage
        for c in event.choices:
            thinking.append(getattr(c.delta, "reasoning_content", None) or "")
            content.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return "".join(thinking), "".join(content), finish, usage


def test_reasoning_content_apart_from_content(qwen3):
    _, client = qwen3
    r = ask(client)
    m = r.choices[0].message
    assert (m.reasoning_content, m.content, r.choices[0].finish_reason) == (THOUGHT, "Paris.", "stop")
    details = r.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < r.usage.completion_tokens
    assert streamed(client)[:3] == (THOUGHT, "Paris.", "stop")
    assert streamed(client)[3].completion_tokens_details.reasoning_tokens == details.reasoning_tokens


def test_reasoning_format_none_keeps_the_tags_in_content(qwen3):
    m = ask(qwen3[1], reasoning_format="none").choices[0].message
    assert getattr(m, "reasoning_content", None) is None
    assert m.content.startswith("<think>") and m.content.endswith("</think>\n\nParis.")


def test_enable_thinking_false_and_a_budget(qwen3):
    _, client = qwen3
    m = ask(client, chat_template_kwargs={"enable_thinking": False}).choices[0].message
    assert (getattr(m, "reasoning_content", None), m.content) == (None, "Paris.")
    thinking, content, finish, usage = streamed(client, reasoning_budget=4)
    assert content == "Paris." and thinking and THOUGHT.startswith(thinking) and thinking != THOUGHT
    m = ask(client, reasoning_budget=0).choices[0].message
    assert (getattr(m, "reasoning_content", None), m.content) == (None, "Paris.")


def test_max_tokens_inside_the_thinking_is_length(qwen3):
    r = ask(qwen3[1], max_tokens=5)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content == ""
    assert r.usage.completion_tokens_details.reasoning_tokens == 5


def test_response_format_constrains_the_answer_after_the_thinking(qwen3):
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris"]}}, "required": ["city"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}
    m = ask(qwen3[1], response_format=fmt).choices[0].message
    assert m.reasoning_content == THOUGHT and json.loads(m.content) == {"city": "Paris"}


def test_earlier_reasoning_is_dropped_as_the_template_does(qwen3):
    srv, client = qwen3
    turns = ASK + [{"role": "assistant", "content": "Paris.", "reasoning_content": "An old thought."},
                   {"role": "user", "content": "And of Italy?"}]
    tok = srv.rt.loaded.tokenizer
    prompt = tok.decode(srv.rt.prompt_ids(turns), skip_special=False)
    assert "An old thought." not in prompt and "Paris." in prompt  # Qwen3's template keeps only the answer
    assert ask(client, messages=turns).choices[0].message.content == "Paris."


def test_bad_reasoning_fields_are_400(qwen3):
    for extra, needle in [({"reasoning_budget": -2}, "reasoning_budget must be"),
                          ({"reasoning_format": "tags"}, "reasoning_format must be one of"),
                          ({"chat_template_kwargs": [1]}, "chat_template_kwargs must be an object")]:
        with pytest.raises(openai.BadRequestError, match=needle):
            ask(qwen3[1], **extra)
    with pytest.raises(openai.BadRequestError, match="reasoning_effort must be one of"):
        qwen3[1].chat.completions.create(model="", messages=ASK, reasoning_effort="max")


def test_gpt_oss_channels_and_effort(gpt_oss):
    srv, client = gpt_oss
    r = client.chat.completions.create(model="", messages=ASK, temperature=0, reasoning_effort="low")
    m = r.choices[0].message
    assert (m.reasoning_content, m.content) == (THOUGHT, "Paris.")
    from llmcli.decode.request import Request

    prompt = srv.rt.loaded.tokenizer.decode(srv.rt.prompt_ids(ASK, request=Request(reasoning_effort="low")),
                                            skip_special=False)
    assert "Reasoning: low" in prompt
    assert streamed(client, reasoning_budget=3)[1] == "Paris."


def test_batch_lines_carry_the_reasoning(qwen3):
    from llmcli.serve import batch_jobs as bj
    from llmcli.serve.batch_runner import BatchRunner

    rt = qwen3[0].rt
    lines = [json.dumps({"id": 1, "prompt": ASK[0]["content"], "temperature": 0}),
             json.dumps({"id": 2, "prompt": ASK[0]["content"], "temperature": 0, "reasoning_budget": 3})]
    jobs = list(bj.read_jobs(lines))

    class Writer:
        results = []

        def write(self, result):
            self.results.append(result)

    runner = BatchRunner(rt, rt.batch_engine(1, prompt_cache=0), raw=False, retries=0, fallback=None)
    written = [what for kind, what in runner.run(jobs, Writer()) if kind == "written"]
    by_id = {r["id"]: r for r in written}
    assert (by_id[1]["reasoning"], by_id[1]["text"]) == (THOUGHT, "Paris.")
    assert by_id[2]["text"] == "Paris." and THOUGHT.startswith(by_id[2]["reasoning"]) and by_id[2]["reasoning"] != THOUGHT
    assert by_id[1]["usage"]["reasoning_tokens"] > by_id[2]["usage"]["reasoning_tokens"] > 0


def test_serve_flags_are_defaults_a_request_overrides():
    from llmcli.serve.openai_api import Defaults, chat_job

    assert chat_job({"messages": ASK}, Defaults(think=False)).request.think is False
    assert chat_job({"messages": ASK}, Defaults(reasoning_budget=3)).request.reasoning_budget == 3
    job = chat_job({"messages": ASK, "reasoning_budget": -1, "chat_template_kwargs": {"enable_thinking": True}},
                   Defaults(think=False, reasoning_budget=3))
    assert (job.request.think, job.request.reasoning_budget, job.template_kwargs) == (True, None, {"enable_thinking": True})
    job = chat_job({"messages": ASK, "reasoning": {"effort": "minimal"}, "reasoning_format": "none"})
    assert (job.request.reasoning_effort, job.request.reasoning_format) == ("low", "none")


def test_a_tool_call_after_the_thinking(tmp_path):
    """The tools' grammar waits for the answer; the thinking's own mention of a call is no call."""
    thinking = "<think>\nI could write <tool_call> here, but first: the weather in Paris.\n</think>"
    call = '\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    folder = save_hf(hf_model("llama", vocab_size=340, max_position_embeddings=2048), tmp_path / "m", None)
    family_folder("qwen3", folder)
    rt = open_model(str(folder), device="cpu", dtype="float32", threads=1)
    tok = rt.loaded.tokenizer
    rt.loaded.model = ScriptedTorch(Script(tok, thinking, call, "</think>"), tok.vocab_size, inner=rt.loaded.model)
    srv = Server(rt, bind("127.0.0.1", 0), model_id="q", rows=1, prompt_cache=0).start()
    try:
        client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                                  "required": ["city"]}}}]
        r = client.chat.completions.create(model="", messages=ASK, temperature=0, tools=tools)
        m = r.choices[0].message
        assert m.reasoning_content.startswith("I could write <tool_call> here")
        assert [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls] == [("get_weather", {"city": "Paris"})]
        assert r.choices[0].finish_reason == "tool_calls"
    finally:
        srv.close()


def test_anthropic_messages_give_the_thinking_its_own_block(qwen3):
    """/v1/messages with the real anthropic client: a thinking block before the text (whole and
    streamed), `thinking` disabled or with a budget as the chat fields' switch and budget."""
    import anthropic

    srv, _ = qwen3
    client = anthropic.Anthropic(base_url=srv.url.removesuffix("/v1"), api_key="x", max_retries=0, timeout=60)
    ask = dict(model="qwen3", max_tokens=200, messages=ASK, extra_body={"temperature": 0})
    r = client.messages.create(**ask)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in r.content] == \
        [("thinking", THOUGHT), ("text", "Paris.")] and r.stop_reason == "end_turn"
    with client.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking == THOUGHT
    off = client.messages.create(**ask, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == "Paris."
    cut = client.messages.create(**ask, thinking={"type": "enabled", "budget_tokens": 4})
    assert cut.content[0].type == "thinking" and THOUGHT.startswith(cut.content[0].thinking) and \
        cut.content[0].thinking != THOUGHT and cut.content[-1].text == "Paris."
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(**ask, thinking={"type": "enabled"})


def test_ollama_chat_and_generate_give_the_thinking_apart(qwen3):
    """/api/chat and /api/generate with the real ollama client: think true puts the thinking in
    message.thinking (generate: thinking), false turns it off; show says the model thinks."""
    import ollama

    srv, _ = qwen3
    client = ollama.Client(host=srv.url.removesuffix("/v1"), timeout=60)
    greedy = {"temperature": 0}
    r = client.chat(model="qwen3", messages=ASK, think=True, options=greedy)
    assert (r.message.thinking, r.message.content, r.done_reason) == (THOUGHT, "Paris.", "stop")
    parts = list(client.chat(model="qwen3", messages=ASK, think=True, options=greedy, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == THOUGHT
    assert "".join(p.message.content for p in parts) == "Paris."
    r = client.chat(model="qwen3", messages=ASK, think=False, options=greedy)
    assert (r.message.thinking, r.message.content) == (None, "Paris.")
    r = client.generate(model="qwen3", prompt=ASK[0]["content"], think=True, options=greedy)
    assert (r.thinking, r.response) == (THOUGHT, "Paris.")
    assert "thinking" in client.show("qwen3").capabilities
