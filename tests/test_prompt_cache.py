"""The prompt cache across requests: what it keeps and drops (LRU, a byte budget), and that reusing
it changes nothing in the answers. Conversations go through `llmcli serve` with the real `openai`
client and are compared turn by turn with a cold generate() of the same prompt (greedy)."""

from __future__ import annotations

import json
import threading

import openai
import pytest
import torch
from conftest import run_cli
from test_cli_run import assert_one_line_error

from llmcli.cache import common_prefix, new_cache
from llmcli.cache.prompt_cache import PromptCache
from llmcli.decode.batched import BatchEngine, Sequence
from llmcli.decode.generate import generate
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.runtime.runtime import Runtime, open_model
from llmcli.serve.http import Server
from llmcli.serve.listener import bind

GREEDY = SamplingParams(temperature=0)
SYSTEM = {"role": "system", "content": "Be brief and kind."}
QUESTIONS = ["What is the capital of France?", "And of Italy?", "Which is bigger?", "Name a river there.",
             "Thanks! One more: what is 2+2?"]


class Args:  # what new_cache needs of a model's args
    num_hidden_layers, num_key_value_heads, head_dim = 2, 2, 4


def kv(rows=2, max_len=32):
    cache = new_cache(Args, max_len, torch.device("cpu"), torch.float32, batch=rows)
    for t in cache.k + cache.v:
        t.copy_(torch.randn_like(t))
    return cache


PER_TOKEN = 2 * 2 * 2 * 4 * 4  # bytes a token: layers x (k, v) x heads x head_dim x float32


def test_restore_copies_the_longest_shared_prefix():
    cache, pc = kv(), PromptCache(1 << 20)
    pc.store([1, 2, 3, 4, 5], cache, 0)
    pc.store([1, 2, 9], cache, 1)
    held = [t[0, :, :5].clone() for t in cache.k + cache.v]
    for t in cache.k + cache.v:
        t.zero_()
    assert pc.restore([1, 2, 3, 4, 7, 7], cache, 1) == 4  # from the first entry, into row 1
    assert all(torch.equal(t[1, :, :4], h[:, :4]) for t, h in zip(cache.k + cache.v, held))
    assert all(not t[1, :, 4:].any() for t in cache.k + cache.v) and all(not t[0].any() for t in cache.k)
    assert pc.restore([1, 2, 3, 4, 5], cache, 0, limit=4) == 4  # one token left to run for the logits
    assert pc.restore([8, 1, 2], cache, 0) == 0
    assert (pc.hits, pc.misses, pc.reused_tokens) == (2, 1, 8)


def test_a_conversation_keeps_one_entry_and_the_budget_holds():
    cache, pc = kv(), PromptCache(12 * PER_TOKEN)
    pc.store([1, 2, 3], cache, 0)
    pc.store([1, 2, 3, 4, 5], cache, 0)  # the next turn: it starts with the first, which goes
    pc.store([1, 2], cache, 1)  # already held as the start of an entry: nothing new
    assert [list(e.ids) for e in pc.entries.values()] == [[1, 2, 3, 4, 5]] and pc.nbytes == 5 * PER_TOKEN
    pc.store([7, 8, 9, 10], cache, 1)
    pc.restore([1, 2, 3, 4, 5], cache, 0)  # the first is now the most recently used
    pc.store([20, 21, 22, 23, 24], cache, 1)  # over the budget: the least recently used leaves
    assert [list(e.ids)[0] for e in pc.entries.values()] == [1, 20] and pc.evicted == 1
    assert pc.nbytes == pc.stats["bytes"] == 10 * PER_TOKEN <= pc.max_bytes and pc.stats["tokens"] == 10
    pc.store(list(range(100, 113)), cache, 0)  # larger than the whole budget: never kept
    assert len(pc.entries) == 2


def test_engine_answers_equal_cold_ones_and_count_cached_tokens(tiny_folder, one_thread):
    rt = open_model(str(tiny_folder), device="cpu", dtype="float32")
    engine, cold = rt.batch_engine(2, 256), rt.batch_engine(2, 256, prompt_cache=0)
    assert engine.prompt_cache is not None and cold.prompt_cache is None
    messages, previous = [SYSTEM], 0
    for question in QUESTIONS[:3]:
        messages.append({"role": "user", "content": question})
        ids = rt.prompt_ids(messages)
        events = list(engine.run([Sequence(ids, Request(GREEDY, 16))]))
        text, last = "".join(c.text for _, c in events), events[-1][1]
        want = "".join(c.text for c in rt.generate(ids, Request(GREEDY, max_tokens=16), rt.new_cache()))
        assert text == want
        assert last.stats.cached_tokens >= previous and (previous == 0 or last.stats.cached_tokens > 0)
        assert list(cold.run([Sequence(ids, Request(GREEDY, 16))]))[-1][1].stats.cached_tokens == 0
        previous = len(ids)  # the next turn's prompt starts with this one
        messages.append({"role": "assistant", "content": text})


