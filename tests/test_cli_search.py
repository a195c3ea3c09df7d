"""`llmcli run --beams / --draft / --lookup`: same answers as greedy where they should be, one-line errors."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from test_cli_run import assert_one_line_error

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


def _json(*args):
    r = run_cli("run", *args, "--json", "--raw")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_draft_and_lookup_answer_like_greedy(tiny_folder, tiny_gguf):
    greedy = _json(str(tiny_folder), PROMPT, "--temp", "0", "-n", "24", "--dtype", "float32")
    drafted = _json(str(tiny_folder), PROMPT, "--temp", "0", "-n", "24", "--dtype", "float32",
                    "--draft", str(tiny_gguf), "--draft-tokens", "4")
    looked = _json(str(tiny_folder), PROMPT, "--temp", "0", "-n", "24", "--dtype", "float32", "--lookup")
    assert drafted["text"] == looked["text"] == greedy["text"]
    assert drafted["usage"] == looked["usage"] == greedy["usage"]
    assert 0 <= drafted["timings"]["acceptance_rate"] <= 1
    assert "draft_tokens" in looked["timings"] or looked["usage"]["completion_tokens"] < 3


def test_beams(tiny_folder):
    out = _json(str(tiny_folder), PROMPT, "--beams", "3", "-n", "8", "--length-penalty", "0.5")
    assert out["timings"]["beams"] == 3 and out["finish_reason"] in ("stop", "length")
    assert out["usage"]["completion_tokens"] <= 8


@pytest.fixture(scope="module")
def other_vocab(tmp_path_factory):
    from tiny import hf_model, save_hf

    return save_hf(hf_model("llama", vocab_size=400), tmp_path_factory.mktemp("vocab") / "m")


def test_draft_with_another_vocabulary(tiny_folder, other_vocab):
    r = run_cli("run", str(tiny_folder), "hi", "--temp", "0", "--draft", str(other_vocab))
    assert_one_line_error(r, "vocabulary", "--draft")


@pytest.mark.parametrize("flags,needle", [
    (["--beams", "0"], "--beams"), (["--length-penalty", "nan"], "--length-penalty"),
    (["--draft", "x"], "--temp 0"), (["--lookup", "--temp", "0", "--draft-tokens", "0"], "--draft-tokens"),
    (["--lookup", "--temp", "0", "--lookup-ngram", "0"], "--lookup-ngram"),
    (["--beams", "2", "--lookup", "--temp", "0"], "--beams"), (["--draft-tokens", "4"], "--draft-tokens"),
    (["--lookup", "--temp", "0", "--context-shift"], "--context-shift"),
])
def test_bad_values(tiny_folder, flags, needle):
    r = run_cli("run", str(tiny_folder), "hi", *flags)
    assert_one_line_error(r, needle)
    assert r.returncode == 2
