"""Batched decoding and `llmcli batch`: the engine against generate() one sequence at a time (tiny
models of three families, greedy and sampled, rows admitted and retired mid-run), the JSONL files
(bad lines, duplicates, resume after a torn write), the catch-up pass, and the real SmolLM2."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import run_cli
from test_cli_run import assert_one_line_error
from test_constrained import cli
from tiny import VOCAB, hf_model, save_hf

from llmcli.cache.static import StaticKVCache
from llmcli.decode.batched import BatchEngine, Sequence
from llmcli.decode.generate import generate
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.errors import InvalidParameterError, PromptTooLongError
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model
from llmcli.serve import batch_jobs as bj

CPU = torch.device("cpu")
CTX = 64


MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3_text", "qwen3_moe"])
def loaded(request, tmp_path_factory):
    """Tiny random models: llama, qwen2 (q/k/v biases), gemma3 (sliding-window layers of 8) and
    qwen3_moe (8 experts, 2 a token: rows routed to different experts in one step)."""
    extra = MOE if request.param == "qwen3_moe" else {}
    folder = save_hf(hf_model(request.param, seed=1, **extra), tmp_path_factory.mktemp(request.param) / "m")
    return load_model(folder, place("cpu", "float32"))


def _sequences(n: int, seed: int = 0, logprobs: int | None = None) -> list[Sequence]:
    """Prompts of 2..30 tokens, caps of 1..40, greedy and seeded sampling."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(3, VOCAB, (int(torch.randint(2, 30, (1,), generator=g)),), generator=g).tolist()
        params = SamplingParams(temperature=0) if i % 2 == 0 else SamplingParams(seed=100 + i, top_k=0, min_p=0.0)
        cap = int(torch.randint(1, 40, (1,), generator=g))
        out.append(Sequence(prompt, Request(params, cap, logprobs=logprobs), tag=i))
    return out


def _alone(loaded, seq: Sequence, keep: list | None = None):
    """What generate() makes of the sequence alone; `keep` gets its Generation (logprobs)."""
    cache = StaticKVCache.for_model(loaded.model.args, CTX, CPU, torch.float32)
    generation = generate(loaded.model, loaded.tokenizer, seq.prompt, seq.request, cache)
    chunks = list(generation)
    if keep is not None:
        keep.append(generation)
    return _summary(chunks)


def _summary(chunks):
    return [t for c in chunks for t in c.tokens], "".join(c.text for c in chunks), chunks[-1].finish_reason


def _batched(engine, reqs):
    got: dict = {}
    for req, chunk in engine.run(reqs):
        assert req.tag not in got or got[req.tag][-1].finish_reason is None, "a chunk after the last one"
        got.setdefault(req.tag, []).append(chunk)
    return {tag: _summary(chunks) for tag, chunks in got.items()}


