"""Reading a `.gguf` file: hyperparameters, tokenizer, chat template and weights.

The file is memory-mapped; tensors are numpy views of the map, laid out exactly as the `gguf`
package's `GGUFReader` lays them out, and the package's `dequantize` handles every tensor type it
knows (F32, F16, BF16, Q4_0 … Q8_0, the K-quants and MXFP4, gpt-oss's experts: blocks of 32 e2m1
values with one e8m0 scale byte). The header is parsed here rather than by
`GGUFReader`, which builds a numpy view per string and is an order of magnitude slower on a
vocabulary. Tensor names are mapped to Hugging Face names, and llama-type files have
their Q/K rows un-permuted back to HF's rotary layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import math
import mmap
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..errors import CorruptModelError, UnsupportedModelError
from ..models.args import (Gemma3Args, GptOssArgs, LlamaArgs, MixtralArgs, MoeArgs, OlmoeArgs, Phi3Args,
                           Qwen2MoeArgs, Qwen3MoeArgs)

if TYPE_CHECKING:
    import torch

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # what llama.cpp reads (version 1 had 32-bit counts; 3 added big-endian files)
SUPPORTED_GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3", "qwen3moe", "qwen2moe", "olmoe",
                                "gpt-oss")
# llama.cpp's converter permutes Q and K rows for these (interleaved rotary pairs); qwen, phi3 and
# gemma3 are stored in HF's half-split layout
_PERMUTED_ARCHITECTURES = ("llama", "mistral")
# GGUF architecture -> HF model_type
_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                "gemma3": "gemma3_text", "qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe", "olmoe": "olmoe",
                "gpt-oss": "gpt_oss"}
# a mixture of experts' matrices, all experts in one 3-D tensor (GGUF dims: K, N, experts); gpt-oss's
# biases, one row an expert (N, experts)
_EXPERTS = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.(weight|bias)$")
# tensors that are RoPE tables, not weights
_ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_qkv": "self_attn.qkv_proj",  # phi3
    "ffn_gate_inp": "mlp.gate",  # a mixture of experts' router
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",  # qwen2moe
    "ffn_down_shexp": "mlp.shared_expert.down_proj", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# gemma3: four norms per layer; `ffn_norm` is the one before the MLP
_GEMMA3_NAMES = {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                 "post_ffw_norm": "post_feedforward_layernorm"}
# gpt-oss: the norm before the experts is `post_attention_norm`; a sink logit per head
_GPT_OSS_NAMES = {"post_attention_norm": "post_attention_layernorm", "attn_sinks": "self_attn.sinks"}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


# GGUF value types -> struct format (scalars); 8 = string, 9 = array
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_PLAIN_ITEMS = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                "I32": np.int32, "I64": np.int64}


@dataclass
class TensorInfo:
    """One tensor of the file, with the same fields as `gguf.ReaderTensor`."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: np.ndarray  # GGUF order: fastest-varying dim first
    n_elements: int
    n_bytes: int
    data_offset: int
    _map: object = None

    @property
    def data(self) -> np.ndarray:
        """A view of the map: typed values for plain types, (..., bytes per row) uint8 for quantized ones."""
        from gguf.quants import quant_shape_to_byte_shape

        dims = tuple(int(d) for d in reversed(self.shape.tolist()))
        plain = _PLAIN_ITEMS.get(self.tensor_type.name)
        if plain is not None:
            return np.frombuffer(self._map, dtype=plain, count=self.n_elements, offset=self.data_offset).reshape(dims)
        raw = np.frombuffer(self._map, dtype=np.uint8, count=self.n_bytes, offset=self.data_offset)
        return raw.reshape(quant_shape_to_byte_shape(dims, self.tensor_type))


