"""`llmcli serve`: the OpenAI-compatible server, talked to with the real `openai` client.

Answers are compared with the same request through generate.generate() (greedy, or sampled with
the same seed); the tiny random llama keeps it fast, the real SmolLM2 writes the JSON."""

from __future__ import annotations

import http.client
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import jsonschema
import openai
import pytest
import torch
from conftest import REPO, run_cli

from llmcli import native
from llmcli.decode.batched import Sequence
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.errors import ServeError
from llmcli.runtime.flags import ModelFlags
from llmcli.runtime.lean import LeanRuntime, open_lean
from llmcli.runtime.runtime import Runtime, open_model
from llmcli.serve.http import Server
from llmcli.serve.listener import bind
from llmcli.serve.logprobs import token_bytes

GREEDY = SamplingParams(temperature=0)
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module", params=["torch", "lean"])
def tiny(request, tiny_folder, tiny_gguf):
    """The tiny model served on an ephemeral port, 4 rows: its folder on the torch path (one torch
    thread: tiny tensors), and its Q8_0 GGUF on the torch-free path (runtime/lean.py)."""
    threads = torch.get_num_threads()
    if request.param == "lean":
        if not native.int8_dot():
            pytest.skip("no C++ compiler for the kernels, or only the portable ones")
        rt = open_lean(ModelFlags(str(tiny_gguf), threads=1, rows=4))
        assert isinstance(rt, LeanRuntime)
    else:
        rt = open_model(str(tiny_folder), device="cpu", dtype="float32", threads=1)
    srv = Server(rt, bind("127.0.0.1", 0), model_id="tiny", rows=4).start()
    yield srv
    srv.close()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def client(tiny):
    return openai.OpenAI(base_url=tiny.url, api_key="x", max_retries=0, timeout=60)


def reference(rt, ids, params=GREEDY, max_tokens=None, stop=(), logprobs=None, keep=None):
    """What generate() makes of the same prompt: (text, last chunk); `keep` gets its Generation."""
    generation = rt.generate(ids, Request(params, max_tokens, stop, logprobs=logprobs), rt.new_cache())
    chunks = list(generation)
    if keep is not None:
        keep.append(generation)
    return "".join(c.text for c in chunks), chunks[-1]


def exchange(srv, method, path, body=b"", headers=None):
    """(status, headers, body bytes) from a plain http.client request."""
    host, port = srv.address
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def raw(srv, method, path, body=b"", headers=None):
    """(status, parsed JSON) from a plain http.client request."""
    status, _, data = exchange(srv, method, path, body, headers)
    return status, json.loads(data)


def wait_idle(srv, seconds=5.0):
    deadline = time.monotonic() + seconds
    while srv.loop.engine.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    return not srv.loop.engine.busy


# ------------------------------------------------------------------------------ answers


def test_models_health_and_loopback_default(tiny, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").owned_by == "llmcli"
    health = json.loads(urllib.request.urlopen(tiny.url.removesuffix("/v1") + "/health").read())
    assert health["status"] == "ok" and health["rows"] == 4 and health["ctx_size"] == 256
    assert inspect.signature(bind).parameters["host"].default == "127.0.0.1"
    assert tiny.url.startswith("http://127.0.0.1:")


def test_chat_equals_generate_plain_and_streamed(tiny, client):
    rt = tiny.rt
    ids = rt.prompt_ids(ASK)
    want, last = reference(rt, ids, max_tokens=24)
    r = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=24)
    assert r.object == "chat.completion" and r.model == "tiny" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want
    assert r.choices[0].finish_reason == last.finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), 24, len(ids) + 24)
    assert r.choices[0].logprobs is None

    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_completion_tokens=24,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert all(c.usage is None for c in chunks[:-1]) and len({c.id for c in chunks}) == 1


