"""What the memory planner needs to know before loading: the free memory, and the weights' size.

    detect_budget(device)        free bytes on the device (and in host memory for offloading):
                                 CUDA torch.cuda.mem_get_info, no more than this process's cap
                                 (torch.cuda.set_per_process_memory_fraction) leaves; MPS the recommended working set minus
                                 what the driver holds; CPU /proc/meminfo MemAvailable.
                                 LLMCLI_MEMORY_LIMIT (e.g. 2G, 500M, 1.5GiB) replaces the device figure.
    weights_from_files(model, preset, dtype, device)
                                 ModelArgs and the bytes the weights will take once loaded, read from
                                 the ModelFile's headers only: per tensor, the format the preset gives it as the
                                 device holds it (quant/held.py: GGUF blocks where the kernels multiply them; a
                                 GGUF's Q4_0/Q4_1/Q8_0/Q4_K/Q5_x/Q6_K blocks stay packed, at about the same size;
                                 an unquantized folder the native step decodes keeps its matrices as F16/BF16
                                 rows), or the compute dtype when nothing quantizes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..formats.open import ModelFile, open_model_file
from ..models import family
from ..quant import float_rows, kernels
from ..quant.gguf_blocks import row_bytes
from ..quant.gguf_import import as_stored_preset
from ..quant.held import describe, held_spec, model_formats
from .budget import MEMORY_LIMIT_ENV, Budget, cuda_free, detect_budget, host_available, parse_size  # noqa: F401 (re-exported)
from .native_step import NativeStep

# ------------------------------------------------------------------------------------ weights


@dataclass(frozen=True)
class WeightsInfo:
    args: object  # ModelArgs
    nbytes: int
    label: str  # e.g. "bfloat16 from Q4_1", "q4 from Q4_1"


def _int4_kernel_layout(device: torch.device, N: int, K: int, group: int, rows_needed: bool) -> bool:
    """Whether a (N, K) int4 weight takes a kernel's packed layout (scales and zeros (K/G, N, 2))."""
    if device.type == "cuda" and not torch.cuda.is_available():  # planning for a GPU not here
        return group in kernels.INT4_GROUP_SIZES and K % group == 0 and N % 8 == 0 and not rows_needed
    return kernels.int4_backend(device, N, K, group, rows_needed) != "portable"


