"""Tiny random models for tests: a real byte-level BPE tokenizer, HF checkpoints written by
transformers (the reference implementation), and GGUF files written with `gguf.GGUFWriter`."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TRAINING_TEXT = (
    "The quick brown fox jumps over the lazy dog. Hello world! héllo wörld, naïve café. "
    "Numbers 12345 and 678. What is the capital of France? Paris is the capital of France. "
    "日本語のテキスト and emoji 🙂🚀 mixed in. " * 20
)


@lru_cache(maxsize=1)
def tokenizer_json() -> str:
    """A byte-level BPE (vocab 320) trained on a fixed text, with ChatML special tokens at 0..2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TRAINING_TEXT], trainer)
    return tok.to_str()


VOCAB = 320

# The added tokens of the tool-calling families (Qwen2.5/Qwen3, Llama 3.x, Phi-4-mini): one vocabulary
# with all of them, so that one tiny model serves every family's template. Qwen's are not special
# (special: false, as in its tokenizer.json: decoding keeps them); the others are.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>",
               "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
               "<|python_tag|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>",
               "<|tool_call|>", "<|/tool_call|>", "<|tool_response|>"]
NOT_SPECIAL = TOOL_TOKENS[:6]


@lru_cache(maxsize=1)
def tool_tokenizer_json() -> str:
    """tokenizer_json()'s BPE (vocab 320) with the tool families' added tokens after ChatML's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL + TOOL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TRAINING_TEXT], trainer)
    data = json.loads(tok.to_str())
    for t in data["added_tokens"]:
        t["special"] = t["content"] not in NOT_SPECIAL
    return json.dumps(data)


def write_tokenizer(folder: Path, template: str | None = CHAT_TEMPLATE, *, tools: bool = False,
                    bos: str | None = None, eos: str = "<|im_end|>") -> None:
    """`tools`: the vocabulary with the tool families' tokens (tool_tokenizer_json)."""
    (folder / "tokenizer.json").write_text(tool_tokenizer_json() if tools else tokenizer_json())
    config = {"bos_token": bos, "eos_token": eos, "add_bos_token": False}
    if template:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def hf_config(model_type: str = "llama", **overrides):
    from transformers import AutoConfig

    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                bos_token_id=None, eos_token_id=2, pad_token_id=0, initializer_range=0.1)
    if model_type == "mistral":
        base["sliding_window"] = None
    if model_type == "gemma3_text":  # local and global layers (every second), windows of 8
        base.update(num_hidden_layers=4, head_dim=32, query_pre_attn_scalar=24, sliding_window=8,
                    sliding_window_pattern=2, tie_word_embeddings=True)
        base.pop("rope_theta")
        base["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
    base.update(copy.deepcopy(overrides))  # configs rewrite nested dicts such as rope_parameters in place
    return AutoConfig.for_model(model_type, **base)


def hf_model(model_type: str = "llama", seed: int = 0, **overrides):
    """A random transformers model in float32 (the reference)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = hf_config(model_type, **overrides)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # norms away from 1 so that a wrong norm shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))
    return model


def save_hf(model, folder: Path, template: str | None = CHAT_TEMPLATE, **tokenizer) -> Path:
    """`tokenizer`: write_tokenizer's options (tools=True, bos, eos)."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder, template, **tokenizer)
    return folder


# ------------------------------------------------------------------------------------- BERT

BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@lru_cache(maxsize=1)
def wordpiece_json() -> str:
    """A BERT-style WordPiece tokenizer (lower-cased, [CLS] text [SEP]) trained on a fixed text."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator([TRAINING_TEXT], trainers.WordPieceTrainer(vocab_size=200, special_tokens=BERT_SPECIAL,
                                                                       show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok.to_str()


def save_bert(folder: Path, pooling: str = "mean", normalize: bool = True, seed: int = 0, **overrides) -> Path:
    """A random transformers BertModel (float32) with sentence-transformers' modules.json, 1_Pooling
    (`pooling`: mean, cls, max or lasttoken) and, with `normalize`, a Normalize module."""
    from transformers import BertConfig, BertModel

    vocab = json.loads(wordpiece_json())["model"]["vocab"]
    config = BertConfig(**{"vocab_size": len(vocab), "hidden_size": 64, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 64,
                           "initializer_range": 0.2, **overrides})
    torch.manual_seed(seed)
    model = BertModel(config, add_pooling_layer=True).eval()
    with torch.no_grad():  # LayerNorms away from (1, 0) so that a wrong one shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if name.endswith("weight") else 0.0))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_text(wordpiece_json())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 64, "unk_token": "[UNK]",
        "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    modes = {"cls": "cls_token", "mean": "mean_tokens", "max": "max_tokens", "sqrt": "mean_sqrt_len_tokens",
             "lasttoken": "lasttoken"}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": config.hidden_size,
         **{f"pooling_mode_{m}": key == pooling for key, m in modes.items()}}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48, "do_lower_case": False}))
    return folder


def eager_caller(model, first: int):
    """The tiny model, edited so that greedy decoding picks token `first` wherever a grammar allows
    it, and otherwise always ranks the same tokens first: a "model" that opens a tool call at once
    (the random weights rarely would). The logits are head[:, d] x (the final hidden state's
    coordinate d, after the norm): the embeddings put a constant in d, no layer writes to it, and
    the final norm keeps only d, so that coordinate is positive and the head's column d ranks."""
    with torch.no_grad():
        d = 0
        model.model.embed_tokens.weight[:, d] = 4.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[d, :] = 0
            layer.mlp.down_proj.weight[d, :] = 0
        model.model.norm.weight.zero_()
        model.model.norm.weight[d] = 1.0
        column = torch.linspace(0, 1, model.lm_head.weight.shape[0])[torch.randperm(model.lm_head.weight.shape[0],
                                                                                   generator=torch.Generator().manual_seed(0))]
        column[first] = 5.0
        model.lm_head.weight[:, d] = column
    return model


# ------------------------------------------------------------------------------------- GGUF

_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up", "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
_GEMMA3_LAYER = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                 "post_feedforward_layernorm": "post_ffw_norm"}
# HF model_type -> llama.cpp architecture
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
             "gemma3_text": "gemma3", "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "olmoe": "olmoe",
             "mixtral": "llama", "gpt_oss": "gpt-oss"}