def test_max_tokens_stop_and_text_parts(tiny, client):
    rt = tiny.rt
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]}]
    ids = rt.prompt_ids([{"role": "user", "content": "Hello\nworld"}])
    want, _ = reference(rt, ids, max_tokens=40)
    r = client.chat.completions.create(model="tiny", messages=parts, temperature=0, max_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    assert r.choices[0].model_extra["stopped_by"] == "max_tokens"  # OpenAI's "length", and which limit
    assert want.startswith(r.choices[0].message.content)
    # a stop string from the middle of the greedy answer: the text ends before it
    stop = next(want[i:i + 2] for i in range(6, len(want)) if want[i:i + 2].isascii() and want[i:i + 2].strip())
    cut, last = reference(rt, ids, max_tokens=40, stop=(stop, "no such text"))
    assert cut == want[:want.find(stop)] and last.finish_reason == "stop"
    for stream in (False, True):
        r = client.chat.completions.create(model="tiny", messages=parts, temperature=0, max_tokens=40,
                                           stop=[stop, "no such text"], stream=stream)
        if stream:
            chunks = [c for c in r if c.choices]
            text, finish = "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert (text, finish) == (cut, "stop")


def test_seed_reproduces_sampled_answers(tiny, client):
    rt = tiny.rt
    ids = rt.prompt_ids(ASK)
    # OpenAI's defaults: temperature 1, top_p 1, no top-k or min-p
    want, _ = reference(rt, ids, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7), max_tokens=20)
    answers = [client.chat.completions.create(model="tiny", messages=ASK, seed=seed, max_tokens=20).choices[0].message.content
               for seed in (7, 7, 8)]
    assert answers[0] == answers[1] == want and answers[2] != want


def test_logprobs_match_the_recorded_ones(tiny, client):
    rt, tok = tiny.rt, tiny.rt.loaded.tokenizer
    ids = rt.prompt_ids(ASK)
    kept = []
    want, _ = reference(rt, ids, max_tokens=12, logprobs=3, keep=kept)
    record = kept[0].logprobs
    r = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert r.choices[0].message.content == want and len(content) == len(record.entries) == 12
    for got, (token, logprob, top) in zip(content, record.entries):
        assert got.token == tok.decode([token], skip_special=False)
        assert got.logprob == pytest.approx(logprob, abs=1e-4)
        assert [a.logprob for a in got.top_logprobs] == pytest.approx([lp for _, lp in top], abs=1e-4)
        assert [a.token for a in got.top_logprobs] == [tok.decode([i], skip_special=False) for i, _ in top]
    # the tokens' bytes put together are the answer's bytes, also where a token splits a character
    joined = bytes(b for got in content for b in got.bytes)
    assert joined.decode("utf-8", "replace") == tok.decode([t for t, _, _ in record.entries])
    assert sorted(b[0] for t in range(3, tok.vocab_size) if len(b := token_bytes(tok, t)) == 1) == list(range(256))
    streamed = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=12, logprobs=True,
                                              top_logprobs=3, stream=True)
    tokens = [e.token for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert tokens == [e.token for e in content]


def test_completions_raw_prompt_legacy_logprobs_and_stream(tiny, client):
    rt, tok = tiny.rt, tiny.rt.loaded.tokenizer
    prompt = "The quick brown fox"
    ids = tok.encode(prompt)
    kept = []
    want, _ = reference(rt, ids, max_tokens=10, logprobs=2, keep=kept)
    record = kept[0].logprobs
    r = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=10, logprobs=2)
    choice = r.choices[0]
    assert r.object == "text_completion" and choice.text == want and choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 10
    lp = choice.logprobs
    assert lp.token_logprobs == pytest.approx([e[1] for e in record.entries], abs=1e-4)
    assert lp.tokens == [tok.decode([e[0]], skip_special=False) for e in record.entries]
    assert all(len(alts) <= 2 for alts in lp.top_logprobs) and lp.text_offset[0] == len(prompt)
    # token ids as the prompt; OpenAI's default of 16 tokens for this endpoint
    r = client.completions.create(model="tiny", prompt=ids, temperature=0)
    assert r.choices[0].text == reference(rt, ids, max_tokens=16)[0] and r.usage.completion_tokens == 16
    chunks = list(client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=10, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want and chunks[-1].choices[0].finish_reason == "length"


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("extra, needles", [
    ({"n": 17}, ["n must be from 1 to 16"]),
    ({"temperature": 3}, ["temperature must be from 0 to 2"]),
    ({"top_logprobs": 2}, ["top_logprobs needs logprobs"]),
    ({"logprobs": True, "top_logprobs": 21}, ["top_logprobs must be from 0 to 20"]),
    ({"stop": ["a", "b", "c", "d", "e"]}, ["at most 4"]),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, ["does not take tools", "tools_not_supported"]),
    ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, ["tools[0].function.name must be"]),
    ({"tool_choice": "required"}, ["tool_choice 'required' needs tools"]),
    ({"extra_body": {"grammar": 'root ::= "a" | undefined-rule'}}, ["grammar is not a usable GBNF grammar", "undefined-rule"]),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, ["only text parts"]),
    ({"messages": [{"role": "user", "content": "hi " * 300}]}, ["context holds 256", "context_length_exceeded"]),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "foo"}}}},
     ["response_format's schema is not a valid JSON Schema", "'foo' is not valid"]),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "dependentSchemas": {"a": {}}}}}}, ["cannot be used for constrained output", "dependentSchemas"]),
])
def test_bad_requests_are_400_with_a_clear_message(client, extra, needles):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**body)
    said = f"{e.value.message} {e.value.code}"
    assert all(n in said for n in needles), said


