"""`llmcli serve`'s smaller features, with the real `openai` client against the tiny model: the
defaults serve's flags set (a request's own values win), n choices, the grammar field (GBNF),
--api-key, CORS and GET /metrics; and the flags wired through the command itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import jsonschema
import openai
import pytest
import torch
from conftest import REPO
from test_serve import ASK, GREEDY, reference
from test_serve import exchange as raw  # (status, headers, body bytes)

from llmcli.decode.constrained import from_json_schema
from llmcli.decode.sampling import SamplingParams
from llmcli.runtime.runtime import open_model
from llmcli.serve.http import Server
from llmcli.serve.listener import bind
from llmcli.serve.openai_api import Defaults

GRAMMARS = Path(__file__).parent / "data" / "grammars"
PERSON = {"type": "object", "additionalProperties": False, "required": ["name"],
          "properties": {"name": {"type": "string", "maxLength": 8}}}


@pytest.fixture(scope="module")
def rt(tiny_folder):
    threads = torch.get_num_threads()
    yield open_model(str(tiny_folder), device="cpu", dtype="float32", threads=1)
    torch.set_num_threads(threads)


@pytest.fixture
def served(rt):
    """A function starting a server on the tiny model with Server's keywords; all closed after."""
    servers = []

    def start(**kw):
        srv = Server(rt, bind("127.0.0.1", 0), model_id="tiny", rows=4, **kw).start()
        servers.append(srv)
        return srv, openai.OpenAI(base_url=srv.url, api_key=kw.get("api_key") or "x", max_retries=0, timeout=60)

    yield start
    for srv in servers:
        srv.close()


# ------------------------------------------------------------------------------ defaults


def test_serve_defaults_apply_and_a_request_wins(rt, served):
    srv, client = served(defaults=Defaults({"temperature": 0.0}, max_tokens=6, system="Be brief."))
    user = ASK[1:]
    ids = rt.prompt_ids(ASK)  # the default system prompt is added
    r = client.chat.completions.create(model="tiny", messages=user)
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 6
    assert r.choices[0].message.content == reference(rt, ids, max_tokens=6)[0]  # greedy: --temp 0
    own = [{"role": "system", "content": "Be long."}, *user]
    r = client.chat.completions.create(model="tiny", messages=own, max_tokens=3, temperature=1.0, seed=5)
    assert r.usage.prompt_tokens == len(rt.prompt_ids(own)) and r.usage.completion_tokens == 3
    sampled = reference(rt, rt.prompt_ids(own), SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5),
                        max_tokens=3)[0]
    assert r.choices[0].message.content == sampled
    assert client.completions.create(model="tiny", prompt="The quick").usage.completion_tokens == 6


def test_serve_default_schema_applies_to_requests_without_a_format(served):
    srv, client = served(defaults=Defaults({"temperature": 0.0}, max_tokens=60,
                                           grammar=from_json_schema(json.dumps(PERSON))))
    r = client.chat.completions.create(model="tiny", messages=ASK)
    if r.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    else:
        assert r.choices[0].message.content.startswith('{"name": "')
    free = client.chat.completions.create(model="tiny", messages=ASK, response_format={"type": "text"}, max_tokens=4)
    assert not free.choices[0].message.content.startswith('{"name"')


# ------------------------------------------------------------------------------ n choices


def test_n_choices_are_independent_samples_reproducible_by_seed(rt, served):
    srv, client = served()
    params = dict(model="tiny", messages=ASK, max_tokens=10, temperature=1.0)
    r = client.chat.completions.create(n=3, seed=11, **params)
    texts = [c.message.content for c in r.choices]
    assert [c.index for c in r.choices] == [0, 1, 2] and len(set(texts)) == 3
    # choice i is the n=1 answer with seed + i
    alone = [client.chat.completions.create(seed=11 + i, **params) for i in range(3)]
    assert texts == [a.choices[0].message.content for a in alone]
    total = sum(a.usage.completion_tokens for a in alone)
    assert r.usage.completion_tokens == total and r.usage.prompt_tokens == len(rt.prompt_ids(ASK))
    chunks = list(client.chat.completions.create(n=3, seed=11, stream=True, stream_options={"include_usage": True},
                                                 **params))
    streamed = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                for i in range(3)]
    assert streamed == texts and chunks[-1].usage.completion_tokens == total
    finishes = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(f.index for f in finishes) == [0, 1, 2]
    legacy = client.completions.create(model="tiny", prompt="The quick", n=2, seed=4, max_tokens=5, temperature=0)
    assert [c.index for c in legacy.choices] == [0, 1] and legacy.choices[0].text == legacy.choices[1].text


def test_n_choices_are_decoded_together(rt, served):
    srv, client = served()
    engine = srv.loop.engine
    steps, rows = engine.steps, engine.row_steps
    client.chat.completions.create(model="tiny", messages=ASK, n=4, max_tokens=20, temperature=0)
    assert (engine.row_steps - rows) / (engine.steps - steps) > 2


# ------------------------------------------------------------------------------ grammar field


def test_the_grammar_field_takes_llama_cpp_gbnf(served):
    srv, client = served()
    gbnf = (GRAMMARS / "list.gbnf").read_text()
    for stream in (False, True):
        r = client.chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=40, stream=stream,
                                           extra_body={"grammar": gbnf})
        if stream:
            chunks = [c for c in r if c.choices]
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
        else:
            text = r.choices[0].message.content
        assert re.fullmatch(r"(- [^\n]+\n)*(- [^\n]*)?", text), text
        assert text.startswith("- ")
    r = client.completions.create(model="tiny", prompt="Items:", temperature=0, max_tokens=40, extra_body={"grammar": gbnf})
    assert r.choices[0].text.startswith("- ")