# gpt-oss's names where llama.cpp's differ from the other families' (its converter's)
_GPT_OSS_LAYER = {"post_attention_layernorm": "post_attention_norm", "mlp.router": "ffn_gate_inp",
                  "self_attn.sinks": "attn_sinks"}


def gguf_name(hf: str, arch: str = "llama") -> str:
    if hf in _GGUF_NAMES:
        return _GGUF_NAMES[hf]
    parts = hf.split(".")  # model.layers.N.<module...>.weight
    layer, module, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
    names = {**_LAYER, **_GEMMA3_LAYER} if arch == "gemma3" else _LAYER
    if arch == "gpt-oss":
        if hf.endswith(".self_attn.sinks"):  # a parameter, stored as a weight
            return f"blk.{layer}.attn_sinks.weight"
        names = {**_LAYER, **_GPT_OSS_LAYER}
    return f"blk.{layer}.{names[module]}.{kind}"


def _rope_parameters(cfg) -> dict:
    rope = getattr(cfg, "rope_parameters", None) or {}
    return rope.get("full_attention", rope)


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, path: Path, qtype="F32", arch: str | None = None,
               metadata: dict | None = None) -> dict[str, np.ndarray]:
    """Write `model` as llama.cpp would; 2-D weights in `qtype` (a GGUF type name, or a function of
    (HF name, shape) giving one per tensor, as llama.cpp's mixes do), norms and biases in F32.
    `metadata`: keys to overwrite (keeping each key's GGUF type) or, with None, to leave out.

    Returns the float32 weights the file actually holds (dequantized, HF layout), to build the
    reference model from.
    """
    import gguf
    from gguf.quants import dequantize

    from benchmarks.gguf_blocks import quantize

    cfg = model.config
    arch = arch or GGUF_ARCH[cfg.model_type]
    type_of = qtype if callable(qtype) else (lambda name, shape: qtype)
    w = gguf.GGUFWriter(str(path), arch)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_name("tiny-test")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    rope = _rope_parameters(cfg)
    rotary = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    w.add_rope_dimension_count(rotary)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    if arch == "gemma3":  # as llama.cpp's converter (the pattern key is what llama.cpp reads; default 6)
        w.add_sliding_window(cfg.sliding_window)
        w.add_uint32("gemma3.attention.sliding_window_pattern", cfg._sliding_window_pattern)
        if cfg.final_logit_softcapping:
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if arch == "phi3":
        w.add_sliding_window(cfg.sliding_window or 0)
        if rope.get("rope_type") == "longrope":
            orig = rope["original_max_position_embeddings"]
            factor = cfg.max_position_embeddings / orig
            w.add_rope_scaling_orig_ctx_len(orig)
            w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(factor) / np.log(orig))))
            w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
            w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    if rope.get("rope_type") == "yarn":  # as llama.cpp's converter writes it
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope.get("beta_fast", 32.0))
        w.add_rope_scaling_yarn_beta_slow(rope.get("beta_slow", 1.0))
    if arch == "gpt-oss":
        w.add_sliding_window(cfg.sliding_window)
    if hasattr(cfg, "num_experts_per_tok"):  # a mixture of experts
        w.add_expert_count(getattr(cfg, "num_experts", None) or cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size)
        if getattr(cfg, "shared_expert_intermediate_size", 0):
            w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_vocab_size(cfg.vocab_size)
    tok = json.loads(tokenizer_json())
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    merges = tok["model"]["merges"]
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    held = {}
    for name, t in model.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        if arch == "gpt-oss" and ".mlp.experts." in name:  # (E, H, 2I) interleaved gate/up, (E, I, H) down
            held.update(_write_gpt_oss_experts(w, name, t.detach().float().numpy(), type_of))
            continue
        if ".mlp.experts." in name:  # transformers' (E, 2I, H) gate_up and (E, H, I) down, as llama.cpp's 3-D tensors
            held.update(_write_experts(w, name, t.detach().float().numpy(), type_of))
            continue
        a = t.detach().float().numpy()
        if name.endswith("shared_expert_gate.weight"):  # (1, hidden): llama.cpp stores a vector
            w.add_tensor(gguf_name(name, arch), np.ascontiguousarray(a.reshape(-1), dtype=np.float32))
            held[name] = a
            continue
        if name.endswith("q_proj.weight") or name.endswith("q_proj.bias"):
            a_file = _permute(a, cfg.num_attention_heads) if arch == "llama" else a
        elif name.endswith("k_proj.weight") or name.endswith("k_proj.bias"):
            a_file = _permute(a, cfg.num_key_value_heads) if arch == "llama" else a
        elif arch == "gemma3" and name.endswith("norm.weight"):
            a_file = a + 1  # llama.cpp's converter stores Gemma's norms as 1 + w
        else:
            a_file = a
        qt = gguf.GGMLQuantizationType[type_of(name, a.shape)]
        if name.endswith(".mlp.gate.weight") or name.endswith(".mlp.router.weight"):
            # a router: llama-quantize leaves ffn_gate_inp in F32
            qt = gguf.GGMLQuantizationType.F32
        if a.ndim == 2 and qt not in (gguf.GGMLQuantizationType.F32,):
            q = quantize(a_file, qt.name)
            w.add_tensor(gguf_name(name, arch), q, raw_dtype=qt)
            back = dequantize(q, qt).reshape(a.shape)
        else:
            w.add_tensor(gguf_name(name, arch), a_file.astype(np.float32))
            back = a_file - 1 if arch == "gemma3" and name.endswith("norm.weight") else a_file
        # undo the permutation to get the HF-layout values the file now represents
        if back is not a and arch == "llama" and ("q_proj" in name or "k_proj" in name):
            heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            back = back.reshape(heads, back.shape[0] // heads // 2, 2, *back.shape[1:]).swapaxes(1, 2).reshape(back.shape)
        held[name] = np.asarray(back, dtype=np.float32)
    for key, value in (metadata or {}).items():  # bad files for tests: same type, other value
        old = w.kv_data[0].pop(key)
        if value is not None:
            w.kv_data[0][key] = gguf.GGUFValue(value, old.type, old.sub_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def _write_experts(w, name: str, a: np.ndarray, type_of) -> dict[str, np.ndarray]:
    """One of transformers' 3-D expert tensors -> llama.cpp's ffn_{gate,up,down}_exps (each expert's
    rows quantized as a matrix's); the per-expert HF-named values the file holds."""
    import gguf
    from gguf.quants import dequantize

    from benchmarks.gguf_blocks import quantize

    layer = name.split(".")[2]
    E = a.shape[0]
    parts = {"gate": a[:, : a.shape[1] // 2], "up": a[:, a.shape[1] // 2:]} if name.endswith("gate_up_proj") else {"down": a}
    held = {}
    for kind, m in parts.items():
        qt = gguf.GGMLQuantizationType[type_of(f"model.layers.{layer}.mlp.experts.0.{kind}_proj.weight", m.shape[1:])]
        if qt == gguf.GGMLQuantizationType.F32:
            q, back = np.ascontiguousarray(m, dtype=np.float32), m
            w.add_tensor(f"blk.{layer}.ffn_{kind}_exps.weight", q)
        else:
            q = np.stack([quantize(np.ascontiguousarray(m[e]), qt.name) for e in range(E)])
            w.add_tensor(f"blk.{layer}.ffn_{kind}_exps.weight", q, raw_dtype=qt)
            back = np.stack([dequantize(q[e], qt).reshape(m.shape[1:]) for e in range(E)])
        for e in range(E):
            held[f"model.layers.{layer}.mlp.experts.{e}.{kind}_proj.weight"] = np.asarray(back[e], dtype=np.float32)
    return held


def _write_gpt_oss_experts(w, name: str, a: np.ndarray, type_of) -> dict[str, np.ndarray]:
    """gpt-oss's 3-D experts as llama.cpp's converter writes them: gate_up_proj (E, H, 2I) (columns
    alternating gate, up) -> ffn_gate_exps and ffn_up_exps (E, I, H), down_proj (E, I, H) -> ffn_down_exps
    (E, H, I), the biases split the same way; the per-expert values the file holds, under llmcli's names
    (`mlp.experts.3.gate_proj.weight`)."""
    import gguf
    from gguf.quants import dequantize

    from benchmarks.gguf_blocks import quantize

    layer, what = name.split(".")[2], name.rsplit(".", 1)[-1]
    if what.endswith("_bias"):
        parts = {"gate": a[:, 0::2], "up": a[:, 1::2]} if what.startswith("gate_up") else {"down": a}
        for kind, m in parts.items():
            w.add_tensor(f"blk.{layer}.ffn_{kind}_exps.bias", np.ascontiguousarray(m, dtype=np.float32))
        return {f"model.layers.{layer}.mlp.experts.{e}.{kind}_proj.bias": np.asarray(m[e], dtype=np.float32)
                for kind, m in parts.items() for e in range(a.shape[0])}
    if what == "gate_up_proj":
        parts = {"gate": a[:, :, 0::2].transpose(0, 2, 1), "up": a[:, :, 1::2].transpose(0, 2, 1)}
    else:
        parts = {"down": a.transpose(0, 2, 1)}
    held = {}
    for kind, m in parts.items():
        m = np.ascontiguousarray(m, dtype=np.float32)
        qt = gguf.GGMLQuantizationType[type_of(f"model.layers.{layer}.mlp.experts.0.{kind}_proj.weight", m.shape[1:])]
        if qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor(f"blk.{layer}.ffn_{kind}_exps.weight", m)
            back = m
        else:
            q = np.stack([quantize(m[e], qt.name) for e in range(m.shape[0])])
            w.add_tensor(f"blk.{layer}.ffn_{kind}_exps.weight", q, raw_dtype=qt)
            back = np.stack([dequantize(q[e], qt).reshape(m.shape[1:]) for e in range(m.shape[0])])
        for e in range(m.shape[0]):
            held[f"model.layers.{layer}.mlp.experts.{e}.{kind}_proj.weight"] = np.asarray(back[e], dtype=np.float32)
    return held


def gpt_oss_reference(model, held: dict[str, np.ndarray]):
    """A copy of a transformers gpt-oss holding what a file holds: per-expert values (write_gguf's
    or save_gpt_oss_mxfp4's) back into its 3-D tensors, gate and up interleaved again."""
    ref = copy.deepcopy(model)
    E = model.config.num_local_experts
    with torch.no_grad():
        for name, p in ref.state_dict().items():
            if name in held:
                p.copy_(torch.from_numpy(held[name]))
                continue
            base, what = name.rsplit(".", 1)
            part = "bias" if what.endswith("_bias") else "weight"
            if ".mlp.experts" not in name or f"{base}.0.{'down' if 'down' in what else 'gate'}_proj.{part}" not in held:
                continue

            def got(e, kind, part):
                return torch.from_numpy(held[f"{base}.{e}.{kind}_proj.{part}"])

            for e in range(E):
                if what == "gate_up_proj":
                    p[e, :, 0::2], p[e, :, 1::2] = got(e, "gate", "weight").T, got(e, "up", "weight").T
                elif what == "gate_up_proj_bias":
                    p[e, 0::2], p[e, 1::2] = got(e, "gate", "bias"), got(e, "up", "bias")
                elif what == "down_proj":
                    p[e] = got(e, "down", "weight").T
                elif what == "down_proj_bias":
                    p[e] = got(e, "down", "bias")
    return ref


def save_gpt_oss_mxfp4(model, folder: Path, template: str | None = CHAT_TEMPLATE) -> dict[str, np.ndarray]:
    """A gpt-oss folder as OpenAI ships it, experts in MXFP4 (benchmarks/gpt_oss_mxfp4.py's
    save_gpt_oss_mxfp4), with the tiny tokenizer; -> the per-expert values the blocks hold."""
    from benchmarks.gpt_oss_mxfp4 import save_gpt_oss_mxfp4 as save

    held = save(model, folder)
    write_tokenizer(folder, template)
    return held


FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}  # llama.cpp's for rows not a multiple of 256


def k_mix(n_layers: int, tied: bool, base: str = "Q4_K"):
    """llama.cpp's Q4_K_M (base Q4_K) or Q5_K_M (base Q5_K) mix (src/llama-quant.cpp,
    llama_tensor_get_type): attn_v and ffn_down in Q6_K in the first and last eighth and every third
    layer, the output (or a tied embedding) in Q6_K, the rest in `base`; rows not a multiple of 256
    fall back (FALLBACK)."""
    import re

    def more_bits(i: int) -> bool:
        return i < n_layers // 8 or i >= 7 * n_layers // 8 or (i - n_layers // 8) % 3 == 2

    def type_of(name: str, shape) -> str:
        m = re.search(r"layers\.(\d+)\.", name)
        head = name == "lm_head.weight" or (tied and name == "model.embed_tokens.weight")
        if head and shape[-1] % 256:
            return "Q8_0"
        big = head or (m and ("v_proj" in name or "down_proj" in name) and more_bits(int(m[1])))
        wanted = "Q6_K" if big else base
        return FALLBACK[wanted] if shape[-1] % 256 else wanted

    return type_of


def reference_from(model, weights: dict[str, np.ndarray]):
    """A copy of `model` holding `weights` (e.g. what a quantized GGUF dequantizes to)."""
    import copy

    ref = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in ref.state_dict().items():
            if name in weights:
                p.copy_(torch.from_numpy(weights[name]))
    return ref