def test_http_errors_in_openai_shape(tiny, client):
    status, body = raw(tiny, "POST", "/v1/chat/completions", b"{not json", {"Content-Type": "application/json"})
    assert status == 400 and "not valid JSON" in body["error"]["message"] and body["error"]["type"] == "invalid_request_error"
    assert raw(tiny, "GET", "/v1/chat/completions")[0] == 405
    assert raw(tiny, "GET", "/v1/nothing")[0] == 404
    status, body = raw(tiny, "POST", "/v1/completions", b"x", {"Content-Length": str(9 << 20)})
    assert status == 413 and "limit" in body["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    # seeded: unseeded, the random model sometimes sampled its end token first (1 completion token)
    assert client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2, seed=1).usage.completion_tokens == 2


# ------------------------------------------------------------------------------ several clients


def test_concurrent_clients_are_batched_and_answered_right(tiny, client):
    rt = tiny.rt
    asks = [[{"role": "user", "content": text}] for text in ("Hello", "What is the capital?", "日本語", "quick brown fox")]
    wants = [reference(rt, rt.prompt_ids(m), max_tokens=48)[0] for m in asks]
    engine = tiny.loop.engine
    steps, row_steps = engine.steps, engine.row_steps
    start, got = threading.Barrier(4), [None] * 4

    def ask(i):
        start.wait()
        got[i] = client.chat.completions.create(model="tiny", messages=asks[i], temperature=0,
                                                max_tokens=48).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == wants
    mean_batch = (engine.row_steps - row_steps) / (engine.steps - steps)
    assert mean_batch > 1.5, mean_batch


def test_client_that_disconnects_is_cancelled_and_the_server_goes_on(tiny, client, caplog, capfd, monkeypatch):
    engine = tiny.loop.engine
    step = engine.step

    def paced_step():  # 4 ms a step: 230 tokens take ~1 s, so noticing the hang-up late still shows
        time.sleep(0.004)
        return step()

    monkeypatch.setattr(engine, "step", paced_step)
    host, port = tiny.address
    with caplog.at_level("INFO", logger="llmcli.server"):
        for stream in (True, False):  # a stream: a write fails; a plain request: its socket reads EOF
            before = engine.row_steps
            body = json.dumps({"messages": ASK, "temperature": 0, "max_tokens": 230, "stream": stream}).encode()
            sock = socket.create_connection((host, port), timeout=10)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            if stream:
                got = b""
                while got.count(b"data: ") < 3:  # a few events, then gone
                    got += sock.recv(4096)
            else:
                time.sleep(0.05)
            sock.close()
            assert wait_idle(tiny)
            assert engine.row_steps - before < 200  # stopped early, not run to 230 tokens
        deadline = time.monotonic() + 5  # a request's log line comes once its handler ends
        while caplog.text.count("client went away") < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert caplog.text.count("client went away") == 2
    want, _ = reference(tiny.rt, tiny.rt.prompt_ids(ASK), max_tokens=8)
    assert client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=8).choices[0].message.content == want
    assert "Traceback" not in capfd.readouterr().err


