"""`perplexity` measures the step `run` takes (issue 40): on a GGUF file the torch-free native step's
prefill, which it names; `--reference f32` then gives the loss of that step's activations against
the file dequantized and run in float32, and a path against itself loses nothing."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from tiny import TRAINING_TEXT, hf_model, write_gguf

from llmcli import native

pytestmark = pytest.mark.skipif(not native.int8_dot(), reason="no C++ compiler for the kernels, or only the portable ones")


@pytest.fixture(scope="module")
def tiny_q4(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-q4_1.gguf"
    write_gguf(hf_model("llama"), path, "Q4_1")
    return path


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(TRAINING_TEXT)
    return path


def _perplexity(model, text, *args, env=None) -> dict:
    r = run_cli("perplexity", str(model), "-f", str(text), "-c", "64", "--chunks", "3", "--json", *args, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_default_path_is_the_native_step_and_its_loss_against_f32_is_small(tiny_q4, text_file):
    fine = _perplexity(tiny_q4, text_file, "--reference", "f32")
    coarse = _perplexity(tiny_q4, text_file, "--reference", "f32", env={"LLMCLI_ACTIVATIONS": "int8"})
    for out in (fine, coarse):
        assert out["step"].startswith("native (one C++ call a step") and out["windows"] == 3
        assert out["reference"]["step"].startswith("torch forward (float32")
        assert out["ppl_ratio"] == pytest.approx(1.0, abs=0.05) and out["same_top"] > 0.9
    # a tiny file decodes with int8x2 activations into q/k/v, gate/up and down: a loss, well below
    # llama.cpp's int8's (on this random model 2.3x below; SmolLM2 and Gemma-3: 5x and 3.4x)
    assert "int8x2 activations for q/k/v, gate/up, down" in fine["step"] and "int8 activations" in coarse["step"]
    assert 0 < fine["kld_mean"] < coarse["kld_mean"] / 2 and coarse["kld_mean"] < 0.05


def test_a_path_against_itself_loses_nothing(tiny_q4, text_file):
    ref = _perplexity(tiny_q4, text_file, "--quant", "f32", "--dtype", "float32", "--reference", "f32")
    same = _perplexity(tiny_q4, text_file, "--reference", str(tiny_q4))
    for out in (ref, same):
        assert out["kld_mean"] < 1e-9 and out["same_top"] == 1.0 and out["ppl_ratio"] == pytest.approx(1.0)
    assert same["step"] == same["reference"]["step"] and same["step"].startswith("native")


def test_the_text_output_names_both_steps(tiny_q4, text_file):
    r = run_cli("perplexity", str(tiny_q4), "-f", str(text_file), "-c", "64", "--chunks", "1", "--reference", "f32")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("perplexity ") and lines[1].startswith("  step: native (")
    assert lines[2].startswith("reference ") and lines[3] == "  step: torch forward (float32, f32 (from Q4_1) as float)"


def test_a_window_past_one_call_is_scored_as_a_prompt_s_prefill_runs_it(tiny_q4):
    """window_logits over 600 tokens (two calls of the step): the rows from `first` on, as two calls
    on one cache give them (the head skipped for the rows before `first`)."""
    import numpy as np

    from llmcli.formats.open import open_model_file
    from llmcli.runtime.lean_step import MAX_TOKENS, LeanModel

    lean = LeanModel.open(open_model_file(tiny_q4), 2, native.module())
    ids = [int(i) for i in np.random.default_rng(0).integers(1, lean.args.vocab_size, 600)]
    got = lean.window_logits(ids, 300)
    cache = lean.new_cache(600)
    a, _, _ = lean(ids[:MAX_TOKENS], cache, last_only=False)
    b, _, _ = lean(ids[MAX_TOKENS:], cache, last_only=False)
    assert got.shape == (300, lean.args.vocab_size)
    np.testing.assert_array_equal(got, np.concatenate([a, b])[300:])
