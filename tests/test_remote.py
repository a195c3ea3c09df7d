"""A remote engine (`--api URL`): `run`, `chat`, `batch` and `bench` against an OpenAI-compatible
server, here `llmcli serve` on 127.0.0.1 with the tiny model in this process. Greedy answers are the
local ones on the same model; the key is sent; a server that is down, a wrong key, a model it does
not serve and flags that only mean something locally are one `error:` line each."""

from __future__ import annotations

import json
import socket
import time

import pytest
from conftest import run_cli

from llmcli.decode.constrained import from_json_schema, from_regex
from llmcli.decode.request import Request
from llmcli.decode.sampling_plain import SamplingParams
from llmcli.runtime.flags import ModelFlags
from llmcli.runtime.lean import open_lean
from llmcli.runtime.remote import RemotePrompt, request_fields
from llmcli.runtime.remote_http import Endpoint
from llmcli.serve.http import Server
from llmcli.serve.listener import bind

KEY = "sk-remote-test"
PROMPT = "What is the capital of France?"
ENV = {"LLMCLI_API_KEY": KEY}  # (the key as users keep it out of `ps`)


@pytest.fixture(scope="module")
def served(tiny_gguf):
    """The tiny model served as `llmcli run` would run it here (torch-free where it can), behind a key."""
    rt = open_lean(ModelFlags(str(tiny_gguf), rows=2))
    if rt is None:
        from llmcli.runtime.runtime import open_model

        rt = open_model(ModelFlags(str(tiny_gguf), rows=2))
    srv = Server(rt, bind("127.0.0.1", 0), model_id="tiny", rows=2, api_key=KEY).start()
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def down() -> str:
    """The URL of a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def _one_error(r, *words: str) -> None:
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_run_is_the_local_answer(served, tiny_gguf):
    greedy = ("--temp", "0", "-n", "12")
    local = run_cli("run", str(tiny_gguf), PROMPT, *greedy)
    remote = run_cli("run", "tiny", PROMPT, *greedy, "--api", served.url, env=ENV)
    assert local.returncode == 0 and remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout and remote.stderr == ""
    local = json.loads(run_cli("run", str(tiny_gguf), PROMPT, *greedy, "--system", "Be brief.", "--json").stdout)
    remote = json.loads(run_cli("run", "tiny", PROMPT, *greedy, "--system", "Be brief.", "--json", "--api", served.url,
                                env=ENV).stdout)
    assert remote["model"] == "tiny"
    for key in ("text", "finish_reason", "stopped_by", "usage"):
        assert remote.get(key) == local.get(key), key
    assert remote["timings"]["ttft_s"] > 0


@pytest.mark.parametrize("constraint", [("--regex", "[a-c]{4}"), ("--grammar", "yn.gbnf"), ("--json-schema", "s.json")])
def test_a_constraint_goes_to_the_server(served, tiny_gguf, tmp_path, constraint):
    (tmp_path / "yn.gbnf").write_text('root ::= "yes" | "no"\n')
    (tmp_path / "s.json").write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}},
                                                 "required": ["n"], "additionalProperties": False}))
    ask = (PROMPT, *constraint, "--temp", "0", "-n", "64")
    local = run_cli("run", str(tiny_gguf), *ask, cwd=tmp_path)
    remote = run_cli("run", "tiny", *ask, "--api", served.url, cwd=tmp_path, env=ENV)
    assert (remote.returncode, remote.stdout, remote.stderr) == (local.returncode, local.stdout, local.stderr)


def test_run_raw_goes_to_completions(served, tiny_gguf):
    local = run_cli("run", str(tiny_gguf), "Once upon a time", "--raw", "--temp", "0", "-n", "8")
    remote = run_cli("run", "tiny", "Once upon a time", "--raw", "--temp", "0", "-n", "8", "--api", served.url, env=ENV)
    assert remote.returncode == 0 and remote.stdout == local.stdout, remote.stderr


def test_piped_chat_is_the_local_transcript(served, tiny_gguf, tmp_path):
    messages = "Hello!\nWhat is the capital of France?\n/save chat.json\n"
    flags = ("--temp", "0", "-n", "8", "--system", "You are terse.")
    local = run_cli("chat", str(tiny_gguf), *flags, input=messages, cwd=tmp_path)
    (tmp_path / "chat.json").rename(tmp_path / "local.json")
    remote = run_cli("chat", *flags, "--api", served.url, input=messages, cwd=tmp_path, env=ENV)  # its only model
    assert local.returncode == 0 and remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout and remote.stderr == "saved 4 messages to chat.json\n"
    saved = json.loads((tmp_path / "chat.json").read_text())
    assert saved["messages"] == json.loads((tmp_path / "local.json").read_text())["messages"]
    assert saved["model"]["name"] == "tiny"


def test_batch_resumes_and_retries_a_schema_like_the_local_run(served, tiny_gguf, tmp_path):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    lines = [{"id": 1, "prompt": "Name a colour."}, {"id": "s", "prompt": "Hi", "max_tokens": 3, "json_schema": schema},
             {"id": 3, "messages": [{"role": "user", "content": "Count to five."}]}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    flags = ("--temp", "0", "-n", "6", "--retries", "1")
    local = run_cli("batch", str(tiny_gguf), "in.jsonl", "-o", "local.jsonl", *flags, cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    remote = run_cli("batch", "tiny", "in.jsonl", "-o", "remote.jsonl", *flags, "--api", served.url, cwd=tmp_path, env=ENV)
    assert remote.returncode == 0, remote.stderr
    assert "3 results" in remote.stderr and "requests at once" in remote.stderr

    def by_id(name):
        return {json.dumps(r["id"]): r for r in map(json.loads, (tmp_path / name).read_text().splitlines())}

    want, got = by_id("local.jsonl"), by_id("remote.jsonl")
    assert got == want
    assert got['"s"']["attempts"] == 2  # the schema's output hit its cap of 3: tried again with 6
    # resume: the last result lost, and a torn line after it; only that request is asked again
    kept = (tmp_path / "remote.jsonl").read_text().splitlines()
    (tmp_path / "remote.jsonl").write_text("\n".join(kept[:2]) + '\n{"id": 3, "te')
    again = run_cli("batch", "tiny", "in.jsonl", "-o", "remote.jsonl", *flags, "--api", served.url, cwd=tmp_path, env=ENV)
    assert again.returncode == 0, again.stderr
    assert "2 requests already in remote.jsonl; skipped" in again.stderr and "1 results" in again.stderr
    assert by_id("remote.jsonl") == want


def test_bench_measures_clients_at_once(served):
    r = run_cli("bench", "--api", served.url, "-p", "8", "-n", "4", "-r", "2", "--clients", "1,2", "-o", "json", env=ENV)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["clients"], x["requests"], x["failed"], x["test"]) for x in rows] == [(1, 2, 0, "pp8+tg4"),
                                                                                      (2, 4, 0, "pp8+tg4")]
    assert all(x["ttft_p50_ms"] > 0 and x["latency_p99_s"] >= x["latency_p50_s"] > 0 and x["total_tokens_per_s"] > 0
               for x in rows)
    table = run_cli("bench", "tiny", "--api", served.url, "-p", "8", "-n", "4", "-r", "1", env=ENV)
    assert table.returncode == 0 and "| tiny | 1 | pp8+tg4 | 1 | 0 |" in table.stdout, table.stderr


def test_the_key_is_sent_and_checked(served):
    _one_error(run_cli("run", "tiny", PROMPT, "--api", served.url, env={"LLMCLI_API_KEY": ""}), "wants an API key",
               "--api-key")
    _one_error(run_cli("chat", "--api", served.url, "--api-key", "sk-wrong", input="Hi\n", env={"LLMCLI_API_KEY": ""}),
               "refused the API key")
    ok = run_cli("run", "tiny", PROMPT, "-n", "2", "--api", served.url, "--api-key", KEY, env={"LLMCLI_API_KEY": ""})
    assert ok.returncode == 0, ok.stderr


def test_a_server_that_is_down_is_one_line(down, tmp_path):
    (tmp_path / "in.jsonl").write_text('{"id": 1, "prompt": "Hi"}\n')
    for args in (("run", "tiny", PROMPT), ("chat",), ("batch", "tiny", "in.jsonl", "-o", "out.jsonl"), ("bench",)):
        r = run_cli(*args, "--api", down, input="Hi\n", cwd=tmp_path)
        _one_error(r, f"cannot reach the server at {down}", "connection refused")


def test_what_cannot_go_to_a_server_is_refused(served):
    _one_error(run_cli("run", "other", PROMPT, "--api", served.url, env=ENV), "does not serve 'other'", "tiny")
    _one_error(run_cli("run", "tiny", PROMPT, "--api", served.url, "--quant", "q4", "--threads", "2", env=ENV),
               "--quant, --threads do not apply with --api")
    _one_error(run_cli("run", "tiny", PROMPT, "--api", served.url, "--beams", "2", env=ENV), "--beams does not go")
    _one_error(run_cli("run", "tiny", PROMPT, "--api", "localhost:8000", env=ENV), "--api takes a server's URL")
    _one_error(run_cli("bench", "--clients", "2"), "--clients measures a server")


def test_the_request_value_maps_onto_the_chat_body():
    request = Request(SamplingParams(temperature=0.5, top_k=0, top_p=0.9, min_p=0.0, seed=7, repeat_penalty=1.1),
                      max_tokens=32, stop=("\n\n",), think=False)
    fields = request_fields(request)
    assert fields == {"temperature": 0.5, "top_p": 0.9, "seed": 7, "repeat_penalty": 1.1, "repetition_penalty": 1.1,
                      "repeat_last_n": 64, "max_tokens": 32, "stop": ["\n\n"]}
    schema = {"type": "object"}
    fields = request_fields(Request(grammar=from_json_schema(json.dumps(schema))))
    assert fields["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    assert "top_k" in fields and "min_p" in fields  # (the defaults: 40 and 0.05)
    assert request_fields(Request(grammar=from_regex("[0-9]+/s")))["grammar"] == "start: /[0-9]+\\/s/"
    assert len(RemotePrompt(({"role": "user", "content": "x" * 40},))) == 14  # 40 / 4 + 4 a message
    api = Endpoint.of("http://example.org:8000")
    assert (api.host, api.port, api.prefix) == ("example.org", 8000, "/v1")


def test_the_repl_s_commands_speak_of_the_server(served):
    r = run_cli("chat", "--api", served.url, "--temp", "0", "-n", "4", input="Hi\n/show info\n/set think on\n", env=ENV)
    assert r.returncode == 0, r.stderr
    assert f"model       tiny, served by {served.url}" in r.stderr and "tokens in use" in r.stderr
    assert "thinking on" in r.stderr  # the server decides whether its model thinks


def test_a_batch_failure_comes_after_the_answers_that_came_back():
    from llmcli.decode.batched import Sequence
    from llmcli.decode.stream import Chunk, Stats
    from llmcli.runtime.remote_batch import RemoteBatchEngine
    from llmcli.runtime.remote_http import RemoteError

    class Flaky:
        context_known = False

        def complete(self, prompt, request):
            if prompt.messages[0]["content"] == "bad":
                raise RemoteError("the server at X answered 500: boom")
            time.sleep(0.2)  # (back after the failure)
            return Chunk("ok", [], "stop", Stats())

    engine = RemoteBatchEngine(Flaky(), rows=2, max_len=64)
    good, bad, never = (Sequence(RemotePrompt(({"role": "user", "content": t},)), Request())
                        for t in ("good", "bad", "never"))
    for seq in (good, bad, never):
        engine.submit(seq)
    answered = []
    with pytest.raises(RemoteError, match="boom"):
        while engine.busy:
            answered += [seq for seq, _ in engine.step()]
    assert answered == [good] and not engine.busy  # the one in flight handed over; nothing sent after the failure


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                   "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}


@pytest.fixture(scope="module")
def caller(tmp_path_factory):
    """(folder, server): a tiny model with Qwen2.5's template that opens a tool call at once."""
    from tiny import eager_caller, hf_model, save_hf, tool_tokenizer_json
    from tool_templates import QWEN25

    from llmcli.runtime.runtime import open_model

    data = json.loads(tool_tokenizer_json())
    opener = {t["content"]: t["id"] for t in data["added_tokens"]}["<tool_call>"]
    model = eager_caller(hf_model("llama", max_position_embeddings=2048), opener)
    folder = save_hf(model, tmp_path_factory.mktemp("caller"), QWEN25, tools=True)
    srv = Server(open_model(str(folder), device="cpu", dtype="float32", threads=1), bind("127.0.0.1", 0),
                 model_id="caller", rows=2).start()
    yield folder, srv
    srv.close()