class GGUFFile:
    """Header (metadata, tensor infos) parsed once; tensor data stays in the memory map."""

    def __init__(self, path: Path):
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        with open(path, "rb") as f:
            # copy-on-write: numpy/torch views are writable (no warnings), the file is never written
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        buf, self.pos = self._map, 0
        if bytes(buf[:4]) != GGUF_MAGIC:
            raise ValueError("not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in GGUF_VERSIONS:
            raise _Version(version)
        self.pos = 24
        self.metadata = {}
        self.value_types = {}  # key -> (GGUF value type, item type of an array or None): for copying keys
        for _ in range(n_kv):
            key = self._string()
            (kind,) = self._unpack("<I")
            item = struct.unpack_from("<I", buf, self.pos)[0] if kind == 9 else None
            self.value_types[key] = (kind, item)
            self.metadata[key] = self._value(kind)
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            if n_dims > 4:  # GGML_MAX_DIMS
                raise _Corrupt(f"tensor {name} has {n_dims} dimensions")
            dims = np.array(self._unpack(f"<{n_dims}Q"), dtype=np.uint64)
            kind, offset = self._unpack("<IQ")
            infos.append((name, dims, GGMLQuantizationType(kind), offset))
        align = self.metadata.get("general.alignment", 32)
        if not isinstance(align, int) or align < 1 or align & (align - 1):
            raise _Corrupt(f"general.alignment is {align!r}, not a power of two")
        start = (self.pos + align - 1) // align * align
        self.tensors = []
        expected = 0  # as llama.cpp's gguf_init: each tensor's data follows the one before, padded
        for name, dims, kind, offset in infos:
            n = math.prod(int(d) for d in dims)  # Python ints: no silent overflow
            block, size = GGML_QUANT_SIZES[kind]
            if offset % align:  # as llama.cpp's gguf_init checks
                raise _Corrupt(f"tensor {name}'s data offset {offset} is not aligned to {align} bytes")
            if n % block:
                raise _Corrupt(f"tensor {name} has {n} values, not whole blocks of {block} for {kind.name}")
            if offset != expected:  # a size that does not match the type and shape (a type rewritten)
                raise _Corrupt(_size_mismatch(self.tensors[-1], start + offset - self.tensors[-1].data_offset)
                               if self.tensors else
                               f"tensor {name}'s data starts at offset {offset}, not 0")
            self.tensors.append(TensorInfo(name, kind, dims, n, n * size // block, start + offset, self._map))
            expected = offset + (self.tensors[-1].n_bytes + align - 1) // align * align
        self.data_end = start + expected  # the end of the last tensor's padding

    def release_pages(self, address: int, nbytes: int) -> bool:
        """Drop this process's pages of the map under [address, address + nbytes) (whole pages inside
        it), where the range lies in the map: they are the file's, never written, so the kernel frees
        them and reads them again if they are touched (the page cache keeps them for the next start).
        What a weight copied for the kernels (native_step.prepare) leaves behind. False elsewhere."""
        base = np.frombuffer(self._map, dtype=np.uint8, count=1).ctypes.data
        start, end = address - base, address - base + nbytes
        if start < 0 or end > len(self._map) or not hasattr(mmap, "MADV_DONTNEED"):
            return False
        start, end = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
        if end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)
        return True

    def _unpack(self, fmt: str):
        values = struct.unpack_from(fmt, self._map, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (n,) = struct.unpack_from("<Q", self._map, self.pos)
        start = self.pos + 8
        self.pos = start + n
        if self.pos > len(self._map):
            raise ValueError("string runs past the end of the file")
        try:  # GGUF strings are UTF-8 (gguf-py decodes them strictly too): anything else is damage
            return self._map[start:self.pos].decode("utf-8")
        except UnicodeDecodeError:
            raise _Corrupt(f"the text at byte {start} is not UTF-8") from None

    def _strings(self, count: int) -> list[str]:
        """An array of `count` strings (a vocabulary: SmolLM2's 49k tokens and 48k merges), in one
        tight loop: _string's per-call overhead over tens of thousands of strings was most of a load."""
        buf, pos, end, out = self._map, self.pos, len(self._map), []
        from_bytes = int.from_bytes
        try:
            for _ in range(count):
                n = from_bytes(buf[pos:pos + 8], "little")
                pos += 8
                if pos + n > end:
                    raise ValueError("string runs past the end of the file")
                out.append(buf[pos:pos + n].decode("utf-8"))
                pos += n
        except UnicodeDecodeError:
            raise _Corrupt(f"the text at byte {pos} is not UTF-8") from None
        self.pos = pos
        return out

    def _value(self, kind: int):
        if kind == 8:
            return self._string()
        if kind == 9:
            item, count = self._unpack("<IQ")
            if item == 8:
                return self._strings(count)
            if item == 9:
                return [self._value(9) for _ in range(count)]
            dtype = np.dtype(_NUMPY[item]).newbyteorder("<")
            values = np.frombuffer(self._map, dtype=dtype, count=count, offset=self.pos)
            self.pos += values.nbytes
            return values.tolist()
        (value,) = self._unpack(_SCALAR[kind])
        return value


class _Corrupt(ValueError):
    """Damage the parser can name."""


class _Version(ValueError):
    """A GGUF version this parser does not read."""

    def __init__(self, version: int):
        super().__init__(version)
        self.version = version


def _size_mismatch(t: TensorInfo, given: int) -> str:
    """A tensor whose type and shape do not match the bytes the file has for it (up to the next one)."""
    dims = "x".join(str(int(d)) for d in t.shape.tolist())
    return (f"tensor {t.name} is {t.tensor_type.name} of shape {dims}, which takes {t.n_bytes} bytes, but the "
            f"file has {given} for it (its type or shape does not match its data)")


def open_gguf(path: Path) -> GGUFFile:
    """Parse the header; a truncated or corrupt file is one clear error."""
    try:
        reader = GGUFFile(path)
    except _Version as e:
        swapped = " (a big-endian file?)" if e.version and not e.version & 0xFFFF else ""
        raise UnsupportedModelError(f"{path} is GGUF version {e.version}{swapped}; llmcli reads versions "
                                    f"{' and '.join(map(str, GGUF_VERSIONS))}, as llama.cpp does: convert the model "
                                    "again with a current llama.cpp") from None
    except _Corrupt as e:
        raise CorruptModelError(f"{path} is corrupt: {e}; download it again") from None
    except Exception as e:  # struct.error, ValueError, KeyError ... on bad bytes
        raise CorruptModelError(f"{path} is truncated or corrupt ({type(e).__name__}); download it again") from None
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise CorruptModelError(f"{path} is truncated (tensor {t.name} runs past the end); download it again")
    align = reader.metadata.get("general.alignment", 32)
    if reader.tensors and size >= reader.data_end + align:  # the last tensor is smaller than its bytes
        last = reader.tensors[-1]
        raise CorruptModelError(f"{path} is corrupt: {_size_mismatch(last, size - last.data_offset)}; "
                                "download it again")
    return reader


def read_metadata(reader: GGUFFile) -> dict:
    """Every key/value as plain Python values (arrays as lists)."""
    return reader.metadata


def model_args(meta: dict, tensor_names: set[str], reader=None) -> LlamaArgs:
    """The family's ModelArgs from GGUF metadata; `reader` adds RoPE tables stored as tensors
    (llama 3's `rope_freqs`, phi3's LongRoPE factors)."""
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
    elif kind == "yarn":  # as llama.cpp applies it: the ramp's ends rounded outwards (ggml_rope_yarn_corr_dims)
        scaling = {"rope_type": "yarn", "factor": get("rope.scaling.factor", 1.0),
                   "original_max_position_embeddings": get("rope.scaling.original_context_length",
                                                           get("context_length", 4096)),
                   "beta_fast": get("rope.scaling.yarn_beta_fast", 32.0),
                   "beta_slow": get("rope.scaling.yarn_beta_slow", 1.0), "truncate": True,
                   "attention_factor": get("rope.scaling.yarn_attn_factor")}
    elif kind not in ("none", None) and not (arch == "phi3" and kind == "longrope"):  # phi3: its factor tensors
        raise UnsupportedModelError(f"rope scaling {kind!r} in this GGUF is not supported; supported: none, linear, "
                                    "yarn")
    vocab = get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", ())) or None
    if reader is not None:  # the embedding's rows are the real vocabulary (gemma3's converter trims it)
        embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
        vocab = int(embd.shape[1]) if embd is not None else vocab
    per_head = hidden // n_heads if isinstance(hidden, int) and isinstance(n_heads, int) and n_heads > 0 else None
    head_dim = get("attention.key_length")  # a 0 stays 0: ModelArgs says what is wrong
    if head_dim is None:  # phi3/gemma3 may turn only part of each head: their rotary dims are not it
        head_dim = per_head if arch in ("phi3", "gemma3") else get("rope.dimension_count", per_head)
    window = get("attention.sliding_window") or None
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_hidden_layers=get("block_count"),
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        head_dim=head_dim,
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=get("rope.freq_base", 10000.0),
        rope_scaling=scaling,
        max_position_embeddings=get("context_length", 4096),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_output.bias" in tensor_names,
        qkv_bias="blk.0.attn_q.bias" in tensor_names and "blk.0.attn_output.bias" not in tensor_names,
        sliding_window=window,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
    )
    try:  # ModelArgs checks every value (0 heads, NaN rope base, ...)
        if arch == "gemma3":
            return _gemma3_args(meta, common, get)
        if arch == "phi3":
            return _phi3_args(common, get, reader, n_heads)
        if arch == "gpt-oss":
            return _gpt_oss_args(common, get)
        if arch in ("qwen3moe", "qwen2moe", "olmoe") or (arch == "llama" and get("expert_count")):
            return _moe_args(arch, common, get)
        args = LlamaArgs(model_type=_MODEL_TYPES[arch], **common)
    except CorruptModelError as e:
        raise CorruptModelError(f"the GGUF metadata is invalid ({arch}: {e}); the file is corrupt, "
                                "download it again") from None
    if reader is not None:
        args.rope_freq_factors = rope_freq_factors(reader)
    return args


def _moe_args(arch: str, common: dict, get) -> MoeArgs:
    """A mixture of experts as llama.cpp reads it: every layer sparse; qwen3moe's and Mixtral's (a
    llama with experts) top k renormalized, qwen2moe's and OLMoE's not; qwen2moe's shared expert."""
    ff = get("expert_feed_forward_length") or common["intermediate_size"]
    if common["intermediate_size"] is None:
        common = {**common, "intermediate_size": ff}
    kind = {"qwen3moe": Qwen3MoeArgs, "qwen2moe": Qwen2MoeArgs, "olmoe": OlmoeArgs, "llama": MixtralArgs}[arch]
    extra = {"shared_expert_intermediate_size": get("expert_shared_feed_forward_length") or 0} if arch == "qwen2moe" else {}
    return kind(**common, num_experts=get("expert_count"), num_experts_per_tok=get("expert_used_count"),
                moe_intermediate_size=ff, norm_topk_prob=arch in ("qwen3moe", "llama"), **extra)


def _gpt_oss_args(common: dict, get) -> GptOssArgs:
    """gpt-oss as llama.cpp reads it: even layers slide (its swa pattern 2), odd ones see everything;
    experts of expert_feed_forward_length."""
    ff = get("expert_feed_forward_length") or common["intermediate_size"]
    common = {**common, "intermediate_size": common["intermediate_size"] or ff}
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(common["num_hidden_layers"])] \
        if isinstance(common["num_hidden_layers"], int) else None
    return GptOssArgs(**{**common, "attention_bias": True, "qkv_bias": False}, num_experts=get("expert_count"),
                      num_experts_per_tok=get("expert_used_count"), moe_intermediate_size=ff, layer_types=types)


def _gemma3_args(meta: dict, common: dict, get) -> LlamaArgs:
    """As llama.cpp reads gemma3: five local layers then one global, unless the file says otherwise."""
    n_layers, pattern = common["num_hidden_layers"], get("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):
        types = ["sliding_attention" if p else "full_attention" for p in pattern]
    else:
        types = ["sliding_attention" if pattern == 0 or i % pattern < pattern - 1 else "full_attention"
                 for i in range(n_layers)]
    # llama.cpp: the 27B (62 layers) scales queries by hidden/heads, the others by head_dim
    scalar = common["hidden_size"] // common["num_attention_heads"] if n_layers == 62 else common["head_dim"]
    return Gemma3Args(**{**common, "qk_norm": True}, layer_types=types, query_pre_attn_scalar=scalar,
                            rope_local_base_freq=get("rope.freq_base_swa", 10000.0),
                            final_logit_softcapping=get("final_logit_softcapping") or None)


def _phi3_args(common: dict, get, reader, n_heads: int) -> Phi3Args:
    """Phi-3's RoPE: rotary dims (Phi-4-mini turns 3/4 of each head) and LongRoPE factors as tensors."""
    rotary = get("rope.dimension_count") or common["head_dim"]
    orig = get("rope.scaling.original_context_length")
    scaling = None
    tables = {t.name: t for t in reader.tensors} if reader is not None else {}
    if "rope_factors_long.weight" in tables:
        scaling = {"rope_type": "longrope", "attention_factor": get("rope.scaling.attn_factor"),
                   "long_factor": dequantize(tables["rope_factors_long.weight"]).reshape(-1).tolist(),
                   "short_factor": dequantize(tables["rope_factors_short.weight"]).reshape(-1).tolist(),
                   "original_max_position_embeddings": orig}
    return Phi3Args(**{**common, "rope_scaling": scaling}, partial_rotary_factor=rotary / common["head_dim"],
                          original_max_position_embeddings=orig)


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None for unknown names."""
    m = _BLOCK.match(gguf_name)
    if m:
        layer, part, kind = m.groups()
        names = _LAYER_NAMES
        if arch == "gemma3":
            names = {**_LAYER_NAMES, **_GEMMA3_NAMES}
        elif arch == "phi3":  # ffn_up holds gate and up stacked, as HF's gate_up_proj
            names = {**_LAYER_NAMES, "ffn_up": "mlp.gate_up_proj"}
        elif arch == "gpt-oss":
            names = {**_LAYER_NAMES, **_GPT_OSS_NAMES}
            if part == "attn_sinks":  # a parameter of the attention, not a module's weight
                return f"model.layers.{layer}.self_attn.sinks" if kind == "weight" else None
        return f"model.layers.{layer}.{names[part]}.{kind}" if part in names else None
    base, _, kind = gguf_name.rpartition(".")
    return f"{_GLOBAL_NAMES[base]}.{kind}" if base in _GLOBAL_NAMES else None


def gguf_name(hf: str, arch: str = "llama") -> str | None:
    """The inverse of hf_name: `model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`;
    None for a name llama.cpp has no tensor for."""
    base, _, kind = hf.rpartition(".")
    for short, long in _GLOBAL_NAMES.items():
        if base == long:
            return f"{short}.{kind}"
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", base)
    if m is None:
        return None
    names = _LAYER_NAMES
    if arch == "gemma3":
        names = {**_LAYER_NAMES, **_GEMMA3_NAMES}
    elif arch == "phi3":
        names = {**_LAYER_NAMES, "ffn_up": "mlp.gate_up_proj"}
    elif arch == "gpt-oss":
        if hf.endswith(".self_attn.sinks"):
            return f"blk.{m.group(1)}.attn_sinks.weight"
        names = {**_LAYER_NAMES, **_GPT_OSS_NAMES}
    part = next((short for short, long in names.items() if long == m.group(2)), None)
    return None if part is None else f"blk.{m.group(1)}.{part}.{kind}"


def permuted(arch: str) -> bool:
    """Whether llama.cpp stores this architecture's Q and K rows interleaved (llama.cpp's permute)."""
    return arch in _PERMUTED_ARCHITECTURES


def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation: per head, interleaved rotary pairs -> two halves.

    Works on any tensor whose first dim is rows (float weights, biases, or packed quantized rows).
    """
    import torch

    rows = w.shape[0]
    if w.device.type == "cpu" and w.dtype != torch.bfloat16:  # numpy copies in one thread: torch's copy
        # waited on busy intra-op threads, most of a load on a loaded CPU
        a = w.numpy().reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2)
        return torch.from_numpy(np.ascontiguousarray(a).reshape(w.shape))
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


