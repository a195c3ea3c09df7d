"""The torch-free CPU path (runtime/lean.py, lean_step.py, decode/lean.py): the same numbers as the
torch path's native step on tiny GGUF files of every family it takes, the same answers from `run` and
`chat`, no torch imported on the way, and the torch path for whatever it does not take."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from lean_against_step import assert_lean_is_the_native_step

from llmcli import native

pytestmark = pytest.mark.skipif(not native.int8_dot(), reason="no C++ compiler for the kernels, or only the portable ones")

PROMPT, STEPS = [5, 17, 80, 3, 200, 41, 9, 150], [7, 99, 250, 31, 2, 64, 120, 8]
LEAN_CASES = ["llama-q4_1", "llama-q4_0", "qwen2-q4_k_m", "qwen2-q5_k_m", "qwen3-q8_0", "gemma3-q4_k_m", "llama-f16",
              "gemma3-bf16"]


@pytest.fixture(scope="module", params=LEAN_CASES)
def case_file(request, tmp_path_factory):
    from test_native_step import write_case

    return write_case(request.param, tmp_path_factory.mktemp("lean"))


def test_the_lean_model_gives_the_torch_native_step_s_logits_and_cache(case_file):
    """Bit for bit: the same C++ step over the same weights (interleaved from the file, llama's Q/K
    rows in HF order, gemma's norms, q/k/v biases), embeddings and RoPE tables."""
    from llmcli.formats.open import open_model_file
    from llmcli.runtime.lean_step import LeanModel
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(case_file), device="cpu", ctx_size=64, threads=2)
    step, cache = NativeStep(rt.loaded.model, threads=2), rt.new_cache()
    lean = LeanModel.open(open_model_file(case_file), 2, native.module())
    assert lean is not None
    assert_lean_is_the_native_step(lean, step, cache, PROMPT, STEPS, top=8)


def test_a_long_prompt_goes_in_several_calls_with_the_same_result(case_file):
    from llmcli.formats.open import open_model_file
    from llmcli.runtime import lean_step
    from llmcli.runtime.lean_step import LeanModel

    lean = LeanModel.open(open_model_file(case_file), 2, native.module())
    ids = (PROMPT * 8)[:40]
    whole, pieces = lean.new_cache(64), lean.new_cache(64)
    want, _, _ = lean(ids, whole)
    for i in range(0, len(ids), 16):
        got, _, _ = lean(ids[i:i + 16], pieces)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    with pytest.raises(ValueError):
        lean(list(range(lean_step.MAX_TOKENS + 1)), lean.new_cache(1024))


def test_what_the_lean_path_does_not_take_goes_to_the_torch_path(tiny_gguf, tiny_folder, tmp_path, monkeypatch):
    """None before anything loads: a folder, --quant, a GPU asked for, a quantized KV cache, a request
    with beams, guesses or a context shift; LongRoPE (phi3); LLMCLI_TORCH_PATH. A grammar and logprobs
    stay on this path."""
    from test_native_step import CASES, _tiny
    from tiny import write_gguf

    from llmcli.decode.constrained import from_json_schema
    from llmcli.decode.request import Request
    from llmcli.decode.sampling_plain import SamplingParams
    from llmcli.runtime.flags import ModelFlags
    from llmcli.runtime.lean import TORCH_PATH_ENV, LeanRuntime, open_lean

    assert isinstance(open_lean(ModelFlags(str(tiny_gguf), ctx_size=64)), LeanRuntime)
    for flags in (ModelFlags(str(tiny_folder), ctx_size=64), ModelFlags(str(tiny_gguf), quant="q8"),
                  ModelFlags(str(tiny_gguf), device="cuda"), ModelFlags(str(tiny_gguf), kv_type="int8"),
                  ModelFlags(str(tiny_gguf), dtype="bfloat16")):
        assert open_lean(flags) is None, flags
    schema = from_json_schema('{"type": "object"}')
    for request in (Request(beams=2), Request(SamplingParams(temperature=0), guesses="lookup"),
                    Request(context_shift=True)):
        assert open_lean(ModelFlags(str(tiny_gguf), ctx_size=64), request) is None, request
    for request in (Request(logprobs=2), Request(grammar=schema)):
        assert isinstance(open_lean(ModelFlags(str(tiny_gguf), ctx_size=64), request), LeanRuntime), request
    phi3 = tmp_path / "phi3.gguf"
    write_gguf(_tiny("phi3"), phi3, CASES["phi3-longrope-q8_0"][1])
    assert open_lean(ModelFlags(str(phi3), ctx_size=64)) is None
    monkeypatch.setenv(TORCH_PATH_ENV, "1")
    assert open_lean(ModelFlags(str(tiny_gguf), ctx_size=64)) is None


