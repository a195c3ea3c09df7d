"""`llmcli quantize --format gguf` on tiny models: gguf-py's reader finds the types, shapes and keys
llama.cpp's converter writes; the tensors dequantize to the checkpoint's; llmcli runs the file as the
model `--quant` builds; a GGUF source comes back key for key and block for block; and every preset or
model GGUF cannot hold is one line."""

from __future__ import annotations

import hashlib
import json
import shutil

import gguf
import numpy as np
import pytest
import torch
from conftest import run_cli
from test_cli_run import assert_one_line_error
from tiny import CHAT_TEMPLATE, VOCAB, hf_model, reference_from, save_bert, save_hf, write_gguf

from llmcli.cache.static import StaticKVCache
from llmcli.formats.open import open_model_file
from llmcli.quant.convert import convert
from llmcli.quant.gguf_export import quantize_to_gguf, writable_presets
from llmcli.quant.presets import load_preset
from llmcli.quant.primitives import dequantize, unpack_int4
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model

CPU32 = place("cpu", "float32")
CASES = {  # name: (model_type, GGUF architecture, hf_model overrides)
    "llama": ("llama", "llama", {}),
    "qwen2": ("qwen2", "qwen2", {"tie_word_embeddings": True}),
    # llama.cpp scales gemma3's queries by 1/sqrt(head_dim): the tiny model's own 24 is refused below
    "gemma3": ("gemma3_text", "gemma3", {"query_pre_attn_scalar": 32}),
}
MORE = {  # the other architectures and RoPE kinds, at q8 (exact blocks)
    "mistral": ("mistral", "llama", {}),
    "llama3-rope": ("llama", "llama", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}),
    "qwen3": ("qwen3", "qwen3", {"tie_word_embeddings": True}),
    "phi3-longrope": ("phi3", "phi3", {"original_max_position_embeddings": 32, "rope_parameters": {
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
        "original_max_position_embeddings": 32, "short_factor": [1.0, 1.5, 2.0, 3.0],
        "long_factor": [2.0, 4.0, 8.0, 16.0]}}),
}
TEXTS = ["Hello world! héllo 12345 🙂", "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
         "  leading spaces and\ttabs\n\nnew lines"]