def test_batched_sequences_match_each_one_alone(loaded):
    reqs = _sequences(9)
    for r in reqs[2::3]:  # a stop string that this sequence's text holds half way (a random model never says "e")
        text = _alone(loaded, Sequence(r.prompt, r.request.with_(max_tokens=40)))[1]
        r.request = r.request.with_(stop=(text[len(text) // 2:len(text) // 2 + 2],), max_tokens=40)
    engine = BatchEngine(loaded.model, loaded.tokenizer, CPU, torch.float32, rows=4, max_len=CTX)
    got = _batched(engine, reqs)
    for r in reqs:
        assert got[r.tag] == _alone(loaded, r), f"request {r.tag}"
    assert {g[2] for g in got.values()} >= {"length", "stop"}
    # rows were shared: fewer steps than tokens, and more than one sequence per step on average
    assert engine.row_steps / engine.steps > 2


def test_bfloat16_cache_under_a_float32_model(loaded):
    """A 16-bit cache converts the rows it returns; sequences still finish as alone (same cache kind)."""
    reqs = _sequences(4, seed=3)
    engine = BatchEngine(loaded.model, loaded.tokenizer, CPU, torch.float32, rows=2, max_len=CTX, kv_type="bf16")
    got = _batched(engine, reqs)
    assert set(got) == {r.tag for r in reqs}
    for r in reqs:
        tokens, _, reason = got[r.tag]
        assert reason in ("stop", "length") and 1 <= len(tokens) <= r.request.max_tokens + 1


def test_logprobs_and_cancel(loaded):
    reqs = _sequences(4, seed=5, logprobs=3)
    engine = BatchEngine(loaded.model, loaded.tokenizer, CPU, torch.float32, rows=3, max_len=CTX)
    victim = Sequence(list(range(5, 25)), Request(SamplingParams(temperature=0), 30), tag="victim")
    engine.submit(victim)
    for r in reqs:
        engine.submit(r)
    got: dict = {}
    for i in range(100):
        if i == 2:
            engine.cancel(victim)  # a client went away: its row goes to the others
        if not engine.busy:
            break
        for req, chunk in engine.step():
            got.setdefault(req.tag, []).append(chunk)
    assert "victim" not in got or got["victim"][-1].finish_reason is None
    for r in reqs:
        kept = []
        assert _summary(got[r.tag]) == _alone(loaded, r, kept)
        alone = kept[0].logprobs
        assert len(r.logprobs.entries) == len(alone.entries)
        for (t1, lp1, top1), (t2, lp2, top2) in zip(r.logprobs.entries, alone.entries):
            assert t1 == t2 and lp1 == pytest.approx(lp2, abs=1e-4)
            assert [a for a, _ in top1] == [a for a, _ in top2]


def test_the_last_chunk_says_which_limit_ended_it(loaded):
    engine = BatchEngine(loaded.model, loaded.tokenizer, CPU, torch.float32, rows=2, max_len=24)
    greedy = SamplingParams(temperature=0)
    reqs = [Sequence(list(range(5, 21)), Request(greedy, 40), tag="context"),
            Sequence(list(range(5, 10)), Request(greedy, 3), tag="n")]
    last = {req.tag: chunk for req, chunk in engine.run(reqs) if chunk.finish_reason}
    assert last["n"].finish_reason == "length" and last["n"].stopped_by == "max_tokens"
    if last["context"].finish_reason == "length":  # a random model may end on an end token first
        assert last["context"].stopped_by == "context" and last["context"].stats.completion_tokens == 8


def test_a_prompt_with_no_room_is_refused_at_submit(loaded):
    engine = BatchEngine(loaded.model, loaded.tokenizer, CPU, torch.float32, rows=2, max_len=16)
    with pytest.raises(PromptTooLongError):
        engine.submit(Sequence(list(range(3, 19)), Request(SamplingParams(temperature=0), 4)))
    assert not engine.busy


def test_a_constraint_is_followed_in_a_batch(loaded):
    from llmcli.decode.constrained import GrammarCompiler, from_regex

    compiler = GrammarCompiler(loaded.tokenizer)
    grammar = from_regex("(ab|ba){2,4}")
    reqs = [Sequence([5 + i, 40, 70], Request(SamplingParams(seed=i), 40, grammar=grammar),
                     compiler.constraint(grammar), tag=f"g{i}") for i in range(3)] + _sequences(2, seed=9)
    engine = BatchEngine(loaded.model, loaded.tokenizer, CPU, torch.float32, rows=3, max_len=CTX)
    got = _batched(engine, reqs)
    for i in range(3):
        tokens, text, reason = got[f"g{i}"]
        assert reason == "stop" and re.fullmatch("(ab|ba){2,4}", text), (text, reason)


# ------------------------------------------------------------------------------- the files


@pytest.mark.parametrize("line, needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"prompt": "hi"}', 'no "id"'),
    ('{"id": 1.5, "prompt": "hi"}', '"id" must be a string or a whole number'),
    ('{"id": 1}', 'either "prompt"'),
    ('{"id": 1, "prompt": "hi", "messages": []}', 'either "prompt"'),
    ('{"id": 1, "prompt": ""}', "non-empty"),
    ('{"id": 1, "messages": [{"role": "robot", "content": "x"}]}', '"role"'),
    ('{"id": 1, "prompt": "hi", "max_tokens": 0}', '"max_tokens"'),
    ('{"id": 1, "prompt": "hi", "temperature": "hot"}', '"temperature" must be a number'),
    ('{"id": 1, "prompt": "hi", "stop": [1]}', '"stop"'),
    ('{"id": 1, "prompt": "hi", "json_schema": "x"}', '"json_schema"'),
    ('{"id": 1, "prompt": "hi", "temprature": 0}', "unknown field 'temprature'"),
])
def test_bad_lines_say_what_is_wrong(line, needle):
    items = list(bj.read_jobs(['{"id": "ok", "prompt": "fine"}', line, '{"id": "ok2", "prompt": "fine"}']))
    assert [type(i).__name__ for i in items] == ["Job", "LineError", "Job"]
    assert items[1].line == 2 and needle in str(items[1]) and str(items[1]).startswith("line 2")


def test_duplicates_blank_lines_and_done_ids():
    lines = ['{"id": 1, "prompt": "a"}', "", '{"id": "1", "prompt": "b"}', '{"id": 1, "prompt": "c"}',
             '{"id": 2, "messages": [{"role": "user", "content": "d"}], "system": "s"}']
    items = list(bj.read_jobs(lines, done={bj.id_key(2)}, system="be brief"))
    assert [(type(i).__name__, getattr(i, "id", None)) for i in items] == [("Job", 1), ("Job", "1"), ("LineError", None)]
    assert "duplicate id 1 (first on line 1)" in str(items[2]) and items[2].line == 4
    assert items[0].messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a"}]


def test_resume_cuts_a_torn_last_line(tmp_path):
    out = tmp_path / "out.jsonl"
    with bj.ResultWriter(out) as w:
        w.write({"id": "a", "text": "x"})
        w.write({"id": 2, "text": "ü"})
    with open(out, "ab") as f:
        f.write(b'{"id": "c", "te')  # a crash mid-write
    assert bj.done_ids(out) == {bj.id_key("a"), bj.id_key(2)}
    assert out.read_text(encoding="utf-8").endswith('"ü"}\n')
    with bj.ResultWriter(out) as w:
        w.write({"id": "c", "text": "y"})
    assert [json.loads(t)["id"] for t in out.read_text().splitlines()] == ["a", 2, "c"]
    (tmp_path / "other.jsonl").write_text("hello\n")
    with pytest.raises(InvalidParameterError, match="not a result of llmcli batch"):
        bj.done_ids(tmp_path / "other.jsonl")


def test_results_holding_line_separators_are_resumed(tmp_path):
    """JSON leaves U+2028, U+2029 and U+0085 raw in strings (ensure_ascii=False writes them so): a
    line ends at "\n" alone, or a result that holds one read as two lines of something else."""
    out = tmp_path / "out.jsonl"
    with bj.ResultWriter(out) as w:
        w.write({"id": "a\u2028b", "text": "x\u2029y\x85z"})
        w.write({"id": 2, "text": "\r"})
    assert bj.done_ids(out) == {bj.id_key("a\u2028b"), bj.id_key(2)}


def test_next_cap():
    assert bj.next_cap(16, 100) == 32
    assert bj.next_cap(64, 100) == 100
    assert bj.next_cap(100, 100) is None


# ------------------------------------------------------------------------------- the command


def _write_in(path, objs_or_lines):
    path.write_text("\n".join(o if isinstance(o, str) else json.dumps(o) for o in objs_or_lines) + "\n")
    return path


def _results(path):
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_cli_batch_resume_bad_lines_and_fallback(tiny_folder, tmp_path):
    src = _write_in(tmp_path / "in.jsonl", [
        {"id": "a", "prompt": "Hello"},
        "{broken",
        {"id": "b", "messages": [{"role": "user", "content": "Paris"}], "max_tokens": 3},
        {"id": "a", "prompt": "again"},
        {"id": "c", "prompt": "x", "json_schema": {"type": "nope"}},
        {"id": 4, "prompt": "The quick brown fox", "max_tokens": 2},
    ])
    out = tmp_path / "out.jsonl"
    flags = ["--temp", "0", "-n", "4", "--rows", "3", "--retries", "1", "--fallback", '{"none": true}']
    r = run_cli("batch", str(tiny_folder), str(src), "-o", str(out), *flags)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert "line 2: not valid JSON" in r.stderr and "line 4: duplicate id" in r.stderr
    assert 'line 5 (id "c")' in r.stderr and "not a valid JSON Schema" in r.stderr
    assert "3 input lines were skipped" in r.stderr
    got = _results(out)
    assert set(got) == {"a", "b", 4}
    # a random model does not stop by itself: each hit its cap, was retried with twice the cap, then fell back
    for key, cap in (("a", 4), ("b", 3), (4, 2)):
        assert got[key]["fallback"] is True and got[key]["value"] == {"none": True} and got[key]["attempts"] == 2
        assert got[key]["usage"]["completion_tokens"] == 2 * cap and "cap of" in got[key]["error"]
    # resume: nothing is done twice; a new line is answered and appended
    with open(src, "a") as f:
        f.write(json.dumps({"id": "d", "prompt": "more", "max_tokens": 1}) + "\n")
    r = run_cli("batch", str(tiny_folder), str(src), "-o", str(out), *flags)
    assert "3 requests already in" in r.stderr, r.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[-1])["id"] == "d"


def test_cli_batch_answers_every_good_line_whatever_the_others_hold(tiny_gguf, tmp_path):
    """A line nested too deep is one warning; the good lines after it are answered, one holding
    U+2028 and U+0085 in its prompt too (str.splitlines cut it in three bad lines: no output at all)."""
    src = tmp_path / "in.jsonl"
    src.write_text("[" * 100 + "]" * 100 + "\n"
                   + json.dumps({"id": "sep", "prompt": "one\u2028two\x85three", "max_tokens": 2}, ensure_ascii=False)
                   + "\r\n" + json.dumps({"id": "plain", "prompt": "Hello", "max_tokens": 2}) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    r = run_cli("batch", str(tiny_gguf), str(src), "-o", str(out), "--temp", "0", "--retries", "0")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")] == [
        "warning: line 1: nested more than 64 levels deep (llmcli reads JSON of up to 16 MiB and 64 levels of nesting)"]
    assert "error: 1 input lines were skipped" in r.stderr
    assert set(_results(out)) == {"sep", "plain"}


def test_cli_batch_refuses_bad_flags_before_loading(capsys, tmp_path):
    src = _write_in(tmp_path / "in.jsonl", [{"id": 1, "prompt": "x"}])
    out = ["-o", str(tmp_path / "o.jsonl")]
    for args, needle in ((["--rows", "0"] + out, "--rows"), (["--fallback", "{x"] + out, "--fallback must be JSON"),
                         (["--retries", "-1"] + out, "--retries"), (["-o", str(src)], "is the input file"),
                         (["-o", str(tmp_path / "no" / "out.jsonl")], "does not exist")):
        assert_one_line_error(cli(capsys, "batch", "/nonexistent/model.gguf", str(src), *args), needle, code=2)
    assert_one_line_error(cli(capsys, "batch", "/nonexistent/model.gguf", str(tmp_path / "missing.jsonl"), *out),
                          "no such file", code=2)


@pytest.mark.slow
def test_real_model_batch_with_schema_and_catch_up(smollm2_gguf, tmp_path):
    """SmolLM2, greedy, four rows: answers equal `llmcli run`'s; a cap too small is doubled until the
    answer ends by itself; a schema line's JSON parses and validates."""
    person = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
              "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0}}}
    src = _write_in(tmp_path / "in.jsonl", [
        {"id": "sum", "prompt": "What is 2+2?", "max_tokens": 6},
        {"id": "capital", "prompt": "What is the capital of France?", "max_tokens": 24},
        {"id": "person", "prompt": "Describe a person as JSON.", "json_schema": person, "max_tokens": 40},
    ])
    out = tmp_path / "out.jsonl"
    r = run_cli("batch", str(smollm2_gguf), str(src), "-o", str(out), "--temp", "0", "--rows", "4", "-c", "512")
    assert r.returncode == 0, r.stderr
    got = _results(out)
    assert got["sum"]["finish_reason"] == "stop" and got["sum"]["attempts"] >= 2 and "4" in got["sum"]["text"]
    import jsonschema

    jsonschema.validate(got["person"]["json"], person)
    assert json.loads(got["person"]["text"]) == got["person"]["json"]
    # alone, with the cap of the batch's last attempt (a catch-up doubles it until the answer ends by itself)
    cap = got["capital"]["usage"]["completion_tokens"]
    alone = run_cli("run", str(smollm2_gguf), "What is the capital of France?", "--temp", "0", "-n", str(cap), "-c", "512")
    assert got["capital"]["text"] == alone.stdout.rstrip("\n")