def chat_through(client, turns, reference, model="m", max_tokens=24, stream_every=2):
    """Ask `turns` in one conversation; each answer is checked against `reference(messages)`.
    Returns the usage of each turn."""
    messages, usages = [SYSTEM], []
    for i, question in enumerate(turns):
        messages.append({"role": "user", "content": question})
        if i % stream_every == 1:
            chunks = list(client.chat.completions.create(model=model, messages=messages, temperature=0,
                                                         max_tokens=max_tokens, stream=True,
                                                         stream_options={"include_usage": True}))
            text, use = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage
        else:
            r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens)
            text, use = r.choices[0].message.content, r.usage
        assert text == reference(messages), f"turn {i + 1}"
        usages.append(use)
        messages.append({"role": "assistant", "content": text})
    return usages


def cold(rt, max_tokens):
    def answer(messages):
        chunks = rt.generate(rt.prompt_ids(messages), Request(GREEDY, max_tokens=max_tokens), rt.new_cache())
        return "".join(c.text for c in chunks)
    return answer


def test_served_conversation_reuses_its_history(tiny_folder, one_thread):
    rt = open_model(str(tiny_folder), device="cpu", dtype="float32")
    srv = Server(rt, bind("127.0.0.1", 0), model_id="m", rows=2).start()
    try:
        client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
        usages = chat_through(client, QUESTIONS[:3], cold(rt, 12), max_tokens=12)
        cached = [u.prompt_tokens_details.cached_tokens for u in usages]
        assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
        assert all(c >= p.prompt_tokens for c, p in zip(cached[1:], usages))  # at least the previous prompt
        # another conversation with the same system prompt starts from it
        other = [SYSTEM, {"role": "user", "content": "Something else entirely"}]
        r = client.chat.completions.create(model="m", messages=other, temperature=0, max_tokens=4)
        shared = common_prefix(rt.prompt_ids(other), rt.prompt_ids([SYSTEM, {"role": "user", "content": QUESTIONS[0]}]))
        assert r.usage.prompt_tokens_details.cached_tokens >= shared > 20
        assert r.choices[0].message.content == cold(rt, 4)(other)
        assert srv.loop.stats["prompt_cache"]["hits"] == 3  # turns 2 and 3, and the other conversation
    finally:
        srv.close()


def test_a_request_with_cache_prompt_false_neither_reuses_nor_keeps(tiny_folder, one_thread):
    """llama-server's per-request `cache_prompt`: false answers cold (the same text) and leaves the
    cache as it was; a bad value is a 400."""
    rt = open_model(str(tiny_folder), device="cpu", dtype="float32")
    srv = Server(rt, bind("127.0.0.1", 0), model_id="m", rows=2).start()
    try:
        client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
        messages = [SYSTEM, {"role": "user", "content": QUESTIONS[0]}]
        first = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=6)
        entries = len(srv.loop.engine.prompt_cache.entries)
        r = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=6,
                                           extra_body={"cache_prompt": False})
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert r.choices[0].message.content == first.choices[0].message.content == cold(rt, 6)(messages)
        assert len(srv.loop.engine.prompt_cache.entries) == entries and srv.loop.stats["prompt_cache"]["hits"] == 0
        again = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=6)
        assert again.usage.prompt_tokens_details.cached_tokens > 0  # the first request's KV was kept
        with pytest.raises(openai.BadRequestError, match="cache_prompt must be true or false"):
            client.completions.create(model="m", prompt="Hello", max_tokens=2, extra_body={"cache_prompt": "no"})
    finally:
        srv.close()


def test_without_the_cache_nothing_is_cached(tiny_folder, one_thread):
    rt = open_model(str(tiny_folder), device="cpu", dtype="float32")
    srv = Server(rt, bind("127.0.0.1", 0), model_id="m", rows=2, prompt_cache=0).start()
    try:
        client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
        usages = chat_through(client, QUESTIONS[:2], cold(rt, 8), max_tokens=8)
        assert [u.prompt_tokens_details.cached_tokens for u in usages] == [0, 0]
        assert srv.loop.stats["prompt_cache"] is None
    finally:
        srv.close()