FILE_TYPES = {"q4": gguf.LlamaFileType.MOSTLY_Q4_1, "q8": gguf.LlamaFileType.MOSTLY_Q8_0}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(case, preset) -> (reference model, its folder, the GGUF written from it), each made once."""
    root, models, done = tmp_path_factory.mktemp("export"), {}, {}

    def make(case: str, preset: str):
        model_type, _, overrides = {**CASES, **MORE}[case]
        if case not in models:
            ref = hf_model(model_type, **overrides)
            models[case] = (ref, save_hf(ref, root / case))
        if (case, preset) not in done:
            out = root / f"{case}-{preset}.gguf"
            quantize_to_gguf(models[case][1], preset, out)
            done[case, preset] = out
        return (*models[case], done[case, preset])

    return make


def _fields(reader: gguf.GGUFReader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def _file_values(t, arch: str, heads: dict) -> np.ndarray:
    """A reader tensor as Hugging Face holds it: dequantized, Q/K rows un-permuted (llama), Gemma's
    norms back from 1 + w."""
    v = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
    part = t.name.split(".")[-2]
    if arch == "llama" and part in heads:
        n = heads[part]
        v = v.reshape(n, v.shape[0] // n // 2, 2, *v.shape[1:]).swapaxes(1, 2).reshape(v.shape)
    if arch == "gemma3" and t.name.endswith("norm.weight"):
        v = v - 1
    return v


def _hf_weights(path, model, arch: str) -> dict[str, np.ndarray]:
    from llmcli.formats.gguf import hf_name

    cfg = model.config
    heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
    return {hf_name(t.name, arch): _file_values(t, arch, heads) for t in gguf.GGUFReader(str(path)).tensors
            if hf_name(t.name, arch) is not None}


@pytest.mark.parametrize("preset", ["q4", "q8"])
@pytest.mark.parametrize("case", list(CASES))
def test_types_shapes_and_keys_are_llama_cpps(made, case, preset):
    model, folder, path = made(case, preset)
    _, arch, _ = CASES[case]
    reader = gguf.GGUFReader(str(path))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    block = "Q4_1" if preset == "q4" else "Q8_0"
    for name, kind in types.items():
        want = "F32" if name.endswith((".bias", "norm.weight")) else "Q8_0" if name in ("token_embd.weight",
                                                                                           "output.weight") else block
        assert kind == want, name
    assert ("output.weight" in types) == (not model.config.tie_word_embeddings)
    state = model.state_dict()
    from llmcli.formats.gguf import hf_name
    for t in reader.tensors:  # GGUF lists dims fastest first
        assert tuple(reversed(t.shape.tolist())) == tuple(state[hf_name(t.name, arch)].shape), t.name
    keys, cfg = _fields(reader), model.config
    assert keys["general.architecture"] == arch and keys["general.file_type"] == FILE_TYPES[preset]
    assert keys["general.quantization_version"] == 2 and keys["general.type"] == "model"
    for key, value in (("block_count", cfg.num_hidden_layers), ("embedding_length", cfg.hidden_size),
                       ("feed_forward_length", cfg.intermediate_size), ("context_length", 256),
                       ("attention.head_count", 4), ("attention.head_count_kv", 2)):
        assert keys[f"{arch}.{key}"] == value, key
    assert keys[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    if arch == "llama":  # LlamaModel's own keys
        assert keys["llama.vocab_size"] == VOCAB and keys["llama.rope.dimension_count"] == 16
    if arch == "gemma3":  # windows of 8 on every second layer; the local layers' own RoPE base
        assert keys["gemma3.attention.sliding_window"] == 8 and keys["gemma3.attention.sliding_window_pattern"] == 2
        assert keys["gemma3.rope.freq_base_swa"] == 10000.0 and keys["gemma3.rope.freq_base"] == 1e6
        assert keys["gemma3.attention.key_length"] == 32
    tokens = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    assert keys["tokenizer.ggml.model"] == "gpt2" and keys["tokenizer.ggml.pre"] == "default"
    assert keys["tokenizer.ggml.tokens"] == [t for t, _ in sorted(tokens.items(), key=lambda kv: kv[1])]
    assert keys["tokenizer.ggml.token_type"][:4] == [3, 3, 3, 1]  # the ChatML specials are control tokens
    assert len(keys["tokenizer.ggml.merges"]) == VOCAB - 256 - 3
    assert keys["tokenizer.ggml.eos_token_id"] == 2 and keys["tokenizer.ggml.add_bos_token"] is False
    assert keys["tokenizer.chat_template"] == CHAT_TEMPLATE


def _assert_holds_the_checkpoint(path, source, preset: str, model, arch: str, copied: tuple[str, ...] = ()):
    """The file's tensors dequantize to what `llmcli quantize SOURCE -p PRESET` stores: q8 exactly; q4
    up to Q4_1's m = zero - 8 * scale rounded to float16 (half an ulp per group). `copied`: tensors
    taken from a GGUF source as they are (the checkpoint rounds their scales to bfloat16 instead)."""
    mf = open_model_file(source)
    converted = convert(mf.sources(), load_preset(preset), mf.args.num_hidden_layers, mf.args.tie_word_embeddings)
    held = _hf_weights(path, model, arch)
    assert set(held) == set(converted.quantized) | set(converted.floats)
    for name, q in converted.quantized.items():
        if name in copied:
            continue
        s = q.state
        codes = unpack_int4(s["qweight"]) if q.spec.bits == 4 else s["qweight"]
        want = dequantize(codes, s["scales"], s.get("zeros"), q.spec.bits, 32).numpy()
        diff = np.abs(held[name] - want).reshape(want.shape[0], -1, 32)
        if "zeros" in s:
            m = (s["zeros"].float() - 8 * s["scales"].float()).numpy()
            assert (diff <= np.abs(m)[..., None] * 2.0 ** -11 + 1e-12).all(), name
        else:
            assert diff.max() == 0, name
    for name, t in converted.floats.items():  # norms and biases: float32 as they were
        np.testing.assert_allclose(held[name], t.float().numpy(), atol=1e-6, rtol=0, err_msg=name)


@pytest.mark.parametrize("preset", ["q4", "q8"])
@pytest.mark.parametrize("case", list(CASES))
def test_tensors_dequantize_to_the_checkpoints(made, case, preset):
    model, folder, path = made(case, preset)
    _assert_holds_the_checkpoint(path, folder, preset, model, CASES[case][1])


def _logits(loaded, tokens):
    with torch.no_grad():
        return loaded.model(tokens, StaticKVCache.for_model(loaded.args, 64, CPU32.device, torch.float32))[0]


@pytest.mark.parametrize("case,preset", [(c, "q4") for c in CASES] + [(c, "q8") for c in MORE])
def test_llmcli_runs_the_file_as_the_model_it_holds(made, case, preset):
    """Loaded by llmcli (dequantized, float32), the file gives transformers' logits for the weights it
    holds: names, Q/K permutation, RoPE keys and tables, norms and tokenizer all read back."""
    model, folder, path = made(case, preset)
    arch = {**CASES, **MORE}[case][1]
    loaded = load_model(path, CPU32, load_preset("f32"))
    assert loaded.args.model_type == model.config.model_type.replace("mistral", "llama")
    tokens = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = reference_from(model, _hf_weights(path, model, arch))(tokens).logits[0].float()
    torch.testing.assert_close(_logits(loaded, tokens), want, atol=1e-4, rtol=1e-4)
    folder_tokenizer = open_model_file(folder).tokenizer
    for text in TEXTS:
        assert loaded.tokenizer.encode(text) == folder_tokenizer.encode(text), text
    names = {t.name for t in gguf.GGUFReader(str(path)).tensors}
    assert ("rope_freqs.weight" in names) == (case == "llama3-rope")
    assert ("rope_factors_long.weight" in names) == (case == "phi3-longrope")


@pytest.mark.parametrize("case,preset", [("llama", "q4"), ("qwen2", "q8")])
def test_run_gives_the_tokens_of_quant_at_load(made, case, preset, tmp_path):
    """`run model.gguf` written with --no-search and `run FOLDER --quant PRESET` (min/max scales at
    load, as llama.cpp's quantizer takes them), both on the CPU's eager path: the same codes and
    scales, the same greedy tokens."""
    _, folder, _ = made(case, preset)
    path = tmp_path / "no-search.gguf"
    quantize_to_gguf(folder, preset, path, search=False)
    args = ("The quick brown fox", "-n", "12", "--temp", "0", "--json")
    eager = {"LLMCLI_NO_KERNEL": "1"}
    a = run_cli("run", str(path), *args, env=eager)
    b = run_cli("run", str(folder), "--quant", preset, *args, env=eager)
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    assert json.loads(a.stdout)["text"] == json.loads(b.stdout)["text"]


def test_float_presets_write_float_files(made):
    model, _, path = made("llama", "bf16")
    reader = gguf.GGUFReader(str(path))
    assert _fields(reader)["general.file_type"] == gguf.LlamaFileType.MOSTLY_BF16
    assert {t.tensor_type.name for t in reader.tensors if len(t.shape) == 2} == {"BF16"}
    held = _hf_weights(path, model, "llama")
    for name, t in model.state_dict().items():
        np.testing.assert_array_equal(held[name], t.to(torch.bfloat16 if t.dim() == 2 else torch.float32).float().numpy())


# ------------------------------------------------------------------------------ from a GGUF file


@pytest.fixture(scope="module")
def smollm_like(tmp_path_factory):
    """A tiny llama as SmolLM2's file is: Q4_1 matrices, a Q8_0 embedding, Q/K rows permuted."""
    path = tmp_path_factory.mktemp("src") / "tiny-q4_1.gguf"
    write_gguf(hf_model("llama"), path, lambda name, shape: "Q8_0" if "embed" in name or "lm_head" in name else "Q4_1")
    return path


def _blocks(path) -> dict[str, tuple[str, bytes]]:
    return {t.name: (t.tensor_type.name, t.data.tobytes()) for t in gguf.GGUFReader(str(path)).tensors}


def test_a_gguf_in_its_own_types_comes_back_block_for_block(smollm_like, tmp_path):
    out = tmp_path / "q4.gguf"
    summary = quantize_to_gguf(smollm_like, "q4", out)
    assert _blocks(out) == _blocks(smollm_like)
    keys = _fields(gguf.GGUFReader(str(out)))
    assert keys.pop("general.file_type") == gguf.LlamaFileType.MOSTLY_Q4_1  # the tiny source has none
    assert keys == _fields(gguf.GGUFReader(str(smollm_like)))
    assert summary.imported_tensors == summary.quantized_tensors == 16


def test_a_gguf_requantized_keeps_its_keys_and_layout(smollm_like, tmp_path):
    out = tmp_path / "q8.gguf"
    quantize_to_gguf(smollm_like, "q8", out)
    keys = _fields(gguf.GGUFReader(str(out)))
    assert keys.pop("general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0
    assert keys == _fields(gguf.GGUFReader(str(smollm_like)))
    assert _blocks(out)["token_embd.weight"] == _blocks(smollm_like)["token_embd.weight"]  # Q8_0 already
    _assert_holds_the_checkpoint(out, smollm_like, "q8", hf_model("llama"), "llama", copied=("model.embed_tokens.weight",
                                                                                             "lm_head.weight"))


def test_the_real_smollm2_comes_back_identical(smollm2_gguf, tmp_path):
    out = tmp_path / "smollm2-q4.gguf"
    r = run_cli("quantize", str(smollm2_gguf), "--format", "gguf", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "210 Q4_1, 61 F32, 1 Q8_0" in r.stdout  # its token embedding is Q8_0
    assert _blocks(out) == _blocks(smollm2_gguf)
    assert _fields(gguf.GGUFReader(str(out))) == _fields(gguf.GGUFReader(str(smollm2_gguf)))


def test_pre_tokenizer_named_by_the_converters_hash(smollm2_gguf, tmp_path):
    """SmolLM2's tokenizer, saved as a tokenizer.json, hashes to llama.cpp's 'smollm'."""
    from tokenizers import Tokenizer

    from llmcli.formats.gguf_pretokenizers import CHECK_TEXT, NAMES
    from llmcli.quant import checkpoint

    mf = open_model_file(smollm2_gguf)
    checkpoint.write_tokenizer(mf.tokenizer, None, tmp_path)
    ids = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode(CHECK_TEXT).ids
    assert NAMES[hashlib.sha256(str(ids).encode()).hexdigest()] == mf.metadata["tokenizer.ggml.pre"] == "smollm"


def test_a_sentencepiece_vocabulary_is_written_as_llama_cpps(spm_model, tmp_path):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    sp.Load(str(spm_model))
    folder = save_hf(hf_model("mistral", vocab_size=sp.GetPieceSize(), bos_token_id=1), tmp_path / "spm", template=None)
    (folder / "tokenizer.json").unlink()
    shutil.copy(spm_model, folder / "tokenizer.model")
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                              "add_bos_token": True}))
    out = tmp_path / "spm.gguf"
    quantize_to_gguf(folder, "q8", out)
    keys = _fields(gguf.GGUFReader(str(out)))
    n = sp.GetPieceSize()
    assert keys["tokenizer.ggml.model"] == "llama" and keys["tokenizer.ggml.pre"] == "default"
    assert keys["tokenizer.ggml.tokens"] == [sp.IdToPiece(i) for i in range(n)]
    np.testing.assert_allclose(keys["tokenizer.ggml.scores"], [sp.GetScore(i) for i in range(n)])
    assert keys["tokenizer.ggml.token_type"][:4] == [2, 3, 3, 6]  # <unk>, <s>, </s>, <0x00>
    assert keys["tokenizer.ggml.bos_token_id"] == 1 and keys["tokenizer.ggml.eos_token_id"] == 2
    assert keys["tokenizer.ggml.add_bos_token"] is True
    tok = open_model_file(out).tokenizer
    for text in TEXTS:
        assert tok.encode(text, add_bos=False) == sp.encode(text), text