def test_tool_calls_come_back_as_the_local_ones(caller, tmp_path):
    folder, srv = caller
    (tmp_path / "tools.json").write_text(json.dumps([WEATHER]))
    ask = ("What is the weather in Paris for the next 2 days?", "--tools", "tools.json", "--temp", "0", "-n", "200")
    local = run_cli("run", str(folder), *ask, "--device", "cpu", "--dtype", "float32", "--threads", "1", cwd=tmp_path)
    remote = run_cli("run", "caller", *ask, "--api", srv.url, cwd=tmp_path)
    assert local.returncode == 0 and remote.returncode == 0, remote.stderr
    calls = json.loads(remote.stdout)
    assert remote.stdout == local.stdout and calls[0]["name"] == "get_weather"
    # the REPL: the call printed as JSON, /tool answers it, the model goes on with the result in its history
    chat = run_cli("chat", "--api", srv.url, "--tools", "tools.json", "--temp", "0", "-n", "200",
                   input="What is the weather in Paris?\n/tool {\"sky\": \"clear\"}\n/save chat.json\n", cwd=tmp_path)
    assert chat.returncode == 0, chat.stderr
    saved = json.loads((tmp_path / "chat.json").read_text())["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant", "tool", "assistant"]
    assert saved[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert saved[2]["tool_call_id"] == saved[1]["tool_calls"][0]["id"]


def test_the_repl_at_a_terminal(served, tmp_path, monkeypatch):
    pytest.importorskip("pexpect")
    from test_chat_pty import STATS, leave, send, spawn

    monkeypatch.setenv("LLMCLI_API_KEY", KEY)
    child = spawn(tmp_path, "--api", served.url, "--temp", "0", "-n", "6")
    assert f"tiny · served by {served.url} · the server's context" in child.before
    send(child, "Hello!", STATS.replace(r"context \d+/\d+", r"context \d+/\?"))
    send(child, "/show info", "served by")
    leave(child, tmp_path)