# ------------------------------------------------------------------------------ key, CORS, metrics


def test_api_key_is_required_in_openai_shape_and_health_stays_open(served):
    srv, client = served(api_key="sk-test-123")
    assert client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2, temperature=0).usage.completion_tokens == 2
    other = openai.OpenAI(base_url=srv.url, api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as e:
        other.chat.completions.create(model="tiny", messages=ASK, max_tokens=2)
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key" and "not this server's" in e.value.message
    for path in ("/v1/models", "/metrics", "/v1/completions"):  # no key at all
        status, headers, body = raw(srv, "GET" if "comp" not in path else "POST", path, b"{}")
        error = json.loads(body)["error"]
        assert status == 401 and error["code"] == "invalid_api_key" and error["message"].startswith("no API key")
        assert headers["www-authenticate"] == "Bearer"
    assert raw(srv, "GET", "/health")[0] == 200
    status, _, _ = raw(srv, "GET", "/metrics", headers={"Authorization": "Bearer sk-test-123"})
    assert status == 200


def test_cors_is_off_by_default_and_on_for_the_origins_given(served):
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}
    srv, _ = served()
    status, headers, _ = raw(srv, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert status == 405 and "access-control-allow-origin" not in headers
    assert "access-control-allow-origin" not in raw(srv, "GET", "/v1/models", headers={"Origin": "https://app.example"})[1]
    srv, _ = served(cors_origins=("https://app.example",), api_key="k")
    status, headers, _ = raw(srv, "OPTIONS", "/v1/chat/completions", headers=preflight)  # no key needed for it
    assert status == 200 and headers["access-control-allow-origin"] == "https://app.example"
    assert "x-stainless-os" in headers["access-control-allow-headers"].lower()
    status, headers, _ = raw(srv, "GET", "/v1/models", headers={"Origin": "https://app.example"})
    assert status == 401 and headers["access-control-allow-origin"] == "https://app.example"  # the page can read why
    status, headers, _ = raw(srv, "OPTIONS", "/v1/models", headers={**preflight, "Origin": "https://evil.example"})
    assert status == 400 and "access-control-allow-origin" not in headers
    srv, _ = served(cors_origins=("*",))
    assert raw(srv, "GET", "/v1/models", headers={"Origin": "https://any.example"})[1]["access-control-allow-origin"] == "*"


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_in_prometheus_text_format(served):
    srv, client = served()
    before = _samples(raw(srv, "GET", "/metrics")[2].decode())
    r = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=7, n=2, temperature=0)
    c = client.completions.create(model="tiny", prompt="The quick", max_tokens=3, temperature=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=ASK, temperature=5)
    status, headers, body = raw(srv, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    for name in ("requests_total", "prompt_tokens_total", "generated_tokens_total", "requests_waiting", "rows_running",
                 "generated_tokens_per_second"):
        assert f"# TYPE llmcli_{name} " in text and f"# HELP llmcli_{name} " in text
    after = _samples(text)

    def grew(name):
        return after.get(name, 0) - before.get(name, 0)

    assert grew('llmcli_requests_total{endpoint="/v1/chat/completions",status="200"}') == 1
    assert grew('llmcli_requests_total{endpoint="/v1/chat/completions",status="400"}') == 1
    assert grew('llmcli_requests_total{endpoint="/v1/completions",status="200"}') == 1
    assert grew("llmcli_generated_tokens_total") == r.usage.completion_tokens + c.usage.completion_tokens == 17
    assert grew("llmcli_prompt_tokens_total") == 2 * r.usage.prompt_tokens + c.usage.prompt_tokens  # per choice
    assert after["llmcli_rows"] == 4 and after["llmcli_rows_running"] == 0 and after["llmcli_requests_waiting"] == 0
    assert after["llmcli_generated_tokens_per_second"] > 0


# ------------------------------------------------------------------------------ the command


def test_cli_flags_reach_the_server(tiny_folder, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "LLMCLI_API_KEY": "sk-env"}
    proc = subprocess.Popen([sys.executable, "-m", "llmcli", "serve", str(tiny_folder), "--port", "0", "-t", "1",
                             "--rows", "2", "--temp", "0", "-n", "40", "--system", "Be brief.", "--json-schema",
                             str(schema), "--cors", "https://app.example", "--host", "0.0.0.0"],
                            stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("serving "):
                break
        assert not any("no authentication" in x for x in lines), lines  # a key is set
        port = lines[-1].split(" on ")[1].split()[0].rsplit(":", 1)[1].split("/")[0]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-env", max_retries=0, timeout=60)
        r = client.chat.completions.create(model=str(tiny_folder), messages=ASK[1:])
        assert r.choices[0].message.content.startswith('{"name": "')  # --json-schema, greedy
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="no", max_retries=0).models.list()
    finally:
        watchdog.cancel()
        proc.terminate()
        proc.wait(15)


@pytest.mark.parametrize("args, needle", [
    (["--cors", "https://a.example/path"], "--cors takes an origin"),
    (["--temp", "-1"], "--temp must be >= 0"),
    (["-n", "0"], "--max-tokens must be at least 1"),
    (["--api-key", " "], "--api-key (or LLMCLI_API_KEY) is empty"),
])
def test_bad_serve_flags_are_one_line_before_the_model_loads(args, needle):
    from conftest import run_cli

    r = run_cli("serve", "/nonexistent/model.gguf", *args, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr


GREEDY = GREEDY  # (imported for reference(): greedy by default)
