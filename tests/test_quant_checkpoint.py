"""Quantize -> save -> load: bit-identical packed tensors, the same greedy tokens, the same tokenizer;
a killed quantize leaves nothing that looks complete; GGUF blocks import exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO
from tiny import hf_model, save_hf, write_gguf

from llmcli.cache.static import StaticKVCache
from llmcli.decode.generate import generate
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.formats.tensors import gguf_sources
from llmcli.quant import checkpoint
from llmcli.quant.convert import quantize_source
from llmcli.quant.pipeline import quantize_to_folder
from llmcli.quant.presets import QuantSpec, load_preset
from llmcli.quant.primitives import dequantize, unpack_int4
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model

CPU = place("cpu", "bfloat16")
CPU32 = place("cpu", "float32")
TEXTS = ["Hello world! héllo 12345 🙂", "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
         "  leading spaces and\ttabs\n\nnew lines", "日本語のテキスト and emoji 🚀"]


@pytest.fixture(scope="module")
def tiny_tied_folder(tmp_path_factory):
    return save_hf(hf_model("llama", tie_word_embeddings=True), tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tiny_q4_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(hf_model("llama"), path, "Q4_1")
    return path


def _greedy(loaded, n: int = 12) -> list[int]:
    ids = loaded.tokenizer.encode("The quick brown fox")
    cache = StaticKVCache.for_model(loaded.args, 64, loaded.placement.device, loaded.placement.dtype)
    chunks = generate(loaded.model, loaded.tokenizer, ids, Request(SamplingParams(temperature=0), max_tokens=n), cache)
    return [t for c in chunks for t in c.tokens]


def _packed_modules(model):
    return {name: m.packed.state() for name, m in model.named_modules() if hasattr(m, "packed")}


def _in_memory(path, preset: str, placement):
    """What `quantize_to_folder` converts, built in memory: nothing between it and the model but disk
    (and the preset's activations, which the checkpoint records and the loader marks it with)."""
    from llmcli.quant.convert import convert
    from llmcli.quant.held import hold_activations
    from llmcli.quant.model import build
    from llmcli.quant.pipeline import open_source

    src = open_source(path)
    args = src.args
    converted = convert(src.sources, load_preset(preset), args.num_hidden_layers, args.tie_word_embeddings)
    loaded = load_model(path, placement)  # its tokenizer and template
    loaded.model = build(args, converted, placement.device, placement.dtype)
    hold_activations(loaded.model, load_preset(preset).activations)
    return loaded


@pytest.mark.parametrize("preset,source", [(p, s) for p in ("q4", "q8", "q4_mixed") for s in ("folder", "gguf")]
                         + [("nf4", "folder"), ("llm_int8", "gguf"), ("q4_g128", "folder")])
def test_save_load_is_bit_identical_and_generates_the_same(tmp_path, tiny_tied_folder, tiny_q4_gguf, preset, source):
    path = tiny_tied_folder if source == "folder" else tiny_q4_gguf
    summary = quantize_to_folder(path, preset, tmp_path / "out")
    assert summary.output_bytes > 0 and summary.bits_per_weight < (7 if preset.startswith("q4") else 12)
    # the file holds exactly what the in-memory quantization produced
    in_memory = _in_memory(path, preset, CPU)
    loaded = load_model(tmp_path / "out", CPU)
    assert loaded.weights_type.startswith(f"{preset} (llmcli) as ")
    ours, theirs = _packed_modules(loaded.model), _packed_modules(in_memory.model)
    assert ours.keys() == theirs.keys() and len(ours) >= 14 - 1  # a tied head shares the embedding
    for name in ours:
        for part in ours[name]:
            assert torch.equal(ours[name][part], theirs[name][part]), (name, part)
    from safetensors.torch import load_file

    from llmcli.quant.convert import QuantizedTensor
    from llmcli.quant.held import as_held

    stored = load_file(str(tmp_path / "out" / checkpoint.WEIGHTS))
    q_proj = "model.layers.0.self_attn.q_proj"
    spec = QuantSpec.from_json(json.loads((tmp_path / "out" / "config.json").read_text())
                               ["quantization"]["tensors"][f"{q_proj}.weight"])
    parts = {p: stored[f"{q_proj}.{p}"] for p in ("qweight", "scales", "zeros", "absmax") if f"{q_proj}.{p}" in stored}
    held = as_held(QuantizedTensor(spec, parts), CPU.device).state  # as this CPU holds it: blocks or llmcli's own
    assert held.keys() == ours[q_proj].keys() and all(torch.equal(held[k], ours[q_proj][k]) for k in held)
    assert _greedy(loaded) == _greedy(in_memory)
    # the tokenizer, BOS/EOS and chat template survive
    for text in TEXTS:
        assert loaded.tokenizer.encode(text) == in_memory.tokenizer.encode(text)
    assert loaded.tokenizer.eos_ids == in_memory.tokenizer.eos_ids
    assert loaded.tokenizer.add_bos == in_memory.tokenizer.add_bos
    assert loaded.chat_template == in_memory.chat_template
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    block = config["quantization"]
    assert block["format_version"] == checkpoint.FORMAT_VERSION and block["preset"] == preset
    assert block["tensors"][f"{q_proj}.weight"]["bits"] in (4, 8)


def test_q4_from_a_q4_1_gguf_is_imported_not_requantized(tmp_path, tiny_q4_gguf):
    summary = quantize_to_folder(tiny_q4_gguf, "q4", tmp_path / "out")
    # the 14 layer matrices are Q4_1 blocks taken as they are; q4 keeps embedding and head at 8 bits
    assert (summary.imported_tensors, summary.quantized_tensors) == (14, 16)
    base = load_model(tiny_q4_gguf, CPU32, load_preset("f32"))  # dequantized
    quant = load_model(tmp_path / "out", CPU32)
    for name, m in quant.model.named_modules():
        if hasattr(m, "packed") and name.startswith("model.layers"):
            ref = base.model.get_submodule(name).weight
            # exact up to the bfloat16 rounding of scales and zero points
            torch.testing.assert_close(m.dequantize(), ref, atol=2**-7 * float(ref.abs().max()), rtol=0)


@pytest.mark.parametrize("qtype,spec", [("Q4_0", QuantSpec(4, 32, True)), ("Q4_0", QuantSpec(4, 32, False)),
                                        ("Q4_1", QuantSpec(4, 32, False)), ("Q8_0", QuantSpec(8, 32, True))])
def test_gguf_block_import_is_exact(tmp_path, qtype, spec):
    """Codes come out as stored; with float32 scales the values are the gguf package's own."""
    import gguf
    from gguf.quants import dequantize as gguf_dequantize

    from llmcli.formats import gguf as gguf_file
    from llmcli.quant import gguf_import

    ref = hf_model("llama")
    write_gguf(ref, tmp_path / "t.gguf", qtype)
    reader = gguf_file.open_gguf(tmp_path / "t.gguf")
    args = gguf_file.model_args(gguf_file.read_metadata(reader), {t.name for t in reader.tensors})
    checked = 0
    for s in gguf_sources(reader, args, "llama"):
        if s.gguf_type != qtype:
            continue
        N, K = s.shape
        t = next(t for t in reader.tensors if gguf_file.hf_name(t.name) == s.name)
        raw = gguf_import.import_block_quants(t.data, qtype, N, K, spec)
        expected = gguf_dequantize(t.data, gguf.GGMLQuantizationType[qtype]).reshape(N, K)
        bits = 8 if qtype == "Q8_0" else 4
        values = dequantize(raw["codes"], raw["scales"], raw["zeros"], bits, 32).numpy()
        np.testing.assert_allclose(values, expected, rtol=0, atol=1e-6 * np.abs(expected).max())
        # through the stored (bfloat16-scaled) form, Q/K rows un-permuted like the float loader's
        q = quantize_source(s, spec)
        assert q.direct
        stored = q.state
        codes = unpack_int4(stored["qweight"]) if bits == 4 else stored["qweight"]
        w = dequantize(codes, stored["scales"], stored.get("zeros"), bits, 32)
        torch.testing.assert_close(w, s.values(), atol=2**-7 * float(s.values().abs().max()), rtol=0)
        checked += 1
    assert checked >= 14


def test_killed_quantize_leaves_nothing_complete(tmp_path, tiny_tied_folder):
    """SIGKILL halfway through: no output folder, only a hidden partial one without config.json."""
    out = tmp_path / "out"
    script = (
        "import os, signal, sys\n"
        "from llmcli.quant.pipeline import quantize_to_folder\n"
        "from llmcli.quant import checkpoint\n"
        "real = checkpoint.write\n"
        "def dying(folder, *a, **k):\n"
        "    from safetensors.torch import save_file\n"
        "    (folder / 'model.safetensors').write_bytes(b'half')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "checkpoint.write = dying\n"
        f"quantize_to_folder({str(tiny_tied_folder)!r}, 'q4', {str(out)!r})\n")
    r = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not out.exists()
    leftovers = list(tmp_path.iterdir())
    assert all(p.name.startswith(".out.partial-") and not (p / "config.json").exists() for p in leftovers)


def test_interrupted_quantize_cleans_up(tmp_path, tiny_tied_folder, monkeypatch):
    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "write", interrupt)
    with pytest.raises(KeyboardInterrupt):
        quantize_to_folder(tiny_tied_folder, "q4", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_force_replaces_and_output_is_readable(tmp_path, tiny_tied_folder):
    out = tmp_path / "out"
    quantize_to_folder(tiny_tied_folder, "q8", out)
    with pytest.raises(checkpoint.OutputExistsError, match="--force"):
        quantize_to_folder(tiny_tied_folder, "q4", out)
    quantize_to_folder(tiny_tied_folder, "q4", out, force=True)
    assert json.loads((out / "config.json").read_text())["quantization"]["preset"] == "q4"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert oct(out.stat().st_mode & 0o777) != oct(0o700)  # not mkdtemp's owner-only mode


def test_cached_quantized_converts_once(tmp_path, tiny_q4_gguf):
    from llmcli.quant.pipeline import cached_quantized

    first = cached_quantized(tiny_q4_gguf, "q4", tmp_path / "cache")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = cached_quantized(tiny_q4_gguf, "q4", tmp_path / "cache")
    assert again == first and (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert load_model(first, CPU).weights_type.startswith("q4 (llmcli)")


@pytest.mark.slow
def test_real_model_quantized_checkpoint(tmp_path, smollm2_gguf, monkeypatch):
    """SmolLM2's Q4_1 GGUF -> q4 checkpoint: every block imported, the same tokenizer, and
    next-token distributions close to the GGUF's own; quantizing at load to q4 gives the GGUF's own
    tokens (its blocks are q4's, taken as they are; both with q4's int8 activations, where the file as
    stored would take int8x2: quant/precision.py)."""
    monkeypatch.setenv("LLMCLI_ACTIVATIONS", "int8")
    summary = quantize_to_folder(smollm2_gguf, "q4", tmp_path / "q4")
    assert summary.imported_tensors == summary.quantized_tensors == 211
    source = load_model(smollm2_gguf, CPU32)
    loaded = load_model(tmp_path / "q4", CPU32)
    for text in TEXTS + [open(__file__, encoding="utf-8").read()]:
        assert loaded.tokenizer.encode(text) == source.tokenizer.encode(text)
    assert loaded.tokenizer.eos_ids == source.tokenizer.eos_ids and loaded.chat_template == source.chat_template
    assert _greedy(load_model(smollm2_gguf, CPU32, load_preset("q4")), 20) == _greedy(source, 20)
    ids = torch.tensor([source.tokenizer.encode(TEXTS[1] + "Paris is the capital of France. " * 3)])
    with torch.no_grad():
        ref = source.model(ids, StaticKVCache.for_model(source.args, 128, CPU.device, torch.float32))[0]
        ours = loaded.model(ids, StaticKVCache.for_model(loaded.args, 128, CPU.device, torch.float32))[0]
    kld = (ref.log_softmax(-1).exp() * (ref.log_softmax(-1) - ours.log_softmax(-1))).sum(-1)
    assert float(kld.mean()) < 2e-3  # only the bfloat16 rounding of scales differs
