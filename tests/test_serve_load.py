"""`llmcli serve` under load and under attack (issue 21): 50 clients at once all answered right,
503 + Retry-After past the queue bound, slow clients cut off by the timeouts, and hostile requests
answered 4xx at once, never 500, a hang or a traceback in the log. The tiny random llama keeps it fast."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import openai
import pytest
import torch
from conftest import REPO, run_cli

from llmcli.cli import serve as cli_serve
from llmcli.decode.generate import generate
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.json_input import MAX_JSON_DEPTH
from llmcli.runtime.runtime import open_model
from llmcli.serve import http as server_mod
from llmcli.serve.http import Server
from llmcli.serve.listener import Timeouts, bind


GREEDY = SamplingParams(temperature=0)
QUICK = Timeouts(head=0.5, body=0.5, write=0.5)


@pytest.fixture(scope="module")
def rt(tiny_folder):
    threads = torch.get_num_threads()
    yield open_model(str(tiny_folder), device="cpu", dtype="float32", threads=1)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def wide(rt):
    """8 rows and the default queue (64): room for 72 requests."""
    srv = Server(rt, bind("127.0.0.1", 0), model_id="tiny", rows=8).start()
    yield srv
    srv.close()


@pytest.fixture
def narrow(rt):
    """One row, one place in the queue, half-second timeouts."""
    srv = Server(rt, bind("127.0.0.1", 0), model_id="tiny", rows=1, queue=1, timeouts=QUICK).start()
    yield srv
    srv.close()


@pytest.fixture
def quiet_log(caplog, capfd):
    """After the test: no traceback and no ERROR line anywhere in the log or on stderr."""
    with caplog.at_level("INFO", logger="llmcli.server"):
        yield caplog
    assert "Traceback" not in caplog.text and "Traceback" not in capfd.readouterr().err
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")], caplog.text


def logged(caplog, needle: str, times: int = 1, wait: float = 5.0) -> bool:
    """Whether the log says `needle` `times` times within `wait` s (a request's line comes once its
    answer is sent: the client may have it first)."""
    deadline = time.monotonic() + wait
    while caplog.text.count(needle) < times and time.monotonic() < deadline:
        time.sleep(0.02)
    return caplog.text.count(needle) == times


def talk(srv, data: bytes, wait: float = 5.0, shut: bool = False) -> tuple[bytes, float]:
    """Send raw bytes; (everything the server sends until it closes or `wait` passes, seconds taken)."""
    sock = socket.create_connection(srv.address, timeout=wait)
    t0 = time.monotonic()
    try:
        sock.sendall(data)
        if shut:
            sock.shutdown(socket.SHUT_WR)
    except OSError:  # answered and closed before all was sent
        pass
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    sock.close()
    return got, time.monotonic() - t0


def answer(raw: bytes) -> tuple[int, dict, dict]:
    """(status, headers lower-cased, JSON body) of one HTTP answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, v in (line.split(":", 1) for line in lines[1:]))
    return int(lines[0].split()[1]), headers, json.loads(body)