def tensor_values(t, arch: str) -> np.ndarray:
    """Float32 values in HF's convention: gemma3's converter stores its norm weights as 1 + w
    (llama.cpp multiplies by them), HF's Gemma3RMSNorm adds the 1 itself."""
    values = dequantize(t)
    if arch == "gemma3" and t.name.endswith("norm.weight"):
        values = values - 1.0
    return values


def rope_freq_factors(reader) -> tuple[float, ...] | None:
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            return tuple(float(x) for x in dequantize(t).reshape(-1))
    return None


def iter_tensors(reader, args: LlamaArgs, arch: str):
    """Yield (hf_name, reader_tensor, needs_unpermute_heads or None) for every model tensor."""
    for t in reader.tensors:
        if t.name in _ROPE_TENSORS:
            continue
        experts = _EXPERTS.match(t.name)
        if experts:
            layer, kind, what = experts.groups()
            yield from expert_tensors(t, layer, kind, args, what)
            continue
        name = hf_name(t.name, arch)
        if name is None:
            raise UnsupportedModelError(f"unexpected tensor {t.name} in the GGUF file; this variant is not supported")
        if name.endswith(".mlp.shared_expert_gate.weight"):  # llama.cpp's (hidden,): the HF Linear's (1, hidden)
            t = replace(t, shape=np.array([*t.shape.tolist(), 1][:2]))
        if name.endswith(".mlp.gate.weight"):
            check_router(t, args)
        heads = None
        if arch in _PERMUTED_ARCHITECTURES:
            if ".q_proj." in name:
                heads = args.num_attention_heads
            elif ".k_proj." in name:
                heads = args.num_key_value_heads
        yield name, t, heads