def quantized_bytes(spec, shape: tuple[int, int], device: torch.device, rows_needed: bool = False) -> int:
    """Bytes of one (N, K) weight in a quantized format once packed for `device` (quant/packed.py):
    codes plus 16-bit scales (and zeros); the kernels' layouts always hold a zero per group, and
    group-wise int8 on the CPU rides the int4 kernel as two 4-bit halves with two scale sets."""
    N, K = shape
    if spec.blocks:  # GGUF blocks (or F16/BF16 rows) kept as they are (quant/gguf_blocks.py)
        return N * row_bytes(spec.kind, K)
    G = spec.group_size or K
    groups = N * (K // G)
    if spec.kind == "nf4":
        return N * K // 2 + groups * 4
    if spec.bits == 4:
        kernel = _int4_kernel_layout(device, N, K, G, rows_needed)
        return N * K // 2 + groups * 2 * (2 if kernel or not spec.symmetric else 1)
    if G < K and spec.kind == "int" and device.type == "cpu" and _int4_kernel_layout(device, N, 2 * K, G, True):
        return N * K + 8 * groups
    return N * K + groups * 2


def model_shapes(args) -> dict[str, tuple[int, ...]]:
    """The weights of a Llama-family model under Hugging Face names, from its arguments alone (for
    planning a model that is not downloaded)."""
    h, i, d, v = args.hidden_size, args.intermediate_size, args.head_dim, args.vocab_size
    q, kv = args.num_attention_heads * d, args.num_key_value_heads * d
    out = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not args.tie_word_embeddings:
        out["lm_head.weight"] = (v, h)
    qkv_bias = args.attention_bias or args.qkv_bias
    for n in range(args.num_hidden_layers):
        p = f"model.layers.{n}."
        if args.model_type == "phi3":  # stored fused
            out.update({p + "self_attn.qkv_proj.weight": (q + 2 * kv, h), p + "mlp.gate_up_proj.weight": (2 * i, h)})
        else:
            out.update({p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                        p + "self_attn.v_proj.weight": (kv, h), p + "mlp.gate_proj.weight": (i, h),
                        p + "mlp.up_proj.weight": (i, h)})
        out.update({p + "self_attn.o_proj.weight": (h, q), p + "mlp.down_proj.weight": (h, i),
                    p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        if args.norms_per_layer() == 4:  # gemma3: norms after attention and around the MLP
            out.update({p + "pre_feedforward_layernorm.weight": (h,), p + "post_feedforward_layernorm.weight": (h,)})
        if args.qk_norm:
            out.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
        if qkv_bias:
            out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                        p + "self_attn.v_proj.bias": (kv,)})
    return out


def weights_bytes(shapes: dict[str, tuple[int, ...]], args, preset, dtype: torch.dtype, device: torch.device,
                  source_types: dict[str, str] | None = None) -> int:
    """Bytes the weights take once loaded: quantized as `preset` says and held as the device holds that
    format (quant/held.py; `source_types`: GGUF types of the file's tensors), the rest in `dtype`."""
    # the RoPE tables (inv_freq, and gemma3's local or phi3's long one), float32
    total = sum(t.numel() * 4 for t in family(args.model_type).Transformer.rope_buffers(args).values())
    n_layers = args.num_hidden_layers
    for name, shape in shapes.items():
        if name == "lm_head.weight" and args.tie_word_embeddings:
            continue
        spec = preset.spec_for(name, shape, n_layers) if preset is not None else None
        if spec is not None and spec.quantized:
            spec = held_spec(spec, device, (source_types or {}).get(name))
            total += quantized_bytes(spec, shape, device, rows_needed=name == "model.embed_tokens.weight")
        else:
            total += math.prod(shape) * dtype.itemsize
    return total


def weights_from_files(model: ModelFile | Path, preset, dtype: torch.dtype, device: torch.device,
                       dtype_asked: bool = False) -> WeightsInfo:
    """The model's arguments and the bytes its weights take once loaded (`model`: a ModelFile, or a
    path to open). A GGUF's blocks stay packed unless a preset says otherwise, and so do a folder's
    16-bit rows where the native step decodes it (runtime/loader.py; `dtype_asked`: --dtype named
    the dtype)."""
    mf = model if isinstance(model, ModelFile) else open_model_file(model)
    args, name = mf.args, str(dtype).removeprefix("torch.")
    if mf.quantization is not None:  # an llmcli checkpoint: loaded as stored
        sizes = {"I8": 1, "U8": 1, "I32": 4}
        nbytes = sum(math.prod(t["shape"]) * sizes.get(t["dtype"], dtype.itemsize) for t in mf.headers.values())
        held = describe(model_formats(mf, None, device).values())
        return WeightsInfo(args, nbytes, f"{mf.quantization.get('preset')} (llmcli checkpoint) as {held}")
    shapes = mf.shapes()
    source = "/".join(sorted(mf.block_types())) if mf.is_gguf else mf.weights_type
    types = {s.name: s.gguf_type for s in mf.sources()} if mf.keeps_blocks else None
    if preset is None and NativeStep.holds_rows(mf, device, dtype, dtype_asked):  # the loader keeps 16-bit matrices as rows
        rows = float_rows.rows_preset(mf.headers)
        nbytes = weights_bytes(shapes, args, rows, dtype, device)
        return WeightsInfo(args, nbytes, f"{source} as {float_rows.label(mf.headers)}")
    if preset is None and mf.keeps_blocks:  # the loader keeps the quantized blocks packed
        stored = as_stored_preset(mf.sources(), device)
        if stored is not None:
            return WeightsInfo(args, weights_bytes(shapes, args, stored, dtype, device, types), f"{source} as stored")
    label = f"{preset.name if preset is not None else name} from {source}"
    if preset is not None and preset.quantizes:  # the format each weight is held in
        label += f" as {describe(model_formats(mf, preset, device).values())}"
    return WeightsInfo(args, weights_bytes(shapes, args, preset, dtype, device, types), label)
