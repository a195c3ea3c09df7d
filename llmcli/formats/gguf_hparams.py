"""A Hugging Face model's hyperparameters as the `{arch}.*` keys and extra tensors llama.cpp's
convert_hf_to_gguf.py writes for it (TextModel.set_gguf_parameters and each architecture's class:
LlamaModel, Qwen2Model, Qwen3Model, Gemma3Model, Phi3MiniModel), from the ModelArgs llmcli read.

    llama, mistral   "llama": vocab_size and rope.dimension_count too; Q/K rows permuted (gguf.py);
                     llama3 RoPE scaling as a `rope_freqs` tensor of per-frequency factors
    qwen2, qwen3     the common keys
    gemma3           key/value length, local RoPE base, sliding window (and its pattern where it is
                     not llama.cpp's default of five local layers then one global), final soft-cap
    phi3             rotary dims, original context, sliding window; LongRoPE as two factor tensors
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedModelError

# Hugging Face model_type -> the llama.cpp architecture its converter writes
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                      "gemma3_text": "gemma3", "phi3": "phi3"}


def gguf_architecture(model_type: str) -> str:
    arch = GGUF_ARCHITECTURES.get(model_type)
    if arch is None:
        raise UnsupportedModelError(f"llmcli writes GGUF for {', '.join(sorted(GGUF_ARCHITECTURES))} models; "
                                    f"this one is {model_type!r}, which llama.cpp has no architecture for here")
    return arch


def add_hparams(writer, args, config: dict) -> None:
    """The architecture's keys (writer.arch names it)."""
    import gguf

    arch = writer.arch
    writer.add_block_count(args.num_hidden_layers)
    writer.add_context_length(args.max_position_embeddings)
    writer.add_embedding_length(args.hidden_size)
    writer.add_feed_forward_length(args.intermediate_size)
    writer.add_head_count(args.num_attention_heads)
    writer.add_head_count_kv(args.num_key_value_heads)
    scaling = args.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])
    elif kind in ("longrope", "su"):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    writer.add_rope_freq_base(args.rope_theta)
    if arch == "gemma3":
        writer.add_rope_freq_base_swa(args.rope_local_base_freq)
    writer.add_layer_norm_rms_eps(args.rms_norm_eps)
    if "head_dim" in config or arch == "gemma3":
        writer.add_key_length(args.head_dim)
        writer.add_value_length(args.head_dim)
    if arch == "llama":
        writer.add_vocab_size(args.vocab_size)
        writer.add_rope_dimension_count(args.head_dim)
    elif arch == "phi3":
        writer.add_rope_scaling_orig_ctx_len(args.original_max_position_embeddings or args.max_position_embeddings)
        writer.add_rope_dimension_count(args.rotary_dim)
        writer.add_sliding_window(args.sliding_window or 0)
        if args.longrope:
            writer.add_rope_scaling_attn_factors(_longrope_attention_factor(args))
    elif arch == "gemma3":
        # llama.cpp scales queries by 1/sqrt(head_dim), and the 62-layer 27B by 1/sqrt(hidden/heads)
        scalar = args.hidden_size // args.num_attention_heads if args.num_hidden_layers == 62 else args.head_dim
        if args.query_pre_attn_scalar != scalar:
            raise UnsupportedModelError(f"this Gemma 3 scales queries by 1/sqrt({args.query_pre_attn_scalar}); "
                                        f"llama.cpp's gemma3 uses 1/sqrt({scalar}) for this shape, so a GGUF of it "
                                        "would compute another model")
        if args.final_logit_softcapping:
            writer.add_final_logit_softcapping(args.final_logit_softcapping)
        sliding = [t == "sliding_attention" for t in args.layer_types]
        if any(sliding):
            writer.add_sliding_window(args.sliding_window)
            if sliding != _pattern(len(sliding), 6):  # llama.cpp's default; the converter writes none
                period = next((p for p in range(1, len(sliding) + 1) if sliding == _pattern(len(sliding), p)), None)
                if period is not None:
                    writer.add_uint32(f"{arch}.attention.sliding_window_pattern", period)
                else:
                    writer.add_array(f"{arch}.attention.sliding_window_pattern", sliding)


def _pattern(n: int, period: int) -> list[bool]:
    """llama.cpp's set_swa_pattern: every `period`-th layer global, the others local."""
    return [(i + 1) % period != 0 for i in range(n)]


def _longrope_attention_factor(args) -> float:
    """Phi3MiniModel's: from the context extension alone (it ignores a config's attention_factor)."""
    orig = args.original_max_position_embeddings or args.max_position_embeddings
    scale = args.max_position_embeddings / orig
    return math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0


def extra_tensors(arch: str, args) -> dict[str, np.ndarray]:
    """RoPE tables the converter stores as float32 tensors (generate_extra_tensors)."""
    scaling = args.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", ""))
    if arch == "phi3" and args.longrope:
        return {"rope_factors_long.weight": np.array(scaling["long_factor"], dtype=np.float32),
                "rope_factors_short.weight": np.array(scaling["short_factor"], dtype=np.float32)}
    if arch == "llama" and str(kind).lower() == "llama3":
        return {"rope_freqs.weight": _llama3_factors(args, scaling)}
    return {}


def _llama3_factors(args, scaling: dict) -> np.ndarray:
    """LlamaModel.generate_extra_tensors: per frequency, 1 (high), `factor` (low) or the smooth blend."""
    dim = args.head_dim
    freqs = 1.0 / (args.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = scaling.get("factor", 8.0)
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_ctx = scaling.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)
