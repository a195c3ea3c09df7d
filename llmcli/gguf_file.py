"""Reading a `.gguf` file: hyperparameters, tokenizer, chat template and weights.

The `gguf` package's reader memory-maps the file; its `dequantize` handles every tensor type it
knows (F32, F16, BF16, Q4_0 … Q8_0 and the K-quants). Tensor names are mapped to Hugging Face
names, and llama-type files have their Q/K rows un-permuted back to HF's rotary layout.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from .errors import CorruptModelError, UnsupportedModelError
from .models.llama import ModelArgs

GGUF_MAGIC = b"GGUF"
SUPPORTED_GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2")
# llama.cpp's converter permutes Q and K rows for these (interleaved rotary pairs)
_PERMUTED_ARCHITECTURES = ("llama", "mistral")

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def open_gguf(path: Path):
    """The gguf package's reader over a memory map; a truncated or corrupt file is one clear error."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path), "r")
    except Exception as e:  # the reader raises ValueError, IndexError, struct errors ... on bad bytes
        raise CorruptModelError(f"{path} is truncated or corrupt ({type(e).__name__}); download it again") from None
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise CorruptModelError(f"{path} is truncated (tensor {t.name} runs past the end); download it again")
    return reader


def read_metadata(reader) -> dict:
    """Every key/value as plain Python values (arrays as lists)."""
    meta = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            meta[name] = field.contents()
        except Exception:  # a field type the package cannot decode: not one we need
            continue
    return meta


def model_args(meta: dict, tensor_names: set[str]) -> ModelArgs:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)}")

    def get(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    n_heads = get("attention.head_count")
    n_kv = get("attention.head_count_kv", n_heads)
    if isinstance(n_heads, list) or isinstance(n_kv, list):
        raise UnsupportedModelError("per-layer head counts are not supported")
    hidden = get("embedding_length")
    scaling = None
    kind = get("rope.scaling.type", "none")
    if kind == "linear":
        scaling = {"rope_type": "linear", "factor": get("rope.scaling.factor", 1.0)}
    elif kind not in ("none", None):
        raise UnsupportedModelError(f"rope scaling {kind!r} in this GGUF is not supported; supported: none, linear")
    vocab = get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", ())) or None
    return ModelArgs(
        model_type="qwen2" if arch == "qwen2" else "llama",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_hidden_layers=get("block_count"),
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        head_dim=get("attention.key_length") or get("rope.dimension_count") or hidden // n_heads,
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=get("rope.freq_base", 10000.0),
        rope_scaling=scaling,
        max_position_embeddings=get("context_length", 4096),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_output.bias" in tensor_names,
        qkv_bias="blk.0.attn_q.bias" in tensor_names and "blk.0.attn_output.bias" not in tensor_names,
        sliding_window=get("attention.sliding_window"),
    )


def hf_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None for unknown names."""
    m = _BLOCK.match(gguf_name)
    if m:
        layer, part, kind = m.groups()
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}" if part in _LAYER_NAMES else None
    base, _, kind = gguf_name.rpartition(".")
    return f"{_GLOBAL_NAMES[base]}.{kind}" if base in _GLOBAL_NAMES else None


def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation: per head, interleaved rotary pairs -> two halves.

    Works on any tensor whose first dim is rows (float weights, biases, or packed quantized rows).
    """
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def permute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """What llama.cpp's converter does (HF halves -> interleaved pairs); the inverse of the above."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def tensor_shape(t) -> tuple[int, ...]:
    """GGUF lists dims fastest-first; torch wants them slowest-first."""
    return tuple(int(d) for d in reversed(t.shape.tolist()))


def dequantize(t) -> np.ndarray:
    """Float32 values of one reader tensor, in torch's dim order."""
    from gguf import GGMLQuantizationType, quants

    try:
        if t.tensor_type == GGMLQuantizationType.F32:
            values = np.array(t.data, dtype=np.float32)  # a copy: the map is read-only
        else:
            values = quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise UnsupportedModelError(f"tensor {t.name} has type {t.tensor_type.name}, which cannot be dequantized yet") from None
    return values.reshape(tensor_shape(t))


def rope_freq_factors(reader) -> tuple[float, ...] | None:
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            return tuple(float(x) for x in dequantize(t).reshape(-1))
    return None


def iter_tensors(reader, args: ModelArgs, arch: str):
    """Yield (hf_name, reader_tensor, needs_unpermute_heads or None) for every model tensor."""
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            continue
        name = hf_name(t.name)
        if name is None:
            raise UnsupportedModelError(f"unexpected tensor {t.name} in the GGUF file; this variant is not supported")
        heads = None
        if arch in _PERMUTED_ARCHITECTURES:
            if ".q_proj." in name:
                heads = args.num_attention_heads
            elif ".k_proj." in name:
                heads = args.num_key_value_heads
        yield name, t, heads


def load_state_dict(reader, args: ModelArgs, arch: str, dtype: torch.dtype, device: torch.device) -> dict:
    """Dequantized weights under HF names, Q/K un-permuted, in `dtype` on `device`."""
    state = {}
    for name, t, heads in iter_tensors(reader, args, arch):
        w = torch.from_numpy(dequantize(t))
        if heads is not None:
            w = unpermute_rows(w, heads)
        state[name] = w.to(device=device, dtype=dtype)
    return state