def _llmcli(args: list[str], stdin: str | None = None, env: dict | None = None) -> tuple[str, str, bool]:
    """`llmcli ARGS` in a fresh process -> (stdout, stderr, whether torch was imported)."""
    code = ("import sys\nfrom llmcli.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    code = e.code\nelse:\n    code = 0\nprint(json.dumps({'torch': 'torch' in sys.modules}), file=sys.stderr)\n"
            "sys.exit(code)\n").replace("import sys", "import json, sys", 1)
    out = subprocess.run([sys.executable, "-c", code, *args], input=stdin, capture_output=True, text=True, timeout=300,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    return out.stdout, out.stderr, json.loads(last)["torch"]


def test_run_and_chat_on_a_gguf_do_not_import_torch_and_answer_as_the_torch_path(tiny_gguf):
    run = ["run", str(tiny_gguf), "hello there", "-n", "12", "--temp", "0", "--ignore-eos", "-c", "128"]
    lean_out, lean_err, lean_torch = _llmcli(run + ["-v"])
    torch_out, _, torch_torch = _llmcli(run, env={"LLMCLI_TORCH_PATH": "1"})
    assert not lean_torch and torch_torch
    assert lean_out == torch_out and lean_out.strip()
    assert "torch not loaded" in lean_err
    chat = ["chat", str(tiny_gguf), "--temp", "0", "-n", "8", "-c", "256"]
    lean_chat, _, lean_torch = _llmcli(chat, stdin="hi\nand again\n")
    torch_chat, _, _ = _llmcli(chat, stdin="hi\nand again\n", env={"LLMCLI_TORCH_PATH": "1"})
    assert not lean_torch and lean_chat == torch_chat and len(lean_chat.strip().splitlines()) >= 2


def test_a_request_the_lean_path_does_not_take_runs_on_the_torch_path(tiny_gguf):
    out, _, imported = _llmcli(["run", str(tiny_gguf), "hello", "-n", "4", "--temp", "0", "--beams", "2", "-c", "64"])
    assert imported and out.strip()


def test_seeded_sampling_on_the_lean_path_repeats_and_seeds_differ(tiny_gguf):
    args = ["run", str(tiny_gguf), "hello", "-n", "16", "--ignore-eos", "--temp", "1.5", "--top-k", "0", "-c", "64",
            "--json"]
    first, second, other = (json.loads(_llmcli(args + ["--seed", s])[0]) for s in ("7", "7", "8"))
    assert first["text"] == second["text"] and first["timings"]["seed"] == 7
    tokens = [json.loads(_llmcli(args[:-1] + ["--json", "--seed", str(s)])[0])["text"] for s in range(9, 12)]
    assert len({first["text"], other["text"], *tokens}) > 1


def test_bench_on_a_gguf_times_the_lean_path_without_torch(tiny_gguf):
    out, _, imported = _llmcli(["bench", str(tiny_gguf), "-p", "16", "-n", "4", "-r", "1", "-o", "json"])
    results = json.loads(out)
    assert not imported and [r["test"] for r in results] == ["pp16", "tg4"]
    assert all(r["step"].startswith("native (one C++ call a step") and r["size_bytes"] > 0 and min(r["samples"]) > 0
               for r in results)


def test_embed_on_a_gguf_pools_the_lean_step_s_states_without_torch(tiny_gguf):
    """The step's final normed states, pooled in numpy, against the torch path's model (whose eager
    layers round their activations otherwise: nearly the same vectors)."""
    args = ["embed", str(tiny_gguf), "hello there, some words", "--pooling", "mean"]
    lean_out, _, lean_torch = _llmcli(args)
    torch_out, _, _ = _llmcli(args, env={"LLMCLI_TORCH_PATH": "1"})
    a, b = (np.array(json.loads(o)["embedding"]) for o in (lean_out, torch_out))
    assert not lean_torch and a.shape == b.shape
    assert abs(np.linalg.norm(a) - 1) < 1e-5 and a @ b > 0.999  # unit length, the same direction
    last, _, _ = _llmcli(["embed", str(tiny_gguf), "hello there", "--pooling", "last", "--no-normalize"])
    assert json.loads(last)["tokens"] >= 2 and np.linalg.norm(json.loads(last)["embedding"]) > 0


@pytest.mark.parametrize("model_type, overrides, qtype", [
    ("qwen3_moe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, norm_topk_prob=True), "Q8_0"),
    ("mixtral", dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=256), "Q4_K"),
    ("qwen2_moe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=512,
                       norm_topk_prob=False), "Q8_0")])
