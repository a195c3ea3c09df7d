"""`llmcli serve`'s ollama API (/api/...), with the real `ollama` client: chat and generate give the
chat endpoint's generation (streamed as NDJSON and not), options map onto the sampling, format
constrains, tags/ps/show/version/embed describe and embed, and mistakes come in ollama's shape."""

from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import pytest

from llmcli import __version__, native
from llmcli.decode.request import Request
from llmcli.decode.sampling_plain import SamplingParams
from llmcli.runtime.flags import ModelFlags
from llmcli.runtime.lean import open_lean
from llmcli.runtime.runtime import open_model
from llmcli.serve import ollama_api
from llmcli.serve.http import Server
from llmcli.serve.listener import bind
from llmcli.serve.openai_api import ApiError, Defaults

ASK = [{"role": "user", "content": "What is the capital of France?"}]
SYSTEM = "Be brief."
KEY = "sk-test"
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def served(tiny_gguf, tiny_folder):
    """(server, client): the tiny model on the torch-free path where it runs, embedding too (mean
    pooling), with an API key (the ollama client sends it as a bearer header)."""
    rt = open_lean(ModelFlags(str(tiny_gguf), threads=1, rows=2)) if native.int8_dot() else None
    rt = rt or open_model(str(tiny_folder), device="cpu", dtype="float32", threads=1)
    srv = Server(rt, bind("127.0.0.1", 0), model_id="tiny", rows=2, max_len=512, api_key=KEY, pooling="mean").start()
    yield srv, ollama.Client(host=_host(srv), headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    srv.close()


def _host(srv) -> str:
    return srv.url.removesuffix("/v1")


def _reference(srv, messages, max_tokens: int, stop=()):
    rt = srv.rt
    ids = rt.prompt_ids(messages)
    chunks = list(rt.generate(ids, Request(SamplingParams(temperature=0), max_tokens, tuple(stop)), rt.new_cache()))
    return "".join(c.text for c in chunks), chunks[-1], len(ids)


def _openai(srv, path: str, body: dict) -> dict:
    r = httpx.post(f"{srv.url}/{path}", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_is_the_chat_endpoint_s_answer_plain_and_streamed(served):
    srv, client = served
    messages = [{"role": "system", "content": SYSTEM}, *ASK]
    want, last, prompt_tokens = _reference(srv, messages, 12)
    r = client.chat(model="tiny", messages=messages, stream=False, options={**GREEDY, "num_predict": 12})
    assert r.message.role == "assistant" and r.message.content == want and r.done
    assert r.done_reason == ("length" if last.finish_reason == "length" else "stop")
    assert (r.prompt_eval_count, r.eval_count) == (prompt_tokens, last.stats.completion_tokens)
    assert r.total_duration > 0 and r.eval_duration >= 0 and r.load_duration == 0
    parts = list(client.chat(model="tiny:latest", messages=messages, stream=True, options={**GREEDY, "num_predict": 12}))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == r.done_reason
    assert "".join(p.message.content for p in parts) == want and parts[-1].eval_count == r.eval_count
    # streaming is ollama's default: the raw answer is one JSON object a line
    raw = httpx.post(f"{_host(srv)}/api/chat", headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                     json={"model": "tiny", "messages": messages, "options": {**GREEDY, "num_predict": 12}})
    assert raw.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in raw.text.splitlines()]
    assert "".join(line["message"]["content"] for line in lines) == want and lines[-1]["done"] is True


def test_generate_through_the_template_and_raw(served):
    srv, client = served
    messages = [{"role": "system", "content": SYSTEM}, *ASK]
    want, _, _ = _reference(srv, messages, 10)
    r = client.generate(model="tiny", prompt=ASK[0]["content"], system=SYSTEM, options={**GREEDY, "num_predict": 10})
    assert r.response == want and r.done
    parts = list(client.generate(model="tiny", prompt=ASK[0]["content"], system=SYSTEM, stream=True,
                                 options={**GREEDY, "num_predict": 10}))
    assert "".join(p.response for p in parts) == want and parts[-1].done
    # raw: the prompt as it is, no template (the completions endpoint's answer)
    prompt = "Once upon a time"
    completion = _openai(srv, "completions", {"prompt": prompt, "temperature": 0, "max_tokens": 10})
    r = client.generate(model="tiny", prompt=prompt, raw=True, options={**GREEDY, "num_predict": 10})
    assert r.response == completion["choices"][0]["text"] and r.prompt_eval_count == completion["usage"]["prompt_tokens"]
    # no prompt: ollama's way to load a model, which is loaded
    r = client.generate(model="tiny", keep_alive="10m")
    assert r.done and r.done_reason == "load" and r.response == ""
    assert client.chat(model="tiny", messages=[]).done_reason == "load"


def test_options_are_the_chat_endpoint_s_sampling(served):
    srv, client = served
    sampling = {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "min_p": 0.01, "seed": 3, "repeat_penalty": 1.2,
                "repeat_last_n": 16, "presence_penalty": 0.3, "frequency_penalty": 0.2}
    chat = _openai(srv, "chat/completions", {"messages": ASK, "max_tokens": 12, **sampling})
    r = client.chat(model="tiny", messages=ASK, options={**sampling, "num_predict": 12, "num_ctx": 256})
    assert r.message.content == chat["choices"][0]["message"]["content"]
    assert r.eval_count == chat["usage"]["completion_tokens"] <= 12
    want, _, _ = _reference(srv, ASK, 24)
    stop = want.strip()[3:6]
    assert stop
    r = client.chat(model="tiny", messages=ASK, options={**GREEDY, "num_predict": 24, "stop": [stop]})
    assert r.message.content == want[:want.find(stop)] and r.done_reason == "stop"
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="tiny", messages=ASK, options={"num_ctx": 100_000})
    assert e.value.status_code == 400 and "options.num_ctx is 100000 tokens" in e.value.error
    assert "context of 512 tokens" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="tiny", messages=ASK, options={"temperature": 5})
    assert e.value.status_code == 400 and e.value.error.startswith("options.temperature must be from 0 to 2")
    with pytest.raises(ollama.ResponseError, match="options.mirostat is not supported"):
        client.chat(model="tiny", messages=ASK, options={"mirostat": 2})


WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}}


def test_format_constrains_the_answer(served):
    srv, client = served
    r = client.chat(model="tiny", messages=ASK, format=WEATHER, options={**GREEDY, "num_predict": 60})
    jsonschema.validate(json.loads(r.message.content), WEATHER)
    parts = list(client.generate(model="tiny", prompt="Weather?", format=WEATHER, stream=True, raw=True,
                                 options={**GREEDY, "num_predict": 60}))
    jsonschema.validate(json.loads("".join(p.response for p in parts)), WEATHER)
    r = client.generate(model="tiny", prompt="JSON please", format="json", options={"seed": 1, "num_predict": 200})
    if r.done_reason == "stop":  # (cut at num_predict, the object is unfinished)
        assert isinstance(json.loads(r.response), dict)
    with pytest.raises(ollama.ResponseError, match="format's schema is not a valid JSON Schema"):
        client.chat(model="tiny", messages=ASK, format={"type": "foo"})


def test_tags_ps_show_version(served):
    srv, client = served
    (tag,) = client.list().models
    assert tag.model == "tiny" and tag.size == srv.rt.loaded.weights_bytes and len(tag.digest) == 64
    assert tag.details.family == "llama" and tag.details.format == srv.rt.loaded.format
    assert tag.details.parameter_size.endswith("M") and tag.details.quantization_level
    (running,) = client.ps().models
    assert running.model == "tiny" and running.size_vram == 0 and running.context_length == 512
    assert running.expires_at.year == 9999  # (the model given to serve stays)
    card = httpx.get(f"{srv.url}/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"][0]
    assert running.size == card["llmcli"]["memory_bytes"] > 0  # what it holds loaded
    info = client.show("tiny")
    assert info.capabilities == ["completion", "embedding"]  # (the tiny template takes no tools, no thinking)
    assert info.modelinfo["general.architecture"] == "llama" and info.modelinfo["llama.context_length"] > 0
    assert info.modelinfo["llama.block_count"] == srv.rt.loaded.args.num_hidden_layers
    assert "num_ctx 512" in info.parameters and info.template == srv.rt.loaded.chat_template
    version = httpx.get(f"{_host(srv)}/api/version", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert version == {"version": __version__}
    root = httpx.get(f"{_host(srv)}/", headers={"Authorization": f"Bearer {KEY}"})
    assert root.status_code == 200 and root.text == "Ollama is running"  # (ollama's tools ask it first)
    assert httpx.head(f"{_host(srv)}/", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_embed_is_the_embeddings_endpoint_s(served):
    srv, client = served
    texts = ["The cat sat on the mat.", "Paris is in France."]
    want = _openai(srv, "embeddings", {"input": texts})
    r = client.embed(model="tiny", input=texts)
    assert len(r.embeddings) == 2 and r.embeddings[1] == want["data"][1]["embedding"]
    assert r.prompt_eval_count == want["usage"]["prompt_tokens"]
    assert client.embed(model="tiny", input=texts[0]).embeddings == [want["data"][0]["embedding"]]
    assert client.embeddings(model="tiny", prompt=texts[0]).embedding == want["data"][0]["embedding"]
    long = "word " * 2000  # over the context: ollama's default truncate cuts it; truncate false refuses it
    assert len(client.embed(model="tiny", input=long).embeddings) == 1
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="tiny", input=long, truncate=False)
    assert e.value.status_code == 400


def test_mistakes_are_ollama_errors(served):
    srv, client = served
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="llama3.2", messages=ASK)
    assert e.value.status_code == 404 and "'llama3.2' is not served here" in e.value.error
    with pytest.raises(ollama.ResponseError, match="images are not supported") as e:
        client.chat(model="tiny", messages=[{"role": "user", "content": "What is this?", "images": [b"\x89PNG"]}])
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError, match="a template override is not supported"):
        client.generate(model="tiny", prompt="hi", template="{{ .Prompt }}")
    with pytest.raises(ollama.ResponseError, match='think must be true, false, "low"'):
        client.chat(model="tiny", messages=ASK, think="very")
    wrong = ollama.Client(host=_host(srv), headers={"Authorization": "Bearer sk-wrong"})
    with pytest.raises(ollama.ResponseError) as e:
        wrong.list()
    assert e.value.status_code == 401 and "API key" in e.value.error
    auth = {"Authorization": f"Bearer {KEY}"}
    for method, path, body, status in (("POST", "/api/chat", b"{not json", 400), ("POST", "/api/nope", b"{}", 404),
                                       ("GET", "/api/chat", None, 405),
                                       ("POST", "/api/chat", b'{"messages": "hi"}', 400)):
        r = httpx.request(method, f"{_host(srv)}{path}", content=body, headers=auth)
        assert r.status_code == status and list(r.json()) == ["error"] and r.json()["error"], (path, r.text)


