"""`batch` and `serve` on the torch-free CPU path (decode/rows_lean.py, picker_plain.py): several rows
decoded together give each sequence what it gets alone, grammars and logprobs as on the torch path,
and the commands on a GGUF never import torch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import openai
import pytest
from test_lean import _llmcli

from llmcli import native
from llmcli.decode.batched import Sequence
from llmcli.decode.constrained import from_json_schema
from llmcli.decode.request import Request
from llmcli.decode.sampling_plain import SamplingParams
from llmcli.runtime.flags import ModelFlags
from llmcli.runtime.lean import LeanRuntime, open_lean

pytestmark = pytest.mark.skipif(not native.int8_dot(), reason="no C++ compiler for the kernels, or only the portable ones")

GREEDY = SamplingParams(temperature=0)
SCHEMA = ('{"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, '
          '"n": {"type": "integer"}}, "required": ["name", "n"], "additionalProperties": false}')


@pytest.fixture(scope="module")
def lean(tiny_gguf):
    rt = open_lean(ModelFlags(str(tiny_gguf), ctx_size=128, threads=1, rows=3))
    assert isinstance(rt, LeanRuntime)
    return rt


def _alone(rt, prompt, request):
    generation = rt.generate(prompt, request, rt.model.new_cache(rt.ctx_size))
    chunks = list(generation)
    return "".join(c.text for c in chunks), chunks[-1].finish_reason, generation


def test_rows_decoded_together_answer_each_sequence_as_alone(lean):
    """Five prompts through three rows (new prompts join running rows' steps; rows are refilled), greedy
    and seeded: each sequence's text and finish are what generate_lean gives it alone."""
    prompts = [lean.prompt_ids([{"role": "user", "content": t}]) for t in
               ("hello", "what is the capital of France?", "one two three four five six", "hi", "a longer question " * 4)]
    requests = [Request(GREEDY, 12 + 3 * i) if i % 2 == 0 else Request(SamplingParams(temperature=0.9, seed=i), 10)
                for i in range(len(prompts))]
    engine = lean.batch_engine(3, prompt_cache=1 << 20)
    seqs = [Sequence(p, r) for p, r in zip(prompts, requests)]
    got = {id(s): "" for s in seqs}
    finish = {}
    for seq, chunk in engine.run(seqs):
        got[id(seq)] += chunk.text
        if chunk.finish_reason:
            finish[id(seq)] = chunk.finish_reason
    assert engine.steps < engine.row_steps  # rows went together
    for seq, prompt, request in zip(seqs, prompts, requests):
        text, reason, _ = _alone(lean, prompt, request)
        assert (got[id(seq)], finish[id(seq)]) == (text, reason)
    again = Sequence(prompts[1], requests[0])  # the prompt cache gives its start back
    assert "".join(c.text for _, c in engine.run([again])) == _alone(lean, prompts[1], requests[0])[0]
    assert engine.prompt_cache.hits >= 1


def test_grammar_and_logprobs_on_the_lean_path_as_on_the_torch_path(lean, tiny_gguf):
    """The same GGUF through the torch path's native step: the same constrained tokens (valid JSON),
    the same log-probabilities to float32's rounding."""
    from llmcli.runtime.runtime import open_model

    torch_rt = open_model(ModelFlags(str(tiny_gguf), ctx_size=128, threads=1))
    prompt = lean.prompt_ids([{"role": "user", "content": "Give me a JSON object."}])
    request = Request(GREEDY, 40, grammar=from_json_schema(SCHEMA), logprobs=3)
    text, reason, generation = _alone(lean, prompt, request)
    want = torch_rt.generate(prompt, request, torch_rt.new_cache(), torch_rt.decode_step(compile=False))
    assert text == "".join(c.text for c in want)
    if reason == "stop":
        json.loads(text)
    ours, theirs = generation.logprobs.entries, want.logprobs.entries
    assert [e[0] for e in ours] == [e[0] for e in theirs] and len(ours) > 3
    for (_, lp, alts), (_, lp2, alts2) in zip(ours, theirs):
        assert abs(lp - lp2) < 1e-4 and [a[0] for a in alts] == [a[0] for a in alts2]
        assert np.allclose([a[1] for a in alts], [a[1] for a in alts2], atol=1e-4)


def test_batch_on_a_gguf_does_not_import_torch_and_answers_as_the_torch_path(tiny_gguf, tmp_path):
    lines = "".join(json.dumps({"id": i, "prompt": p, "max_tokens": 6}) + "\n"
                    for i, p in enumerate(["hello", "tell me a story", "hi there"]))
    answers = {}
    for path, env in (("lean", {}), ("torch", {"LLMCLI_TORCH_PATH": "1"})):
        out = tmp_path / f"{path}.jsonl"
        _, _, imported = _llmcli(["batch", str(tiny_gguf), "-", "-o", str(out), "--temp", "0", "--rows", "2",
                                  "-c", "128"], stdin=lines, env=env)
        assert imported == (path == "torch")
        answers[path] = sorted((r["id"], r["text"]) for r in map(json.loads, out.read_text().splitlines()))
    assert answers["lean"] == answers["torch"] and len(answers["lean"]) == 3


def test_serve_on_a_gguf_does_not_import_torch(tiny_gguf, lean):
    code = ("import json, sys\nfrom llmcli.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(json.dumps({'torch': 'torch' in sys.modules}), file=sys.stderr)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", str(tiny_gguf), "--port", "0", "-t", "1", "--rows", "2",
                             "-c", "128"], stderr=subprocess.PIPE, text=True, env={**os.environ, "NO_COLOR": "1"})
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    try:
        for line in proc.stderr:
            if line.startswith("serving "):
                break
        url = line.split(" on ")[1].split()[0]
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        ask = [{"role": "user", "content": "What is the capital of France?"}]
        r = client.chat.completions.create(model=str(tiny_gguf), messages=ask, temperature=0, max_tokens=6)
        assert r.choices[0].message.content == _alone(lean, lean.prompt_ids(ask), Request(GREEDY, 6))[0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert json.loads(proc.stderr.read().strip().splitlines()[-1]) == {"torch": False}
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()


def test_a_prompt_too_long_to_join_a_step_is_prefilled_alone_with_the_same_answer(lean, monkeypatch):
    """A prompt past JOINED_TOKENS goes into its row alone (LeanRows.prefill), not beside the running rows."""
    from llmcli.decode import batched

    monkeypatch.setattr(batched, "JOINED_TOKENS", 4)
    prompts = [lean.prompt_ids([{"role": "user", "content": t}]) for t in ("one two three four five six", "hi there")]
    engine = lean.batch_engine(2, prompt_cache=0)
    seqs = [Sequence(p, Request(GREEDY, 8)) for p in prompts]
    got = {id(s): "" for s in seqs}
    for seq, chunk in engine.run(seqs):
        got[id(seq)] += chunk.text
    assert all(len(p) > 4 for p in prompts)
    for seq, prompt in zip(seqs, prompts):
        assert got[id(seq)] == _alone(lean, prompt, Request(GREEDY, 8))[0]
