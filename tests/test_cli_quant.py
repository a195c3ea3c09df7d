"""`llmcli quantize`, `llmcli perplexity` and `run --quant` as subprocesses, and every bad input as one line."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from test_cli_run import assert_one_line_error
from tiny import TRAINING_TEXT, hf_model, write_gguf

from llmcli.quant.presets import shipped_names


@pytest.fixture(scope="module")
def tiny_q4_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(hf_model("llama"), path, "Q4_1")
    return path


@pytest.fixture(scope="module")
def quantized(tiny_q4_gguf, tmp_path_factory):
    out = tmp_path_factory.mktemp("q") / "tiny-q4"
    r = run_cli("quantize", str(tiny_q4_gguf), "--preset", "q4", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(TRAINING_TEXT)
    return path


def test_quantize_summary_and_run(quantized):
    out, summary = quantized
    assert summary["preset"] == "q4" and summary["imported_tensors"] == 14
    assert summary["output_bytes"] > 0 and 4 < summary["bits_per_weight"] < 7
    r = run_cli("run", str(out), "Hello", "-n", "5", "--temp", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["usage"]["completion_tokens"] >= 1


def test_quantize_text_summary_goes_to_stdout(tiny_folder, tmp_path):
    r = run_cli("quantize", str(tiny_folder), "-p", "q4_g128", "-o", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert "bits per weight" in r.stdout and "size" in r.stdout
    assert "not divisible by 128" in r.stderr  # rows of 64: group 128 falls back, and says so


def test_run_with_quant_matches_the_saved_checkpoint(tiny_q4_gguf, quantized):
    out, _ = quantized
    args = ("Tell me something", "--temp", "0", "-n", "10", "--json")
    a = run_cli("run", str(tiny_q4_gguf), "--quant", "q4", *args)
    b = run_cli("run", str(out), *args)
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    assert json.loads(a.stdout)["text"] == json.loads(b.stdout)["text"]


def test_perplexity_with_reference(tiny_folder, text_file):
    r = run_cli("perplexity", str(tiny_folder), "--file", str(text_file), "--ctx-size", "64", "--chunks", "3",
                "--quant", "q4", "--reference", "q8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["windows"] == 3 and out["scored_tokens"] == 3 * 31
    assert out["ppl"] > 1 and out["ppl_reference"] > 1
    assert out["kld_mean"] >= 0 and out["kld_p99"] >= out["kld_mean"] * 0.5 and 0 <= out["same_top"] <= 1
    # a model against itself: nothing to see
    r = run_cli("perplexity", str(tiny_folder), "--file", str(text_file), "-c", "64", "--chunks", "2",
                "--reference", str(tiny_folder), "--json")
    same = json.loads(r.stdout)
    assert same["kld_mean"] < 1e-9 and same["same_top"] == 1.0 and same["ppl_ratio"] == pytest.approx(1.0)


def test_perplexity_text_output(tiny_folder, text_file):
    r = run_cli("perplexity", str(tiny_folder), "-f", str(text_file), "-c", "64", "--chunks", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("perplexity ") and "1 windows of 64 tokens" in r.stdout


# ----------------------------------------------------------------------------------- bad input


def test_unknown_preset_lists_them(tiny_folder, tmp_path):
    for r in (run_cli("quantize", str(tiny_folder), "-p", "q3", "-o", str(tmp_path / "o")),
              run_cli("run", str(tiny_folder), "hi", "--quant", "q3")):
        assert_one_line_error(r, "'q3'", ", ".join(shipped_names()))
    assert not (tmp_path / "o").exists()


def test_bad_rule_says_file_and_line(tiny_folder, tmp_path):
    preset = tmp_path / "mine.toml"
    preset.write_text('description = "mine"\n\n[[rules]]\nmatch = "*"\nbits = 3\n')
    assert_one_line_error(run_cli("quantize", str(tiny_folder), "-p", str(preset), "-o", str(tmp_path / "o")),
                          f"{preset}:3:", "rule 1", "bits must be 4, 8 or 16")


def test_indivisible_group_refused_names_the_tensor(tiny_folder, tmp_path):
    preset = tmp_path / "g128.toml"
    preset.write_text('on_indivisible = "refuse"\n[[rules]]\nmatch = "*"\nbits = 4\ngroup_size = 128\n')
    r = run_cli("quantize", str(tiny_folder), "-p", str(preset), "-o", str(tmp_path / "o"))
    assert_one_line_error(r, "rows of 64", "groups of 128", ".weight")
    assert not (tmp_path / "o").exists()


def test_existing_output_needs_force(tiny_folder, quantized):
    out, _ = quantized
    assert_one_line_error(run_cli("quantize", str(tiny_folder), "-o", str(out)), "already exists", "--force")


def test_quantizing_a_quantized_checkpoint_is_refused(quantized, tmp_path):
    out, _ = quantized
    assert_one_line_error(run_cli("quantize", str(out), "-p", "q8", "-o", str(tmp_path / "o")),
                          "already quantized", "original model")
    assert_one_line_error(run_cli("run", str(out), "hi", "--quant", "q8"), "already quantized", "--quant")


def test_perplexity_bad_inputs(tiny_folder, tmp_path, text_file):
    assert_one_line_error(run_cli("perplexity", str(tiny_folder), "-f", str(tmp_path / "none.txt")), "does not exist")
    short = tmp_path / "short.txt"
    short.write_text("a few words")
    assert_one_line_error(run_cli("perplexity", str(tiny_folder), "-f", str(short), "-c", "64"),
                          "fewer than one window", "--ctx-size")
    assert_one_line_error(run_cli("perplexity", str(tiny_folder), "-f", str(text_file), "--chunks", "0"), "--chunks")