def test_cancelling_a_finished_request_spares_the_next_one(tiny):
    """The engine keeps the cancelled requests, not their id()s, which the next request may reuse."""
    rt = tiny.rt
    engine = rt.batch_engine(2, 64, prompt_cache=0)
    ids = rt.prompt_ids(ASK)
    for _ in range(20):
        old = Sequence(ids, Request(GREEDY, 2))
        assert len(list(engine.run([old]))) == 3  # two tokens, the last chunk
        engine.cancel(old)  # the client went away just as its answer ended
        del old  # CPython gives the next Request its address, and so its id()
        assert len(list(engine.run([Sequence(ids, Request(GREEDY, 2))]))) == 3


def test_a_busy_port_is_one_clear_error(tiny):
    with pytest.raises(ServeError, match=r"^port \d+ is in use; pass --port$"):
        bind("127.0.0.1", tiny.address[1])


# ------------------------------------------------------------------------------ the real model


@pytest.mark.slow
def test_real_model_follows_response_format(smollm2_loaded):
    person = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
              "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0}}}
    srv = Server(Runtime(smollm2_loaded, 256), bind("127.0.0.1", 0), model_id="smollm2", rows=2).start()
    try:
        client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=120)
        ask = [{"role": "user", "content": "Describe Alice, 30, as JSON."}]
        r = client.chat.completions.create(model="smollm2", messages=ask, temperature=0, max_tokens=40, response_format={
            "type": "json_schema", "json_schema": {"name": "person", "schema": person, "strict": True}})
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), person)
        ask = [{"role": "user", "content": "Reply with a JSON object with keys name and age for Alice, 30."}]
        r = client.chat.completions.create(model="smollm2", messages=ask, temperature=0, max_tokens=40,
                                           response_format={"type": "json_object"}, stream=True)
        assert isinstance(json.loads("".join(c.choices[0].delta.content or "" for c in r if c.choices)), dict)
    finally:
        srv.close()


# ------------------------------------------------------------------------------ the command


def test_cli_serves_until_sigterm(tiny_folder):
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "llmcli", "serve", str(tiny_folder), "--port", "0", "-t", "1",
                             "--rows", "2", "-v"], stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(90, proc.kill)  # a server that never says it is serving fails, not hangs
    watchdog.start()
    try:
        lines = []
        for line in proc.stderr:  # until the banner
            lines.append(line)
            if line.startswith("serving "):
                break
        banner = lines[-1]
        assert banner.startswith(f"serving {tiny_folder} on http://127.0.0.1:") and "(2 rows of 256 tokens)" in banner, lines
        url = banner.split(" on ")[1].split()[0]
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        (served,) = [m.id for m in client.models.list().data]
        assert served == str(tiny_folder)  # MODEL as given on the command line
        r = client.chat.completions.create(model=served, messages=ASK, temperature=0, max_tokens=4)
        assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
        # another server on that port (every address): a warning about the open host, then one error line
        busy = run_cli("serve", str(tiny_folder), "--host", "0.0.0.0", "--port", url.rsplit(":", 1)[1].split("/")[0],
                       timeout=60)
        said = busy.stderr.strip().splitlines()
        assert busy.returncode == 1 and len(said) == 2, busy.stderr
        assert said[0].startswith("warning: --host 0.0.0.0") and "no authentication" in said[0]
        assert said[1].startswith("error: port ") and said[1].endswith("is in use; pass --port")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0 and time.monotonic() - t0 < 5
        rest = proc.stderr.read()
        assert "POST /v1/chat/completions 200" in rest and "stopped (SIGTERM)" in rest and "Traceback" not in rest
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