# ------------------------------------------------------------------------------------ refusals


def test_presets_gguf_has_no_type_for_are_refused(tiny_folder, tmp_path):
    assert writable_presets() == ["bf16", "f16", "f32", "q4", "q4_mixed", "q8"]
    for preset in ("q4_g128", "nf4", "llm_int8"):
        r = run_cli("quantize", str(tiny_folder), "-p", preset, "--format", "gguf", "-o", str(tmp_path / "x.gguf"))
        assert_one_line_error(r, f"preset {preset}", "GGUF has no type", "q4, q4_mixed, q8", code=2)
    assert not list(tmp_path.iterdir())  # nothing left behind


def test_bad_outputs_and_models_are_one_line(tiny_folder, tmp_path):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"x")
    assert_one_line_error(run_cli("quantize", str(tiny_folder), "--format", "gguf", "-o", str(out)),
                          "already exists", "--force")
    assert_one_line_error(run_cli("quantize", str(tiny_folder), "--format", "gguf", "-o", str(tmp_path)),
                          "is a folder", ".gguf")
    assert_one_line_error(run_cli("quantize", str(tiny_folder), "--format", "ggml"), "--format", "llmcli, gguf")
    bert = save_bert(tmp_path / "bert")
    assert_one_line_error(run_cli("quantize", str(bert), "--format", "gguf", "-o", str(tmp_path / "b.gguf")),
                          "embedding model")
    gemma = save_hf(hf_model("gemma3_text"), tmp_path / "gemma")  # queries scaled by 1/sqrt(24), head_dim 32
    assert_one_line_error(run_cli("quantize", str(gemma), "--format", "gguf", "-o", str(tmp_path / "g.gguf")),
                          "1/sqrt(24)", "llama.cpp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert", "gemma", "m.gguf"]


def test_default_output_name_and_summary(tiny_folder, tmp_path):
    r = run_cli("quantize", str(tiny_folder), "--format", "gguf", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["output"] == str(tmp_path / "model-q4.gguf") and summary["format"] == "gguf"
    assert summary["tensor_types"] == {"Q4_1": 14, "F32": 5, "Q8_0": 2}
