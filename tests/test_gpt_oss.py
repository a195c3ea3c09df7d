"""gpt-oss (models/gpt_oss.py): tiny random configs against transformers in float32 from an HF folder
(plain and MXFP4 experts, as OpenAI ships them) and from GGUF files written as llama.cpp's converter
writes them (F32, MXFP4 experts, Q8_0), the experts held as the file's MXFP4 blocks; the native step
and the torch-free path (its numbers bit for bit, no torch imported) decode it; `show`; files whose
experts disagree with their metadata refused; the harmony chat format (its template renders,
<|return|> and <|call|> end a reply, <|end|> does not)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_cli

PROMPT = [[5, 17, 80, 3, 200, 41, 9, 150, 33, 61]]
# as llama.cpp reads YaRN from a GGUF: the ramp's ends rounded outwards (truncate)
ROPE_AS_LLAMACPP = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                    "original_max_position_embeddings": 4096, "truncate": True}
CONFIGS = {  # transformers' default rope (YaRN, truncate false) unless given
    "8-experts-top2-window4": dict(),
    "16-experts-top4-one-kv-head": dict(num_local_experts=16, num_experts_per_tok=4, num_hidden_layers=4,
                                        num_key_value_heads=1, sliding_window=3, max_position_embeddings=512),
}
HARMONY = ["<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]


def _gpt_oss(seed: int = 1, **overrides):
    from tiny import hf_model

    base = dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, head_dim=16, sliding_window=4,
                num_hidden_layers=3)
    model = hf_model("gpt_oss", seed=seed, **{**base, **overrides})
    with torch.no_grad():  # sinks that matter, and gates that pass the SwiGLU's clamp (7) in places
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_()
            layer.mlp.experts.gate_up_proj.mul_(10)
    return model


def _close(got, want, tol=1e-4):
    return float((got - want).abs().max()) < tol * float(want.abs().max())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_gpt_oss_folder_gives_transformers_logits(name, tmp_path):
    """Prefill, token by token through the cache (past the window), and a prompt longer than the
    query chunk (gpt_oss.QUERY_CHUNK) for the second config."""
    from tiny import save_hf

    from llmcli.models import gpt_oss
    from llmcli.runtime.runtime import open_model

    model = _gpt_oss(**CONFIGS[name])
    rt = open_model(str(save_hf(model, tmp_path / "m")), device="cpu", dtype="float32",
                    ctx_size=model.config.max_position_embeddings)
    args = rt.loaded.args
    assert type(rt.loaded.model) is gpt_oss.Transformer and args.num_experts == model.config.num_local_experts
    assert args.layer_types == model.config.layer_types and args.rope_scaling["rope_type"] == "yarn"
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        want = model(ids).logits
        assert _close(rt.loaded.model(ids, rt.new_cache()), want)
        cache = rt.new_cache()
        rt.loaded.model(ids[:, :3], cache)
        steps = [rt.loaded.model(ids[:, i:i + 1], cache)[0, -1] for i in range(3, ids.shape[1])]
        assert _close(torch.stack(steps), want[0, 3:])
        if model.config.max_position_embeddings >= 512:
            long = torch.randint(0, 320, (1, gpt_oss.QUERY_CHUNK + 44), generator=torch.Generator().manual_seed(0))
            assert _close(rt.loaded.model(long, rt.new_cache()), model(long).logits)


def test_an_mxfp4_folder_gives_the_logits_of_what_it_holds(tmp_path):
    """OpenAI's checkpoints: experts as MXFP4 blocks and scales (E, N, K/32, 16), gate and up rows
    interleaved. Dequantized, they are the values the blocks hold; loaded, they stay packed (GGUF's
    17-byte MXFP4 blocks where the kernels take them, else int8 codes) and multiply with int8
    activations. `show` counts the parameters the blocks hold, not their bytes."""
    from tiny import gpt_oss_reference, save_gpt_oss_mxfp4

    from llmcli import models
    from llmcli.formats.open import open_model_file
    from llmcli.runtime.runtime import open_model

    model = _gpt_oss()
    folder = tmp_path / "mx"
    held = save_gpt_oss_mxfp4(model, folder)
    mf = open_model_file(folder)
    cpu = torch.device("cpu")
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        want = gpt_oss_reference(model, held)(ids).logits
        dequantized = models.build(mf.args, mf.state_dict(torch.float32, cpu), cpu)
        assert _close(dequantized(ids, _cache(dequantized, mf.args)), want)
        assert not _close(model(ids).logits, want)  # (the blocks hold other numbers than the float model)
        rt = open_model(str(folder), device="cpu", dtype="float32", ctx_size=64)
        assert not isinstance(rt.loaded.model.model.layers[0].mlp.experts[0].up_proj, torch.nn.Linear)  # (packed)
        got = rt.loaded.model(ids, rt.new_cache())
        assert ((got - want).abs().amax(-1)[0] / want.abs().max()).median() < 5e-2
    out = json.loads(run_cli("show", str(folder), "--json").stdout)
    assert out["parameters"] == sum(p.numel() for p in model.parameters())


def _cache(model, args):
    from llmcli.cache.static import StaticKVCache

    return StaticKVCache.for_model(args, 64, torch.device("cpu"), torch.float32)


def test_mxfp4_blocks_read_as_ggml_reads_them():
    """HF's byte order (element 2j low nibble, 2j + 1 high) and GGUF's (j low, j + 16 high) of the same
    codes give ggml's dequantize_row_mxfp4 values: e2m1 times 2^(scale - 127)."""
    import gguf
    from gguf.quants import dequantize

    from llmcli.formats.hf_folder import mxfp4_values

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (6, 32), dtype=np.uint8)
    codes[0, :16] = np.arange(16)
    scales = np.array([127, 120, 130, 1, 200, 127], dtype=np.uint8)
    ggml = np.concatenate((scales[:, None], codes[:, :16] | (codes[:, 16:] << 4)), axis=1)
    want = dequantize(ggml.reshape(1, -1), gguf.GGMLQuantizationType.MXFP4).reshape(6, 32)
    hf = (codes[:, 0::2] | (codes[:, 1::2] << 4))[:, None, :]
    got = mxfp4_values(torch.from_numpy(hf), torch.from_numpy(scales[:, None])).numpy().reshape(6, 32)
    np.testing.assert_array_equal(got, want)
    assert list(want[0, :8]) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]


