"""Unquantized safetensors folders (bf16, f16, f32) on the CPU: their matrices held as F16/BF16 rows
(quant/float_rows.py) with no float32 copy of them, decoding through the native step in float32
with a float16 KV cache, against transformers on the same weights."""

from __future__ import annotations

import pytest
import torch

from llmcli import native

FOLDERS = {  # name: (model_type, the dtype transformers saves it in)
    "llama-bf16": ("llama", torch.bfloat16),
    "qwen2-f16": ("qwen2", torch.float16),  # (q/k/v biases)
    "gemma3-bf16": ("gemma3_text", torch.bfloat16),
    "qwen3-f32": ("qwen3", torch.float32),  # F16 rows (its values fit)
}
ROWS = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F16"}
needs_kernels = pytest.mark.skipif(not native.available(), reason="no C++ compiler for the kernels")


@pytest.fixture(scope="module", params=list(FOLDERS))
def folder(request, tmp_path_factory):
    """(the folder, the reference: transformers' model in float32 holding the rows' values, its dtype)"""
    from tiny import hf_model, save_hf

    arch, dtype = FOLDERS[request.param]
    shapes = dict(hidden_size=256, intermediate_size=320, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=True, seed=3)
    model = hf_model(arch, **shapes)
    path = save_hf(model.to(dtype), tmp_path_factory.mktemp("rows") / request.param)
    held = torch.float16 if dtype == torch.float32 else dtype  # what the rows hold of each weight
    reference = hf_model(arch, **shapes)
    reference.load_state_dict({k: v.to(dtype).to(held if v.dim() == 2 else dtype).float()
                               for k, v in model.state_dict().items()})
    return path, reference, dtype


@needs_kernels
def test_a_folder_loads_as_its_rows_with_no_float32_copy(folder):
    """Each matrix is held as rows of its stored 16 bits (F16 for float32 files whose values fit): the
    model's weights take the files' bytes for them, no float32 tensor of two dimensions anywhere; the
    memory plan counts the same and says what they are."""
    from llmcli.formats.open import open_model_file
    from llmcli.quant.gguf_blocks import GGUFBlockWeight
    from llmcli.runtime.runtime import open_model

    path, _, dtype = folder
    rt = open_model(str(path), device="cpu", ctx_size=64)
    model = rt.loaded.model
    packed = {id(m.packed): m.packed for m in model.modules() if isinstance(getattr(m, "packed", None), GGUFBlockWeight)}
    assert {p.type_name for p in packed.values()} == {ROWS[dtype]}
    matrices = [h for h in open_model_file(path).headers.values() if len(h["shape"]) == 2]
    elements = sum(h["shape"][0] * h["shape"][1] for h in matrices)
    assert sum(p.nbytes for p in packed.values()) == 2 * elements
    tensors = [*model.parameters(), *model.buffers()]
    assert not [t.shape for t in tensors if t.dim() == 2 and t.is_floating_point()]
    assert rt.loaded.weights_type == f"{str(dtype).removeprefix('torch.')} as {ROWS[dtype]} rows"
    assert rt.plan.parts[0].name == f"weights {str(dtype).removeprefix('torch.')} as " + (
        "F16 rows (BF16 where past F16's range)" if dtype == torch.float32 else f"{ROWS[dtype]} rows")
    assert rt.plan.parts[0].nbytes >= 2 * elements
    assert (rt.placement.dtype, rt.kv_type) == (torch.float32, "f16")


@needs_kernels
def test_the_step_gives_transformers_logits_on_the_same_weights(folder):
    """The step (float32 activations, a float32 cache here) against transformers in float32 on the
    rows' values: float32 rounding apart, prompt and each decoded token."""
    from llmcli.cache import new_cache
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    path, reference, _ = folder
    rt = open_model(str(path), device="cpu", ctx_size=64)
    step = rt.decode_step(compile=False)
    assert isinstance(step, NativeStep)
    ids = [5, 17, 80, 3, 200, 41, 9, 150, 7, 99, 250]
    cache = new_cache(rt.loaded.args, 64, torch.device("cpu"), torch.float32)
    with torch.inference_mode():
        got = [step(torch.tensor([ids[:8]]), cache)[0]] + [step(torch.tensor([[t]]), cache)[0] for t in ids[8:]]
        want = reference(torch.tensor([ids])).logits[0]
    got = torch.cat(got)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