def test_bodies_translate_into_the_chat_endpoint_s_jobs():
    """ollama's tool_calls (arguments as an object), tool_name, thinking and think levels."""
    job = ollama_api.chat_job({"model": "tiny:latest", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "thinking": "Look it up.",
         "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"}],
        "think": "high", "stream": False, "options": {"num_predict": -1, "seed": 4}}, Defaults())
    assert job.model == "tiny" and not job.stream and job.request.max_tokens is None
    assert job.request.sampling.seed == 4 and job.request.think is True and job.request.reasoning_effort == "high"
    call = job.messages[1]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert job.messages[1]["reasoning_content"] == "Look it up."
    assert job.messages[2] == {"role": "tool", "content": "sunny", "name": "get_weather"}
    with pytest.raises(ApiError, match="options.num_predict must be at least 1"):
        ollama_api.chat_job({"messages": [{"role": "user", "content": "x"}], "options": {"num_predict": 0}}, Defaults())
    with pytest.raises(ApiError, match="suffix"):
        ollama_api.generate_job({"prompt": "def f(", "suffix": "return 1"}, Defaults())


def test_serve_ollama_listens_on_ollama_s_port(tiny_folder):
    """`llmcli serve --ollama` binds 11434 (before the model loads): held here, the port is in use."""
    import socket

    from conftest import run_cli

    holder = socket.socket()
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 11434))
        holder.listen()
    except OSError:  # (something else holds it, ollama itself perhaps: the same answer)
        pass
    try:
        done = run_cli("serve", str(tiny_folder), "--ollama", timeout=120)
    finally:
        holder.close()
    assert done.returncode == 1 and "port 11434 is in use; pass --port" in done.stderr, done.stderr


