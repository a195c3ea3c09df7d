"""/v1/embeddings on `llmcli serve`, with the real `openai` client on 127.0.0.1: all-MiniLM-L6-v2
against sentence-transformers, the tiny BERT and a causal model with last-token pooling against the
library's Embedder, the request's shapes, and what an embedding-only server refuses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import numpy as np
import openai
import pytest
import torch
from conftest import REPO

from llmcli.runtime.runtime import open_model
from llmcli.serve.http import Server
from llmcli.serve.listener import bind

SENTENCES = ["The cat sits on the mat.", "A feline rests on a rug.", "Quarterly revenue grew by twelve percent."]


def serve(rt, **kw):
    return Server(rt, bind("127.0.0.1", 0), model_id="m", rows=2, **kw).start()


def client_of(srv):
    return openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def bert(tiny_bert_folder, one_thread):
    srv = serve(open_model(str(tiny_bert_folder), allow_encoder=True, dtype="float32"))
    yield srv
    srv.close()


def vectors(response) -> np.ndarray:
    return np.array([d.embedding for d in sorted(response.data, key=lambda d: d.index)], dtype=np.float32)


def test_minilm_over_http_matches_sentence_transformers(minilm_folder, one_thread):
    from sentence_transformers import SentenceTransformer

    srv = serve(open_model(str(minilm_folder), allow_encoder=True, dtype="float32"))
    try:
        client = client_of(srv)
        r = client.embeddings.create(model="m", input=SENTENCES)  # the client asks for base64 and decodes it
        want = SentenceTransformer(str(minilm_folder), device="cpu").encode(SENTENCES)
        got = vectors(r)
        assert got.shape == (3, 384) and np.abs(got - want).max() < 1e-4
        assert r.usage.prompt_tokens == r.usage.total_tokens == 28 and r.model == "m"
        floats = vectors(client.embeddings.create(model="m", input=SENTENCES, encoding_format="float"))
        assert np.array_equal(floats, got)  # the shortest decimals read back as the same float32s
        sims = got @ got.T
        assert sims[0, 1] > 0.5 and abs(sims[0, 2]) < 0.1
    finally:
        srv.close()


def test_inputs_in_every_shape(bert):
    client, e = client_of(bert), bert.embedder
    texts = ["hello world", "the quick brown fox jumps", "x"]
    want = e.embed([e.ids(t) for t in texts]).numpy()
    assert np.abs(vectors(client.embeddings.create(model="m", input=texts)) - want).max() < 1e-6
    one = client.embeddings.create(model="m", input=texts[1], encoding_format="float")
    assert len(one.data) == 1 and one.data[0].index == 0 and np.abs(vectors(one)[0] - want[1]).max() < 1e-6
    plain = [e.tokenizer.encode(t) for t in texts]  # token ids get [CLS] ... [SEP] as a text does
    assert np.abs(vectors(client.embeddings.create(model="m", input=plain)) - want).max() < 1e-6
    r = client.embeddings.create(model="m", input=plain[0], dimensions=64)
    assert np.abs(vectors(r)[0] - want[0]).max() < 1e-6 and r.usage.prompt_tokens == len(plain[0]) + 2


@pytest.mark.parametrize("body, status, needles", [
    ({"input": []}, 400, ["input is empty"]),
    ({"input": ""}, 400, ["input[0] is an empty string"]),
    ({"input": ["ok", 3]}, 400, ["input[1] is not a string or a list of token ids"]),
    ({"input": [[1, 2], [-1]]}, 400, ["input[1] is not a string"]),
    ({"input": [[10 ** 6]]}, 400, ["token id 1000000, outside the vocabulary"]),
    ({"input": ["a"] * 2049}, 400, ["at most 2048"]),
    ({"input": "hi", "encoding_format": "int8"}, 400, ["encoding_format must be float or base64"]),
    ({"input": "hi", "dimensions": 32}, 400, ["64-dimensional vectors", "not trained to be cut shorter"]),
    ({"input": "word " * 40}, 400, ["is 122 tokens; this model embeds at most 48", "context_length_exceeded"]),
    ({"input": "hi", "model": "other"}, 404, ["not served here"]),
])
def test_bad_requests_say_what_is_wrong(bert, body, status, needles):
    with pytest.raises(openai.APIStatusError) as e:
        client_of(bert).embeddings.create(**{"model": "m", **body})
    said = f"{e.value.message} {e.value.body}"
    assert e.value.status_code == status and all(n in said for n in needles), said


def test_truncate_cuts_instead(bert):
    r = client_of(bert).embeddings.create(model="m", input="word " * 40, extra_body={"truncate": True})
    assert r.usage.prompt_tokens == 48


def test_an_embedding_server_refuses_to_generate(bert):
    client = client_of(bert)
    for call in (lambda: client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]),
                 lambda: client.completions.create(model="m", prompt="hi")):
        with pytest.raises(openai.BadRequestError, match="is an embedding model: this server answers /v1/embeddings"):
            call()
    assert [m.id for m in client.models.list().data] == ["m"]


def test_a_causal_model_embeds_with_last_token_pooling_when_asked(tiny_folder, one_thread):
    rt = open_model(str(tiny_folder), dtype="float32")
    plain = serve(rt)
    try:
        with pytest.raises(openai.BadRequestError, match="declare no pooling, so this server does not embed; start it "
                                                         "with --pooling last"):
            client_of(plain).embeddings.create(model="m", input="hi")
    finally:
        plain.close()
    srv = serve(rt, pooling="last")
    try:
        client = client_of(srv)
        texts = ["Hello", "What is the capital of France?"]
        e = rt.embedder("last")
        want = e.embed([e.ids(t) for t in texts]).numpy()
        got = vectors(client.embeddings.create(model="m", input=texts))
        assert np.abs(got - want).max() < 1e-6 and np.allclose(np.linalg.norm(got, axis=1), 1)
        # the same server still chats: embeddings run beside the decode engine
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                              seed=1)  # unseeded, its random model sometimes ended at once
        assert chat.usage.completion_tokens == 3
    finally:
        srv.close()


def test_cli_serves_an_embedding_model(tiny_bert_folder):
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "llmcli", "serve", str(tiny_bert_folder), "--port", "0", "-t", "1"],
                            stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    try:
        banner = next(line for line in proc.stderr if line.startswith("serving "))
        assert banner.rstrip().endswith("(embeddings: 64 dimensions, mean pooling)"), banner
        url = banner.split(" on ")[1].split()[0]
        r = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60).embeddings.create(
            model=str(tiny_bert_folder), input="hello")
        assert len(r.data[0].embedding) == 64 and abs(np.linalg.norm(r.data[0].embedding) - 1) < 1e-5
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()


def test_the_vectors_are_float32_in_base64(bert):
    """What the wire carries when the client asks for base64: little-endian float32, 4 bytes a value."""
    import base64
    import json
    import urllib.request

    req = urllib.request.Request(bert.url + "/embeddings", data=json.dumps(
        {"input": "hello", "encoding_format": "base64"}).encode(), headers={"Content-Type": "application/json"})
    body = json.loads(urllib.request.urlopen(req).read())
    raw = base64.b64decode(body["data"][0]["embedding"])
    e = bert.embedder
    assert len(raw) == 4 * 64 and np.array_equal(np.frombuffer(raw, "<f4"), e.embed([e.ids("hello")])[0].numpy())
    assert body["object"] == "list" and body["data"][0]["object"] == "embedding"
    assert torch.tensor(np.frombuffer(raw, "<f4").copy()).norm().item() == pytest.approx(1, abs=1e-5)