@needs_kernels
def test_greedy_tokens_are_transformers_where_no_two_logits_nearly_tie(folder):
    """`run`'s road (the step, the float16 cache) decodes greedily what transformers does on the same
    weights: at every step (transformers given the same tokens so far) the same token, but where its
    two best logits are within float16's rounding of the cache (there either token is right)."""
    from llmcli.decode.generate import generate
    from llmcli.decode.request import Request
    from llmcli.decode.sampling import SamplingParams
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    path, reference, _ = folder
    rt = open_model(str(path), device="cpu", ctx_size=64)
    step = rt.decode_step(compile=False)
    assert isinstance(step, NativeStep) and rt.new_cache().k[0].dtype == torch.float16
    prompt = [5, 17, 80, 3, 200, 41]
    request = Request(SamplingParams(temperature=0)).with_(max_tokens=24, ignore_eos=True)
    got = [t for c in generate(rt.loaded.model, rt.loaded.tokenizer, prompt, request, rt.new_cache(), step)
           for t in c.tokens]
    ids, compared = list(prompt), 0
    with torch.inference_mode():
        for token in got:
            logits = reference(torch.tensor([ids])).logits[0, -1]
            top = logits.topk(2).values
            if top[0] - top[1] >= 2e-3 * logits.abs().max():
                assert token == int(logits.argmax()), (len(ids), got)
                compared += 1
            ids.append(token)
    assert compared >= 16, compared


def test_every_cpu_kind_holds_a_folder_as_rows_for_the_step(cpu_kind, tiny_folder):
    """The choice on each kind of CPU (its kernel variant, whether this CPU runs it or not): the step
    decodes a float32 folder, placed in float32 with a float16 cache, planned as F16 rows at 2 bytes
    a weight."""
    from llmcli.formats.open import open_model_file
    from llmcli.runtime.device import place
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.probe import weights_from_files
    from llmcli.runtime.runtime import native_placement

    mf = open_model_file(tiny_folder)
    assert NativeStep.decodes(mf)
    placement, kv = native_placement(mf, place("cpu"), None)
    assert (placement.dtype, kv) == (torch.float32, "f16")
    info = weights_from_files(mf, None, placement.dtype, placement.device)
    matrices = sum(h["shape"][0] * h["shape"][1] for h in mf.headers.values() if len(h["shape"]) == 2)
    vectors = sum(h["shape"][0] for h in mf.headers.values() if len(h["shape"]) == 1)
    assert info.label == "float32 as F16 rows (BF16 where past F16's range)"
    assert 2 * matrices + 4 * vectors <= info.nbytes < 2 * matrices + 4 * vectors + 65536  # (+ RoPE tables)


def test_without_the_kernels_a_folder_loads_in_the_compute_dtype(tiny_folder, monkeypatch):
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    monkeypatch.setattr(native, "_module", False)
    rt = open_model(str(tiny_folder), device="cpu", ctx_size=32)
    assert not any(hasattr(m, "packed") for m in rt.loaded.model.modules())
    assert not isinstance(rt.decode_step(compile=False), NativeStep)


def test_float32_asked_for_keeps_a_float32_folder_exact_and_a_16_bit_one_as_rows(tiny_folder, folder):
    """`--dtype float32` on a float32 folder: its weights as they are (no rounding to 16 bits), the
    model's own path and a float32 cache; a 16-bit folder's rows are exact, so it keeps them."""
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(tiny_folder), device="cpu", dtype="float32", ctx_size=32)
    assert not any(hasattr(m, "packed") for m in rt.loaded.model.modules()) and rt.loaded.weights_type == "float32"
    assert rt.new_cache().k[0].dtype == torch.float32
    path, _, dtype = folder
    if dtype != torch.float32 and native.available():
        rt = open_model(str(path), device="cpu", dtype="float32", ctx_size=32)
        assert any(hasattr(m, "packed") for m in rt.loaded.model.modules()) and rt.kv_type == "f16"