def test_concurrent_conversations_share_the_cache_and_stay_right(tiny_folder, one_thread):
    rt = open_model(str(tiny_folder), device="cpu", dtype="float32")
    srv = Server(rt, bind("127.0.0.1", 0), model_id="m", rows=2, prompt_cache=64 * 1024).start()  # a few entries
    try:
        client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
        reference, failures = cold(rt, 8), []

        def talk(k):
            try:
                chat_through(client, [f"{q} ({k})" for q in QUESTIONS[:3]], reference, max_tokens=8)
            except AssertionError as e:
                failures.append(e)

        threads = [threading.Thread(target=talk, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failures
        stats = srv.loop.stats["prompt_cache"]
        assert stats["bytes"] <= 64 * 1024 and stats["evicted"] > 0 and stats["hits"] > 0
    finally:
        srv.close()


@pytest.mark.slow
def test_smollm2_conversation_equals_cold_runs(smollm2_loaded):
    rt = Runtime(smollm2_loaded, 1024)
    srv = Server(rt, bind("127.0.0.1", 0), model_id="smollm2", rows=2).start()
    try:
        client = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=300)
        usages = chat_through(client, QUESTIONS, cold(rt, 32), model="smollm2", max_tokens=32)
        cached = [u.prompt_tokens_details.cached_tokens for u in usages]
        # each turn reuses the previous prompt and most of the reply (the template closes it differently)
        assert cached[0] == 0 and all(c >= p.prompt_tokens for c, p in zip(cached[1:], usages)), cached
        assert all(u.prompt_tokens - u.prompt_tokens_details.cached_tokens < 40 for u in usages[1:])
    finally:
        srv.close()


def test_batch_engine_alone_has_no_prompt_cache(tiny_folder, one_thread):
    """BatchEngine's own default: none (the runtime's batch_engine() gives serve and batch one)."""
    rt = open_model(str(tiny_folder), device="cpu", dtype="float32")
    engine = BatchEngine(rt.loaded.model, rt.loaded.tokenizer, rt.placement.device, rt.placement.dtype, 2, 64)
    assert engine.prompt_cache is None
    assert rt.prompt_cache_budget() == min(1 << 30, max(0, (rt.plan.budget.free - rt.plan.taken_bytes) // 4))


def test_batch_reuses_a_shared_system_prompt_and_flags_are_checked(tiny_folder, tmp_path):
    lines = [{"id": i, "messages": [SYSTEM, {"role": "user", "content": q}], "max_tokens": 4}
             for i, q in enumerate(QUESTIONS)]
    (tmp_path / "in.jsonl").write_text("\n".join(map(json.dumps, lines)))
    r = run_cli("batch", str(tiny_folder), str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"), "--temp", "0",
                "--rows", "1", "-t", "1", "-v")
    assert r.returncode == 0, r.stderr
    reused = int(r.stderr.split(" prompt tokens taken from the prompt cache")[0].rsplit("; ", 1)[1])
    assert reused >= 4 * 20  # every line after the first starts from the system prompt
    off = run_cli("batch", str(tiny_folder), str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "off.jsonl"), "--temp",
                  "0", "--rows", "1", "-t", "1", "--cache-ram", "0")
    assert sorted(open(tmp_path / "off.jsonl")) == sorted(open(tmp_path / "out.jsonl"))  # the same answers
    assert_one_line_error(run_cli("serve", str(tiny_folder), "--cache-ram", "-1"), "--cache-ram must be from 0")
    assert off.returncode == 0


@pytest.mark.parametrize("model", ["tiny_gguf", "tiny_folder"])
def test_requests_that_arrive_together_compute_their_shared_start_once(model, request, one_thread):
    """Four chats with one long system prompt submitted at once: the first computes it, the others
    copy it from that row (through the native step they wait a step for it; through the model it is
    prefilled at admission), and every answer is what a cold generate() gives (native step: exactly)."""
    from llmcli.decode.batched import SHARED_WAIT

    rt = open_model(str(request.getfixturevalue(model)), device="cpu", dtype="float32")
    system = {"role": "system", "content": "You answer in one careful sentence. " * 6}
    prompts = [rt.prompt_ids([system, {"role": "user", "content": q}]) for q in QUESTIONS[:4]]
    shared = min(common_prefix(prompts[0], p) for p in prompts[1:])
    assert shared > 2 * SHARED_WAIT
    for cache_prompt in (True, False):
        engine = rt.batch_engine(4, 256)
        native = getattr(engine.step_fn, "native", False)
        assert native == (model == "tiny_gguf")
        reqs = [Sequence(p, Request(GREEDY, 8, cache_prompt=cache_prompt)) for p in prompts]
        texts, last = {r: "" for r in reqs}, {}
        for req, chunk in engine.run(reqs):
            texts[req] += chunk.text
            if chunk.finish_reason:
                last[req] = chunk
        cached = [last[r].stats.cached_tokens for r in reqs]
        if cache_prompt:
            assert cached[0] == 0 and all(c >= shared for c in cached[1:]), cached
        else:
            assert cached == [0, 0, 0, 0]
        if native:
            for req, ids in zip(reqs, prompts):
                want = rt.generate(ids, Request(GREEDY, max_tokens=8), rt.new_cache())
                assert texts[req] == "".join(c.text for c in want)