def test_mxfp4_blocks_import_exactly_as_int8_codes_and_q8_0_blocks():
    """Where the kernels do not multiply MXFP4 blocks (no SIMD variant, a GPU), a GGUF's MXFP4 experts
    are int8 codes with a power-of-two scale a block (twice the bytes, not four times as bfloat16),
    and such int8 weights Q8_0 blocks where the kernels take blocks: the same values."""
    import gguf
    from gguf.quants import dequantize

    from llmcli import native
    from llmcli.quant.convert import QuantizedTensor
    from llmcli.quant.gguf_import import AS_STORED, direct_spec, import_block_quants
    from llmcli.quant.held import as_held

    rng = np.random.default_rng(1)
    N, K = 4, 64
    raw = np.concatenate((rng.integers(104, 140, (N * K // 32, 1)), rng.integers(0, 256, (N * K // 32, 16))),
                         axis=1).astype(np.uint8).reshape(N, -1)
    want = dequantize(raw, gguf.GGMLQuantizationType.MXFP4).reshape(N, K)
    spec = AS_STORED["MXFP4"]
    assert direct_spec("MXFP4", spec)
    got = import_block_quants(raw, "MXFP4", N, K, spec)
    values = got["codes"].float().reshape(N, -1, 32) * got["scales"][..., None]
    np.testing.assert_array_equal(values.reshape(N, K).numpy(), want)
    held = as_held(QuantizedTensor(spec, got, True), torch.device("cpu"))
    if native.int8_dot():  # (elsewhere the int8 codes stay llmcli's layout)
        assert held.spec.kind == "Q8_0"
        blocks = held.stored["blocks"].numpy()
        np.testing.assert_array_equal(dequantize(blocks, gguf.GGMLQuantizationType.Q8_0).reshape(N, K), want)


def test_mxfp4_experts_are_held_as_the_file_s_blocks(tmp_path):
    """Where the kernels multiply MXFP4, a GGUF's experts stay its 17-byte blocks (views of the file's
    map, no int8 copy): their bytes in memory are the file's, on the torch path and the torch-free one."""
    from tiny import write_gguf

    from llmcli import native
    from llmcli.formats.open import open_model_file
    from llmcli.runtime.lean_step import LeanModel
    from llmcli.runtime.runtime import open_model

    if not native.int8_dot():
        pytest.skip("no C++ kernels with integer dot products (MXFP4 experts stay int8 codes for torch)")
    path = tmp_path / "gpt-oss.gguf"
    write_gguf(_gpt_oss(rope_parameters=ROPE_AS_LLAMACPP), path,
               lambda name, shape: "MXFP4" if ".experts." in name else "Q8_0")
    mf = open_model_file(path)
    in_file = sum(int(t.n_bytes) for t in mf.reader.tensors if "_exps.weight" in t.name)
    model = open_model(str(path), device="cpu", ctx_size=64).loaded.model
    held = [p.packed for layer in model.model.layers for x in layer.mlp.experts
            for p in (x.gate_proj, x.up_proj, x.down_proj)]
    assert {p.type_name for p in held} == {"MXFP4"}
    assert sum(t.numel() for p in held for t in p.held_tensors()) == in_file
    lean = LeanModel.open(mf, 1, native.module())
    assert sum(w.data.nbytes for layer in lean.layers for x in layer.experts for w in x) == in_file


@pytest.mark.parametrize("kind", ["F32", "MXFP4", "MXFP4+Q8_0"])
def test_a_gpt_oss_gguf_gives_the_logits_of_what_it_holds(kind, tmp_path):
    """As llama.cpp's converter writes gpt-oss: ffn_{gate,up,down}_exps and their biases, the router's
    bias, attn_sinks, post_attention_norm, YaRN and the window in the metadata; experts in MXFP4
    (held as the file's blocks, or int8 codes: exactly), the other matrices F32 or Q8_0. Held blocks multiply with int8
    activations, as llama.cpp's do: close then, not the same numbers."""
    from tiny import gpt_oss_reference, write_gguf

    from llmcli.runtime.runtime import open_model

    model = _gpt_oss(rope_parameters=ROPE_AS_LLAMACPP)
    rest = "Q8_0" if kind.endswith("Q8_0") else "F32"
    experts = "MXFP4" if kind != "F32" else "F32"
    path = tmp_path / f"gpt-oss.{kind}.gguf"
    held = write_gguf(model, path, lambda name, shape: experts if ".experts." in name else rest)
    rt = open_model(str(path), device="cpu", dtype="float32", ctx_size=64)
    assert rt.loaded.args.model_type == "gpt_oss" and rt.loaded.args.layer_types == model.config.layer_types
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        want = gpt_oss_reference(model, held)(ids).logits
        got = rt.loaded.model(ids, rt.new_cache())
    if kind == "F32":
        assert _close(got, want)
        return
    assert not isinstance(rt.loaded.model.model.layers[0].mlp.experts[0].up_proj, torch.nn.Linear)  # (packed)
    per_position = (got - want).abs().amax(-1)[0] / want.abs().max()
    assert per_position.median() < 5e-2, per_position
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.8


def test_the_torch_free_path_runs_gpt_oss_as_the_torch_path_s_step(tmp_path):
    """LeanModel builds gpt-oss's step from the file with numpy (sinks, the window, q/k/v/o and expert
    biases, the router's bias, YaRN's tables, the clamped SwiGLU): the torch path's NativeStep's
    logits bit for bit, a prompt then single tokens past the window; `run` takes that path without
    importing torch and answers as the torch path does."""
    from test_lean import PROMPT as LEAN_PROMPT, STEPS, _llmcli
    from tiny import write_gguf

    from llmcli import native
    from llmcli.formats.open import open_model_file
    from llmcli.runtime.lean_step import LeanModel
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    if not native.int8_dot():
        pytest.skip("no C++ kernels with integer dot products (the torch-free path needs them)")
    path = tmp_path / "gpt-oss.gguf"
    write_gguf(_gpt_oss(rope_parameters=ROPE_AS_LLAMACPP), path,
               lambda name, shape: "MXFP4" if ".experts." in name else "Q8_0")
    rt = open_model(str(path), device="cpu", ctx_size=64, threads=2)
    step, cache = NativeStep(rt.loaded.model, threads=2), rt.new_cache()
    lean = LeanModel.open(open_model_file(path), 2, native.module())
    assert lean is not None and lean.act == "swiglu_oai"
    mine = lean.new_cache(64)
    with torch.inference_mode():
        np.testing.assert_array_equal(lean(LEAN_PROMPT, mine)[0][0],
                                      step(torch.tensor([LEAN_PROMPT]), cache, last_only=True)[0, -1].numpy())
        for tok in STEPS:
            np.testing.assert_array_equal(lean([tok], mine)[0][0],
                                          step(torch.tensor([[tok]]), cache, last_only=True)[0, -1].numpy())
    run = ["run", str(path), "hello there", "-n", "5", "--temp", "0", "--ignore-eos", "-c", "64"]
    lean_out, _, lean_torch = _llmcli(run)
    torch_out, _, torch_torch = _llmcli(run, env={"LLMCLI_TORCH_PATH": "1"})
    assert not lean_torch and torch_torch and lean_out == torch_out and lean_out.strip()


def _variants() -> list[str]:
    from llmcli.native.build import VARIANTS

    return list(VARIANTS)


@pytest.mark.parametrize("variant", _variants())
def test_the_native_step_decodes_gpt_oss_as_the_model_does(variant, tmp_path, monkeypatch):
    """A gpt-oss GGUF whose matrices are all blocks (MXFP4 experts as the file's) decodes through the
    one-call C++ step on the CPU: sinks, the window, biases, the router's bias, the clamped SwiGLU.
    One-token steps from the same cache, by the step and by the model (test_native_step.py's
    _compare: both quantize activations to int8 per block of 32; a code now and then rounds the
    other way, so most steps agree to float32 rounding and none by more than such a flip)."""
    import copy

    from tiny import write_gguf

    from llmcli import native
    from llmcli.cache import new_cache
    from llmcli.models import llama
    from llmcli.runtime.native_step import NativeStep
    from llmcli.runtime.runtime import open_model

    reason = native.why_not(variant)
    if reason is not None:
        pytest.skip(reason)
    monkeypatch.setattr(native, "_module", native.load(variant))
    if not native.int8_dot():
        pytest.skip("no C++ kernels with integer dot products (MXFP4 experts stay int8 codes for torch)")

    def forward(self, x):  # (the C++ step sums the squares in float64)
        xf = x.float()
        return self.weight * (xf / torch.sqrt((xf.double() ** 2).mean(-1, keepdim=True).float() + self.eps)).to(x.dtype)

    monkeypatch.setattr(llama.RMSNorm, "forward", forward)
    monkeypatch.setenv("LLMCLI_ACTIVATIONS", "int8")  # (both as llama.cpp quantizes them: the step's refined
    path = tmp_path / "gpt-oss.gguf"                   # groups and the model's products would part otherwise)
    write_gguf(_gpt_oss(rope_parameters=ROPE_AS_LLAMACPP), path,
               lambda name, shape: "MXFP4" if ".experts." in name else "Q8_0")
    rt = open_model(str(path), device="cpu", ctx_size=64)
    assert isinstance(rt.decode_step(compile=False), NativeStep)
    model = rt.loaded.model
    step = NativeStep(model, threads=3)
    cache = new_cache(rt.loaded.args, 64, torch.device("cpu"), torch.float32)
    exact, worst = 0, 0.0
    with torch.inference_mode():
        model(torch.tensor([[5, 17, 80, 3, 200, 41, 9, 150]]), cache)
        for tok in [7, 99, 250, 31, 2, 64, 120, 8]:  # (past the window of 4, into the cache's keys)
            theirs = copy.deepcopy(cache)
            got = step(torch.tensor([[tok]]), cache, None, True, True)
            want = model(torch.tensor([[tok]]), theirs, None, True, True)
            errors = [float((g - w).abs().max() / w.abs().max()) for g, w in zip(got, want)]
            exact += max(errors) < 1e-5
            worst = max(worst, *errors)
    assert exact >= 5 and worst < 0.1, (exact, worst)


@pytest.mark.parametrize("change, tensor", [({"gpt-oss.expert_count": 6}, "blk.0.ffn_gate_inp"),
                                            ({"gpt-oss.expert_feed_forward_length": 16}, "blk.0.ffn_")])
def test_a_gpt_oss_gguf_whose_experts_disagree_with_its_metadata_is_refused(change, tensor, tmp_path):
    from tiny import write_gguf

    path = tmp_path / "bad.gguf"
    write_gguf(_gpt_oss(rope_parameters=ROPE_AS_LLAMACPP), path,
               lambda name, shape: "MXFP4" if ".experts." in name else "F32", metadata=change)
    r = run_cli("run", str(path), "hi", "-n", "2", "-c", "64")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error:") and tensor in lines[-1] and "Traceback" not in r.stderr, r.stderr


def test_a_gpt_oss_folder_whose_experts_disagree_with_its_config_is_refused(tmp_path):
    from tiny import save_hf

    folder = save_hf(_gpt_oss(), tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_local_experts": 6}))
    r = run_cli("run", str(folder), "hi", "-n", "2", "-c", "64")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error:") and ".mlp." in lines[-1] and "Traceback" not in r.stderr, r.stderr


def test_show_prints_the_experts_and_the_active_parameters(tmp_path):
    from tiny import write_gguf

    path = tmp_path / "gpt-oss.gguf"
    model = _gpt_oss(rope_parameters=ROPE_AS_LLAMACPP)
    write_gguf(model, path, lambda name, shape: "MXFP4" if ".experts." in name else "F32")
    out = json.loads(run_cli("show", str(path), "--json").stdout)
    cfg = model.config
    h, i = cfg.hidden_size, cfg.intermediate_size
    idle = cfg.num_hidden_layers * (cfg.num_local_experts - cfg.num_experts_per_tok) * (3 * h * i + 2 * i + h)
    assert out["experts"] == 8 and out["active_experts"] == 2
    assert out["parameters"] == sum(p.numel() for p in model.parameters())
    assert out["active_parameters"] == out["parameters"] - idle
    assert "8, 2 active a token" in run_cli("show", str(path)).stdout


# ------------------------------------------------------------------------------------- harmony

def _harmony_folder(tmp_path: Path, first: str, positions: int = 512) -> Path:
    """A tiny gpt-oss with the harmony special tokens and chat template, edited so that greedy decoding
    always picks `first` (tiny.eager_caller's construction: a constant coordinate the final norm
    keeps alone, that no layer writes to, and the head's column for it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tiny import SPECIAL, TRAINING_TEXT, VOCAB

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TRAINING_TEXT], trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL + HARMONY, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    model = _gpt_oss(max_position_embeddings=positions)  # (the template's system message is 250 tiny tokens)
    with torch.no_grad():
        d = 0
        model.model.embed_tokens.weight[:, d] = 4.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[d, :] = 0
            layer.self_attn.o_proj.bias[d] = 0
            layer.mlp.experts.down_proj[:, :, d] = 0
            layer.mlp.experts.down_proj_bias[:, d] = 0
        model.model.norm.weight.zero_()
        model.model.norm.weight[d] = 1.0
        model.lm_head.weight[:, d] = torch.linspace(0, 1, VOCAB)
        model.lm_head.weight[tok.token_to_id(first), d] = 5.0
    folder = tmp_path / "harmony"
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_text(tok.to_str())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
        "chat_template": (Path(__file__).parent / "data" / "templates" / "gpt-oss.jinja").read_text()}))
    return folder


@pytest.mark.parametrize("first, finish", [("<|return|>", "stop"), ("<|call|>", "stop"), ("<|end|>", "length")])
def test_harmony_renders_and_a_reply_ends_at_return_or_call_not_at_end(first, finish, tmp_path):
    """The gpt-oss template's prompt (system, developer instructions, user, then the assistant's
    header); a reply ends at <|return|> (final answer) or <|call|> (a tool call), and not at <|end|>,
    which closes the analysis message the final one follows."""
    from llmcli.decode.request import Request
    from llmcli.decode.sampling_plain import SamplingParams
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(_harmony_folder(tmp_path, first)), device="cpu", dtype="float32", ctx_size=512)
    tok = rt.loaded.tokenizer
    ids = {t: tok.backend.token_to_id(t) for t in HARMONY}
    assert {ids["<|return|>"], ids["<|call|>"]} <= tok.eos_ids and ids["<|end|>"] not in tok.eos_ids
    prompt = rt.prompt_ids([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])
    text = tok.decode(prompt, skip_special=False)
    assert text.startswith("<|start|>system<|message|>") and "<|start|>user<|message|>Hello<|end|>" in text
    assert text.endswith("<|start|>assistant") and ids["<|start|>"] in prompt and ids["<|message|>"] in prompt
    chunks = list(rt.generate(prompt, Request(SamplingParams(temperature=0), 4), rt.new_cache()))
    assert chunks[-1].finish_reason == finish
    tokens = [t for c in chunks for t in c.tokens]
    assert tokens == ([ids["<|end|>"]] * 4 if finish == "length" else [ids[first]])  # (the end token, then no more)
