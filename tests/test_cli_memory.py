"""The memory flags on the command line: --kv-type, --kv-offload, --context-shift, show --memory,
the plan under --verbose, and every bad input as one line."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from test_cli_run import assert_one_line_error
from tiny import hf_model, write_gguf

ONE_THREAD = ("-t", "1")
BF16 = ("--dtype", "bfloat16")  # the figures below are for a bfloat16 model, whatever this CPU's default


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(hf_model("llama"), path, "Q8_0")
    return path


def test_ctx_size_above_the_trained_context_says_the_maximum(tiny_gguf):
    r = run_cli("run", str(tiny_gguf), "Hi", "-c", "100000")
    assert_one_line_error(r, "above this model's trained context of 256", "--ctx-size 256 or less", code=2)
    assert "rope" not in r.stderr


def test_a_context_that_fits_in_no_plan_says_what_it_needs_and_what_fits(smollm2_gguf):
    r = run_cli("run", str(smollm2_gguf), "Hi", "-c", "8192", *BF16, env={"LLMCLI_MEMORY_LIMIT": "200MiB"})
    assert_one_line_error(r, "a context of 8192 tokens needs at least", "but 200.00 MiB is free on cpu",
                          "--ctx-size", "with --kv-type int4 fits")
    r = run_cli("run", str(smollm2_gguf), "Hi", *BF16, env={"LLMCLI_MEMORY_LIMIT": "120MiB"})
    from llmcli import native

    held = "92.04" if native.int8_dot() else "97.10"  # the file's blocks as they are, or as int4/int8 + scales
    assert_one_line_error(r, f"the weights need {held} MiB (Q4_1/Q8_0 as stored)", "use a smaller --quant preset")


@pytest.mark.parametrize("flags, needles", [
    (("--kv-type", "q8"), ("unknown --kv-type 'q8'", "auto, bf16, f16, int8, int4")),
    (("--kv-offload", "sometimes"), ("--kv-offload must be one of auto, on, off",)),
    (("--kv-offload", "on", "--kv-type", "int4"), ("--kv-offload on keeps the cache in floating point",)),
])
def test_bad_kv_flags_are_one_line(tiny_gguf, flags, needles):
    for command in (("run", str(tiny_gguf), "Hi"), ("chat", str(tiny_gguf))):
        r = run_cli(*command, *flags, input="Hi\n")
        assert_one_line_error(r, *needles, code=2)


def test_a_plan_that_gives_something_up_says_so(smollm2_gguf):
    """Memory for int8 but not bfloat16: a note without -v, the whole table with it."""
    env = {"LLMCLI_MEMORY_LIMIT": "330MiB"}
    r = run_cli("run", str(smollm2_gguf), "Hi", "-n", "1", "--temp", "0", *ONE_THREAD, *BF16, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("note: with a bfloat16 KV cache the model would need")
    assert "using int8, all 30 layers on cpu to keep the context of 8192" in r.stderr
    r = run_cli("run", str(smollm2_gguf), "Hi", "-n", "1", "--temp", "0", "-v", *ONE_THREAD, *BF16, env=env)
    assert "memory plan for cpu: 330.00 MiB free (LLMCLI_MEMORY_LIMIT)" in r.stderr
    assert "KV cache int8, 30 layers" in r.stderr and "weights Q4_1/Q8_0 as stored" in r.stderr


def test_show_memory_prints_the_plan(smollm2_gguf):
    r = run_cli("show", str(smollm2_gguf), "--memory", "-c", "4096", "--kv-type", "int8", "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1] == "context 4096 tokens (--ctx-size)" and lines[2] == "KV cache int8, all 30 layers on cpu"
    assert any(line.split()[:3] == ["KV", "cache", "int8,"] and line.endswith("MiB") for line in lines)
    r = run_cli("show", str(smollm2_gguf), "--memory", "--json", "--dtype", "bfloat16")
    plan = json.loads(r.stdout)
    assert (plan["context"], plan["kv_type"]) == (8192, "bfloat16")
    kv = [p for p in plan["parts"] if p["name"].startswith("KV cache")]
    assert kv[0]["bytes"] == 30 * 2 * 3 * 64 * 8192 * 2  # layers x (K, V) x heads x head_dim x tokens x bf16


def test_context_shift_generates_past_the_context(tiny_gguf):
    args = ("run", str(tiny_gguf), "Hello", "-c", "32", "-n", "80", "--temp", "1", "--seed", "1", "--json", *ONE_THREAD,
            "--ignore-eos")  # the sampled tokens vary with the CPU's kernels: only -n or the context may end it
    r = run_cli(*args, "--context-shift", "-v")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["finish_reason"], out["usage"]["completion_tokens"]) == ("length", 80)
    assert "context shifted 5 times" in r.stderr
    plain = json.loads(run_cli(*args).stdout)  # without it, the context ends the answer
    assert plain["usage"]["total_tokens"] <= 32
    for kv in ("int8", "int4", "f16"):
        r = run_cli(*args, "--context-shift", "--kv-type", kv, "-v")
        assert json.loads(r.stdout)["usage"]["total_tokens"] > 32 and "context shifted" in r.stderr, r.stderr