def test_the_lean_model_runs_a_mixture_of_experts_as_the_torch_path_s_step(model_type, overrides, qtype, tmp_path):
    """The experts of a GGUF (3-D tensors, a router) given to the step as the torch path gives them:
    bit for bit, a prompt then single tokens; `run` answers the same without torch."""
    from tiny import hf_model, write_gguf

    from llmcli.formats.open import open_model_file
    from llmcli.runtime.lean_step import LeanModel
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    path = tmp_path / "moe.gguf"
    write_gguf(hf_model(model_type, seed=2, hidden_size=256, **overrides), path, qtype)
    rt = open_model(str(path), device="cpu", ctx_size=64, threads=2)
    step, cache = NativeStep(rt.loaded.model, threads=2), rt.new_cache()
    lean = LeanModel.open(open_model_file(path), 2, native.module())
    assert lean is not None and lean.held_bytes() > 0
    assert_lean_is_the_native_step(lean, step, cache, PROMPT, STEPS[:4])
    run = ["run", str(path), "hello there", "-n", "8", "--temp", "0", "--ignore-eos", "-c", "64"]
    lean_out, _, lean_torch = _llmcli(run)
    torch_out, _, _ = _llmcli(run, env={"LLMCLI_TORCH_PATH": "1"})
    assert not lean_torch and lean_out == torch_out and lean_out.strip()


def test_a_mixture_s_experts_are_copied_for_the_row_group_kernels_or_read_as_stored(tmp_path):
    """Where the file fits in memory the experts are interleaved as the dense weights are (the file's
    pages under them released); copy_experts=False (a file larger than memory) reads them as stored.
    Both give the same logits to float rounding, step by step from the same cache, with int8 or
    int8x2 activations throughout (the two kernels sum in another order; where only some groups are
    int8x2, a rounding flips an int8 code now and then: ~3e-3, while both stay equally far, ~1e-2,
    from int8x2 everywhere)."""
    from tiny import hf_model, write_gguf

    from llmcli.formats.open import open_model_file
    from llmcli.runtime.lean_step import LeanModel

    kernels = native.module()
    if not kernels.group_rows:
        pytest.skip(f"the {kernels.variant} kernels have no row groups")
    path = tmp_path / "moe.gguf"
    write_gguf(hf_model("qwen3_moe", seed=4, hidden_size=256, num_experts=8, num_experts_per_tok=2,
                        moe_intermediate_size=256, norm_topk_prob=True), path, "Q8_0")
    copied = LeanModel.open(open_model_file(path), 2, kernels)
    stored = LeanModel.open(open_model_file(path), 2, kernels, copy_experts=False)
    experts = lambda m: [w for layer in m.layers for x in layer.experts for w in x]  # noqa: E731
    assert all(w.data.ndim == 1 for w in experts(copied)) and all(w.data.ndim == 2 for w in experts(stored))
    expert_bytes = sum(w.data.nbytes for w in experts(stored))
    assert copied.interleaved[0] - stored.interleaved[0] >= expert_bytes
    for mask in (0, 15):
        copied.refined = stored.refined = mask
        a, b = copied.new_cache(64), stored.new_cache(64)
        for ids in (PROMPT, *([t] for t in STEPS[:4])):
            b.k_layers[...], b.v_layers[...], b.length = a.k_layers, a.v_layers, a.length
            x, y = copied(ids, a)[0][0], stored(ids, b)[0][0]
            assert np.abs(x - y).max() <= 1e-4 * np.abs(y).max(), mask