def post(path: str, body: bytes, headers: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def reference(rt, ids, max_tokens):
    return "".join(c.text for c in rt.generate(ids, Request(GREEDY, max_tokens=max_tokens), rt.new_cache()))


# ------------------------------------------------------------------------------ many clients


def test_fifty_clients_at_once_are_all_answered_right(rt, wide, quiet_log):
    """Half streamed, half not, chat and completions: no reset, no 5xx, each the answer it gets alone."""
    client = openai.OpenAI(base_url=wide.url, api_key="x", max_retries=0, timeout=120)
    topics = ["the sea", "a city", "bread", "a clock", "snow", "a violin", "rivers"]
    asks = [f"Tell me about {topics[i % len(topics)]} #{i}" for i in range(50)]
    wants = [reference(rt, rt.prompt_ids([{"role": "user", "content": a}]) if i % 4 else rt.loaded.tokenizer.encode(a), 8)
             for i, a in enumerate(asks)]
    start, got, errors = threading.Barrier(50), [None] * 50, []

    def ask(i):
        start.wait()
        try:
            stream = i % 2 == 1
            if i % 4 == 0:  # the legacy endpoint, raw prompt
                r = client.completions.create(model="tiny", prompt=asks[i], temperature=0, max_tokens=8, stream=stream)
                got[i] = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
            else:
                r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": asks[i]}],
                                                   temperature=0, max_tokens=8, stream=stream)
                got[i] = "".join(c.choices[0].delta.content or "" for c in r if c.choices) if stream else \
                    r.choices[0].message.content
        except Exception as e:  # noqa: BLE001 - any failure is the test's finding
            errors.append(f"{i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(50)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert got == wants
    assert time.monotonic() - t0 < 60
    assert wide.loop.stats["mean_batch"] > 2  # they were decoded together
    assert logged(quiet_log, "POST /v1/", 50)


def test_keep_alive_serves_several_requests_on_one_connection(wide):
    sock = socket.create_connection(wide.address, timeout=10)
    body = json.dumps({"prompt": "hi", "max_tokens": 2, "temperature": 0}).encode()
    for _ in range(3):
        sock.sendall(post("/v1/completions", body))
        got = b""
        while not (b"\r\n\r\n" in got and got.rstrip().endswith(b"}}")):
            got += sock.recv(65536)
        status, headers, reply = answer(got)
        assert status == 200 and reply["usage"]["completion_tokens"] == 2 and "connection" not in headers
    sock.close()


# ------------------------------------------------------------------------------ the queue bound


def test_past_the_queue_bound_a_request_gets_503_with_retry_after(rt, narrow, quiet_log):
    engine = narrow.loop.engine
    gate = threading.Event()
    step = engine.step
    engine.step = lambda: gate.wait(30) and step()  # the engine holds still while the queue fills
    client = openai.OpenAI(base_url=narrow.url, api_key="x", max_retries=0, timeout=60)
    ask = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 4}
    held = [threading.Thread(target=lambda: client.chat.completions.create(**ask)) for _ in range(2)]
    try:
        for t in held:  # one for the row, one for the queue
            t.start()
        deadline = time.monotonic() + 10
        while narrow.loop.in_flight < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(**ask)
        assert e.value.status_code == 503 and e.value.code == "server_busy"
        assert int(e.value.response.headers["retry-after"]) >= 1
        assert "--rows + --queue" in e.value.message
    finally:
        gate.set()
        for t in held:
            t.join(30)
    # room again: the next one is answered, and a client that retries gets through
    assert client.chat.completions.create(**ask).usage.completion_tokens == 4
    assert logged(quiet_log, "server is busy")


def test_the_cli_says_the_queue_default_it_uses():
    assert cli_serve.QUEUE_PER_ROW == server_mod.QUEUE_PER_ROW


# ------------------------------------------------------------------------------ slow clients


def test_a_connection_that_says_nothing_is_closed_after_the_timeout(narrow):
    got, took = talk(narrow, b"", wait=5)
    assert got == b"" and 0.4 < took < 3


def test_headers_trickled_in_get_408_and_the_connection_closes(narrow, quiet_log):
    sock = socket.create_connection(narrow.address, timeout=5)
    t0 = time.monotonic()
    got = b""
    for c in b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
        if select.select([sock], [], [], 0.05)[0]:  # the server spoke: stop sending
            break
        sock.sendall(bytes([c]))  # slowloris: a byte at a time, never the end of the headers
    while chunk := sock.recv(65536):
        got += chunk
    sock.close()
    status, headers, body = answer(got)
    assert status == 408 and headers["connection"] == "close" and body["error"]["code"] == "request_timeout"
    assert time.monotonic() - t0 < 3


def test_a_body_trickled_in_gets_408(narrow, quiet_log):
    got, took = talk(narrow, b'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"messages": [')
    status, headers, body = answer(got)
    assert status == 408 and "body did not arrive within 0.5 s" in body["error"]["message"]
    assert headers["connection"] == "close" and took < 3


def test_an_idle_keep_alive_connection_is_closed_after_the_timeout(narrow):
    sock = socket.create_connection(narrow.address, timeout=5)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    while not got.endswith(b"}"):
        got += sock.recv(65536)
    assert b"200 OK" in got
    t0 = time.monotonic()
    assert sock.recv(65536) == b"" and 0.4 < time.monotonic() - t0 < 3
    sock.close()


