"""`llmcli serve` with no model or several: any model a request names is loaded on demand
(serve/models.py), once however many ask at once, the least recently used idle one unloaded to make
room, idle ones unloaded after their keep_alive; what fails to load is that request's error."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from llmcli import native
from llmcli.decode.request import Request
from llmcli.decode.sampling_plain import SamplingParams
from llmcli.runtime.flags import ModelFlags
from llmcli.runtime.lean import open_lean
from llmcli.runtime.runtime import open_model
from llmcli.serve.http import Server
from llmcli.serve.listener import bind

ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def files(tiny_gguf, tmp_path_factory):
    """Two files of the tiny model (two models to the server), and one that is not a model."""
    root = tmp_path_factory.mktemp("models")
    a, b, bad = root / "a.gguf", root / "b.gguf", root / "bad.gguf"
    shutil.copy(tiny_gguf, a)
    shutil.copy(tiny_gguf, b)
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    return a, b, bad


def opener(opened: list):
    def open_one(name: str):
        time.sleep(0.3)  # (a load takes a while: requests that come meanwhile wait for it)
        flags = ModelFlags(name, ctx_size=128, threads=1, rows=2)
        rt = open_lean(flags) if native.int8_dot() else None
        rt = rt or open_model(flags)
        opened.append(name)
        return rt
    return open_one


def start(**kw):
    opened = []
    srv = Server(None, bind("127.0.0.1", 0), model_id=None, rows=2, open_model=opener(opened), **kw).start()
    return srv, opened, openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=60)


def ask(client, model, n=6):
    return client.chat.completions.create(model=str(model), messages=ASK, temperature=0, max_tokens=n)


def test_models_load_on_first_use_once_and_answer_as_alone(files):
    a, b, _ = files
    srv, opened, client = start()
    try:
        assert client.models.list().data == []
        with ThreadPoolExecutor(4) as pool:  # four at once for a model not loaded: one load
            answers = list(pool.map(lambda _: ask(client, a).choices[0].message.content, range(4)))
        assert opened == [str(a)] and len(set(answers)) == 1
        rt = srv.models.loaded()[0].rt
        want = "".join(c.text for c in rt.generate(rt.prompt_ids(ASK), Request(SamplingParams(temperature=0), 6),
                                                    rt.new_cache()))
        assert answers[0] == want
        r = ask(client, b)
        assert r.model == str(b) and opened == [str(a), str(b)]
        cards = client.models.list().data
        assert [m.id for m in cards] == [str(b), str(a)]  # most recently used first
        assert all(m.llmcli["memory_bytes"] > 0 for m in cards)
        ask(client, a)
        assert len(opened) == 2  # still loaded: not again
    finally:
        srv.close()


def test_the_least_recently_used_idle_model_makes_room(files):
    a, b, _ = files
    srv, opened, client = start(models_max=1)
    try:
        assert srv.rt is None and srv.first is None  # (nothing loaded yet)
        first = ask(client, a).choices[0].message.content
        assert ask(client, b).choices[0].message.content == first  # (the same weights)
        assert [m.id for m in client.models.list().data] == [str(b)]
        assert srv.first.name == str(b) and srv.rt is srv.first.rt  # the model loaded now, not the first one
        ask(client, a)
        assert opened == [str(a), str(b), str(a)] and [m.id for m in client.models.list().data] == [str(a)]
    finally:
        srv.close()


def test_idle_models_unload_after_their_keep_alive(files):
    a, _, _ = files
    srv, opened, client = start(keep_alive=0.5)
    try:
        ask(client, a)
        assert len(client.models.list().data) == 1
        deadline = time.monotonic() + 10
        while client.models.list().data and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.models.list().data == []
        ask(client, a)
        assert opened == [str(a), str(a)]
    finally:
        srv.close()


def test_what_cannot_load_is_that_request_s_error(files, tmp_path):
    a, _, bad = files
    srv, opened, client = start()
    try:
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            ask(client, tmp_path / "nowhere.gguf")
        with pytest.raises(openai.BadRequestError, match="cannot be served"):
            ask(client, bad)
        assert ask(client, a).choices[0].finish_reason in ("stop", "length")  # and it goes on
    finally:
        srv.close()


def test_cli_serves_any_model_a_request_names(files):
    a, b, _ = files
    proc = subprocess.Popen([sys.executable, "-m", "llmcli", "serve", "--port", "0", "-t", "1", "--rows", "2", "-c", "128",
                             "--models-max", "1", "--keep-alive", "1m"], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NO_COLOR": "1"})
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        for line in proc.stderr:
            if line.startswith("serving "):
                break
        assert line.startswith("serving models on demand (at most 1 at once) on http://127.0.0.1:"), line
        client = openai.OpenAI(base_url=line.split(" on ")[2].split()[0], api_key="x", max_retries=0, timeout=60)
        assert ask(client, a).model == str(a) and ask(client, b).model == str(b)
        assert [m.id for m in client.models.list().data] == [str(b)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0 and "Traceback" not in proc.stderr.read()
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()


def test_ollama_keep_alive_sets_when_a_model_unloads(files):
    """keep_alive on a request: that model's idle time from then on; a load request with keep_alive 0
    unloads it (ollama's way)."""
    import ollama

    a, b, _ = files
    srv, opened, _ = start(keep_alive=None)
    try:
        client = ollama.Client(host=srv.url.removesuffix("/v1"))
        client.chat(model=str(a), messages=ASK, options={"num_predict": 2, "temperature": 0}, keep_alive="1s")
        client.generate(model=str(b))  # loaded, kept for good (the server's keep_alive)
        assert sorted(m.model for m in client.ps().models) == sorted([str(a), str(b)])
        deadline = time.monotonic() + 10
        while len(client.ps().models) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [m.model for m in client.ps().models] == [str(b)]
        assert client.generate(model=str(b), keep_alive=0).done_reason == "unload"
        while client.ps().models and time.monotonic() < deadline + 5:
            time.sleep(0.2)
        assert client.ps().models == [] and opened == [str(a), str(b)]
    finally:
        srv.close()


def test_with_one_model_at_a_time_requests_for_others_wait_their_turn(files):
    """--models-max 1 and requests for two models at once: every one answered, never two loaded."""
    a, b, _ = files
    srv, opened, client = start(models_max=1)
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(len(srv.models.loaded()))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda i: ask(client, (a, b)[i % 2]).choices[0].finish_reason, range(6)))
        assert all(r in ("stop", "length") for r in answers) and max(seen) == 1
        assert set(opened) == {str(a), str(b)}
    finally:
        stop.set()
        watcher.join()
        srv.close()