def test_an_embedding_model_embeds_and_says_so(tiny_bert_folder, one_thread):
    """An encoder (BERT) serves /api/embed only: show says embedding, chat is a 400 in ollama's shape."""
    rt = open_model(str(tiny_bert_folder), allow_encoder=True, dtype="float32")
    srv = Server(rt, bind("127.0.0.1", 0), model_id="bert", rows=2).start()
    try:
        client = ollama.Client(host=_host(srv), timeout=60)
        assert client.show("bert").capabilities == ["embedding"]
        (tag,) = client.list().models
        assert tag.model == "bert" and tag.details.format == "safetensors"
        assert len(client.embed(model="bert", input=["a b c", "d e"]).embeddings) == 2
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(model="bert", messages=ASK)
        assert e.value.status_code == 400 and "is an embedding model" in e.value.error
    finally:
        srv.close()


def test_logprobs_are_the_chat_endpoint_s(served):
    srv, client = served
    chat = _openai(srv, "chat/completions", {"messages": ASK, "max_tokens": 6, "temperature": 0, "logprobs": True,
                                             "top_logprobs": 2})
    want = [(e["token"], e["logprob"], [t["token"] for t in e["top_logprobs"]])
            for e in chat["choices"][0]["logprobs"]["content"]]
    r = client.chat(model="tiny", messages=ASK, logprobs=True, top_logprobs=2, options={**GREEDY, "num_predict": 6})
    assert [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in r.logprobs] == want
    parts = list(client.chat(model="tiny", messages=ASK, logprobs=True, top_logprobs=2, stream=True,
                             options={**GREEDY, "num_predict": 6}))
    assert [(e.token, e.logprob) for p in parts for e in p.logprobs or []] == [w[:2] for w in want]
    raw = client.generate(model="tiny", prompt="Once upon a time", raw=True, logprobs=True, top_logprobs=1,
                          options={**GREEDY, "num_predict": 4})
    assert "".join(e.token for e in raw.logprobs) == raw.response and all(len(e.top_logprobs) == 1 for e in raw.logprobs)


def test_models_on_demand_load_request_ps_and_tags(tiny_gguf, tmp_path):
    """A server of no model: ollama's load request (no prompt) loads the model it names, and chat
    loads another; /api/ps and /api/tags list what is loaded, each with when it unloads, and /api/tags
    then the downloaded models not loaded (serve's `llmcli list`)."""
    import shutil

    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    shutil.copy(tiny_gguf, a)
    shutil.copy(tiny_gguf, b)

    def open_one(name: str):
        flags = ModelFlags(name, ctx_size=128, threads=1, rows=2)
        return (open_lean(flags) if native.int8_dot() else None) or open_model(flags)

    disk = [("smol", a, a.stat().st_size), (str(a), a, a.stat().st_size)]
    srv = Server(None, bind("127.0.0.1", 0), model_id=None, rows=2, open_model=open_one, keep_alive=600,
                 on_disk=lambda: disk).start()
    try:
        client = ollama.Client(host=_host(srv), timeout=60)
        assert client.ps().models == [] and [m.model for m in client.list().models] == ["smol", str(a)]
        smol = client.list().models[0]
        assert smol.size == a.stat().st_size and smol.details.format == "gguf" and len(smol.digest) == 64
        r = client.generate(model=str(a))
        assert r.done_reason == "load" and r.model == str(a)
        r = client.chat(model=str(b), messages=ASK, options={**GREEDY, "num_predict": 4})
        assert r.model == str(b) and r.eval_count > 0
        running = client.ps().models
        assert [m.model for m in running] == [str(b), str(a)]  # most recently used first
        assert all(m.context_length == 128 and m.expires_at.year < 9999 for m in running)
        assert [m.model for m in client.list().models] == [str(b), str(a), "smol"]  # (a: once, loaded)
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(model=str(tmp_path / "none.gguf"), messages=ASK)
        assert e.value.status_code == 404
    finally:
        srv.close()