def test_a_client_that_stops_reading_is_cut_and_its_request_cancelled(rt, narrow, quiet_log):
    """A stream to a client whose socket buffers are full: the write times out, the connection is cut."""
    warm, _ = talk(narrow, post("/v1/completions", b'{"prompt": "x", "max_tokens": 2}', "Connection: close\r\n"),
                   wait=60)  # a first step may build kernels: not while the clock runs
    assert answer(warm)[0] == 200
    narrow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # accepted sockets inherit it
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    sock.connect(narrow.address)
    body = json.dumps({"prompt": "x", "max_tokens": 200, "temperature": 0, "stream": True, "logprobs": 20}).encode()
    engine = narrow.loop.engine
    step = engine.step
    engine.step = lambda: (time.sleep(0.002), step())[1]  # slow enough that the stall shows before the end
    sock.sendall(post("/v1/completions", body))
    gone = logged(quiet_log, "client went away", wait=60)
    sock.close()
    assert gone
    assert narrow.loop.in_flight == 0


# ------------------------------------------------------------------------------ hostile requests


DEEP = b'{"messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"


@pytest.mark.parametrize("name, data, status, needle", [
    ("nested 10,000 deep", post("/v1/chat/completions", DEEP), 400, f"nested more than {MAX_JSON_DEPTH} levels deep"),
    ("a lone surrogate in chat", post("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}'),
     400, "lone surrogate (\\ud800)"),
    ("a lone surrogate prompt", post("/v1/completions", b'{"prompt": "a\\udfff"}'), 400, "lone surrogate"),
    ("not UTF-8", post("/v1/completions", b'{"prompt": "\xff"}'), 400, "not UTF-8"),
    ("a negative Content-Length", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
     400, "not HTTP/1.1"),
    ("a garbage request line", b"\x16\x03\x01 GARBAGE\r\n\r\n", 400, "not HTTP/1.1"),
    ("a header too large", b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * (100 << 10) + b"\r\n\r\n", 400, "not HTTP/1.1"),
    ("an unknown method", b"BREW /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n", 405, "takes POST, not BREW"),
    ("an unknown path", b"BREW /coffee HTTP/1.1\r\nHost: x\r\n\r\n", 404, "no such endpoint"),
    ("a body too large", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9437184\r\n\r\n{",
     413, "the limit is 8388608"),
    ("a chunked body too large", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     + (b"100000\r\n" + b" " * 0x100000 + b"\r\n") * 8 + b"10\r\n" + b" " * 16 + b"\r\n0\r\n\r\n", 413,
     "over the limit"),
    ("broken chunks", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
     "not HTTP/1.1"),
    ("a JSON array", post("/v1/completions", b"[1]"), 400, "must be a JSON object"),
    ("an empty body", post("/v1/completions", b""), 400, "no body"),
])
def test_hostile_requests_get_a_4xx_at_once(narrow, quiet_log, name, data, status, needle):
    got, took = talk(narrow, data, wait=10)
    code, headers, body = answer(got)
    assert (code, body["error"]["type"]) == (status, "invalid_request_error"), (name, got[:300])
    assert needle in body["error"]["message"], body
    assert took < 3, took  # at once, not at a timeout


def test_a_chunked_body_is_read(narrow):
    body = json.dumps({"prompt": "hello", "max_tokens": 3, "temperature": 0}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:7], body[7:])) + b"0\r\n\r\n"
    got, _ = talk(narrow, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                          b"Connection: close\r\n\r\n" + chunked)
    status, _, reply = answer(got)
    assert status == 200 and reply["usage"]["completion_tokens"] == 3


# ------------------------------------------------------------------------------ the command


def test_cli_ctrl_c_exits_0_and_bad_limits_are_one_error(tiny_folder):
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "llmcli", "serve", str(tiny_folder), "--port", "0", "-t", "1",
                             "--rows", "1", "--queue", "2", "--timeout", "5", "-v"], stderr=subprocess.PIPE, text=True,
                            env=env)
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    try:
        said = []
        for line in proc.stderr:
            said.append(line)
            if line.startswith("serving "):
                break
        assert any("up to 2 more requests wait for a row" in line for line in said), said
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
        rest = proc.stderr.read()
        assert "stopped (Ctrl-C)" in rest and "Traceback" not in rest, rest
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
    for flag, value, needle in (("--timeout", "nan", "--timeout must be from 0.1 to 3600"),
                                ("--queue", "-1", "--queue must be from 0")):
        r = run_cli("serve", str(tiny_folder), flag, value, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