def check_router(t: TensorInfo, args) -> None:
    """CorruptModelError where a router's shape is not (experts, hidden) as the metadata says."""
    want = (getattr(args, "num_experts", None), args.hidden_size)
    if tensor_shape(t) != want:
        raise CorruptModelError(f"tensor {t.name} has shape {tensor_shape(t)}, but the metadata says {want}; "
                                "the file is corrupt, download it again")


def expert_tensors(t: TensorInfo, layer: str, kind: str, args, what: str = "weight"):
    """A 3-D tensor of every expert's matrix (or a 2-D one of every expert's bias, gpt-oss) ->
    (hf_name, that expert's matrix or bias as a tensor of its own, None) for each expert: the same
    bytes of the map, a slice of the rows. CorruptModelError where its shape disagrees with the metadata."""
    shape = tensor_shape(t)
    E, inter, hidden = getattr(args, "num_experts", None), getattr(args, "moe_intermediate_size", None), args.hidden_size
    N, K = (hidden, inter) if kind == "down" else (inter, hidden)
    want = (E, N, K) if what == "weight" else (E, N)
    if shape != want or t.n_bytes % E:
        raise CorruptModelError(f"tensor {t.name} has shape {shape}, but the metadata says {want}; "
                                "the file is corrupt, download it again")
    for e in range(E):
        part = replace(t, name=f"{t.name}[{e}]", shape=t.shape[:-1], n_elements=t.n_elements // E,
                       n_bytes=t.n_bytes // E, data_offset=t.data_offset + e * (t.n_bytes // E))
        yield f"model.layers.{layer}.mlp.experts.{e}.{kind}_proj.{what}", part, None


def load_state_dict(reader, args: LlamaArgs, arch: str, dtype: torch.dtype, device: torch.device) -> dict:
    """Dequantized weights under HF names, Q/K un-permuted, in `dtype` on `device`."""
    import torch

    state = {}
    for name, t, heads in iter_tensors(reader, args, arch):
        w = torch.from_numpy(tensor_values(t, arch))
        if heads is not None:
            w = unpermute_rows(w, heads)
        state[name] = w.to(device=device, dtype=dtype)
    return state
