"""The walker: put quantized modules into a model, by Hugging Face module name.

    install(model, quantized, ...)   swap nn.Linear / nn.Embedding modules for packed ones
    build(args, floats, quantized)   a model from converted tensors (loading, `--quant`)
    apply_preset(model, preset)      quantize a float model in memory (tests, experiments)

Modules keep their HF names (model.layers.3.self_attn.v_proj), nothing is fused.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import heap, models
from ..errors import CorruptModelError
from .bnb_formats import LLMInt8Weight, NF4Weight
from .convert import (EMBEDDING, HEAD, KEEP, ROUTERS, Converted, Progress, QuantizedTensor, Source, convert, plan,
                      quantize_source)
from .gguf_blocks import BLOCKS, GGUFBlockWeight
from .held import as_held, held_spec, quantized_as_held
from .modules import QuantEmbedding, QuantLinear, linear_class
from .packed import Int4Weight, Int8Weight
from .presets import Preset


def packed_weight(q: QuantizedTensor, device: torch.device, rows_needed: bool = False):
    if q.spec.kind in BLOCKS:
        return GGUFBlockWeight.from_blocks(q.stored["blocks"], q.spec.kind, device, q.heads)
    if q.spec.kind != "int":
        cls = NF4Weight if q.spec.kind == "nf4" else LLMInt8Weight
    else:
        cls = Int4Weight if q.spec.bits == 4 else Int8Weight
    return cls.from_state(q.state, device, rows_needed)


def install(model: nn.Module, quantized: dict[str, QuantizedTensor], biases: dict[str, torch.Tensor],
            device: torch.device, dtype: torch.dtype, tied: bool, own_biases: bool = False) -> None:
    """Replace each quantized weight's module, in the format it is held in on `device` (held.py);
    `biases` (by bias name) are taken from as used. `own_biases`: a module's existing bias is real
    (a loaded float model), not a skeleton's."""
    for weight_name, q in quantized.items():
        q = as_held(q, device)
        module_name = weight_name.removesuffix(".weight")
        try:
            current = model.get_submodule(module_name)
        except AttributeError:  # (a tensor of more experts, layers or modules than the config has)
            raise CorruptModelError(f"the weights do not match the config ({weight_name} has no place in the model); "
                                    "the download may be incomplete or the config wrong") from None
        if isinstance(current, nn.Embedding):
            packed = packed_weight(q, device, rows_needed=True)
            model.set_submodule(module_name, QuantEmbedding(packed, dtype))
            if tied:  # the output head reads the same packed table
                model.set_submodule(HEAD.removesuffix(".weight"), linear_class(q.spec)(packed))
        elif isinstance(current, nn.Linear):
            bias = biases.pop(f"{module_name}.bias", None)
            if bias is None and current.bias is not None:
                if not own_biases:
                    raise CorruptModelError(f"{module_name}.bias is missing; the checkpoint does not match the model")
                bias = current.bias.detach()
            bias = None if bias is None else bias.to(device=device, dtype=dtype)
            packed = packed_weight(q, device)
            shape = tuple(getattr(packed, "shape", ()))
            if shape and shape != (current.out_features, current.in_features):
                raise CorruptModelError(f"the weights do not match the config ({weight_name} is {shape[0]}x{shape[1]}, "
                                        f"the config says {current.out_features}x{current.in_features}); the download "
                                        "may be incomplete or the config wrong")
            model.set_submodule(module_name, linear_class(q.spec)(packed, bias))
        else:
            raise CorruptModelError(f"{weight_name} is quantized but {module_name} is a {type(current).__name__}; "
                                    "the checkpoint does not match the model")


def build(args, converted: Converted, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A ready model from converted tensors: quantized modules installed, float tensors adopted."""
    model = models.skeleton(args)
    floats = {k: v.to(device=device, dtype=dtype) for k, v in converted.floats.items()}
    install(model, converted.quantized, floats, device, dtype,
            args.tie_word_embeddings and EMBEDDING in converted.quantized)
    return _finish(model, args, floats, EMBEDDING in converted.quantized, device)


def build_from_sources(args, sources: list[Source], preset: Preset, device: torch.device, dtype: torch.dtype,
                       search: bool | str = True, progress: Progress | None = None) -> nn.Module:
    """build(convert(...)) one tensor at a time: each weight is packed for the device as soon as it
    is converted, so the portable copies of all weights never exist at once (peak memory at load).
    `progress(done, total, name)` hears about it after each tensor, in bytes of the source's weights."""
    specs = plan(sources, preset, args.num_hidden_layers, args.tie_word_embeddings)
    keep_dtype = {"float16": torch.float16, "float32": torch.float32}.get(preset.dtype, torch.bfloat16)
    model = models.skeleton(args)
    wanted = [s for s in sources if s.name in specs]
    # 1-D tensors (norms, biases) first: a quantized module takes its bias when it is installed
    floats = {s.name: s.values().to(device=device, dtype=torch.float32 if s.name.endswith(ROUTERS) else dtype)
              for s in wanted if len(s.shape) == 1}  # (a router's bias in float32, as its weight)
    quantized_embedding = False
    total, done = sum(s.nbytes for s in wanted), 0
    for i, s in enumerate(wanted):
        done += s.nbytes
        if len(s.shape) > 1:
            if i % 8 == 0:  # about once a layer: freed temporaries go back to the system (heap.py)
                heap.trim()
            quantized_embedding |= _take(model, s, specs[s.name], floats, keep_dtype, args, device, dtype, search)
        if progress:
            progress(done, total, s.name)
    return _finish(model, args, floats, quantized_embedding, device)


def _take(model, s: Source, spec, floats: dict, keep_dtype, args, device, dtype, search) -> bool:
    """Source tensor `s` (a matrix) into `model` as `spec` says; whether it quantized the embedding."""
    if spec == KEEP and s.name.endswith(ROUTERS):  # float32, as the file (or llama.cpp) holds it
        floats[s.name] = s.values().to(device=device, dtype=torch.float32)
        return False
    if spec == KEEP:  # rounded as a saved checkpoint would hold it, then to the compute dtype
        floats[s.name] = s.values().to(keep_dtype).to(device=device, dtype=dtype)
        return False
    held = held_spec(spec, device, s.gguf_type)
    q = None
    if held.kind == s.gguf_type:  # the file's own blocks are the held format: taken as they are
        spec = held
    elif search in (False, "minmax"):  # min/max scales: the native library writes the blocks directly
        q = quantized_as_held(s, held)
    install(model, {s.name: q or quantize_source(s, spec, search, portable=False)}, floats, device, dtype,
            args.tie_word_embeddings and s.name == EMBEDDING)
    return s.name == EMBEDDING


def _finish(model: nn.Module, args, floats: dict, quantized_embedding: bool, device: torch.device) -> nn.Module:
    """Adopt the float tensors, check nothing is missing, set up RoPE and a tied head."""
    tied = args.tie_word_embeddings
    if tied:
        floats.pop(HEAD, None)
    missing, unexpected = model.load_state_dict(floats, strict=False, assign=True)
    # a quantized module took its bias from `floats` when it was installed: it is not missing
    held = {f"{name}.bias" for name, m in model.named_modules() if isinstance(m, QuantLinear) and m.bias is not None}
    missing = [m for m in missing if m not in held and not (tied and m == HEAD)]
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise CorruptModelError(f"the weights do not match the config ({what}); the checkpoint may be incomplete")
    models.set_rope(model, args, device)
    if tied and not quantized_embedding:
        model.tie_weights()
    return model.eval().requires_grad_(False)


def apply_preset(model: nn.Module, preset: Preset, *, search: bool = True, dtype: torch.dtype | None = None) -> Converted:
    """Quantize a float model in place as `preset` says; returns what was done (formats, notes)."""
    args = model.args
    device = next(model.parameters()).device
    dtype = dtype or next(model.parameters()).dtype
    state = {k: v for k, v in model.state_dict().items()}
    sources = [Source(name, tuple(t.shape), lambda t=t: t.detach().float().cpu()) for name, t in state.items()]
    converted = convert(sources, preset, args.num_hidden_layers, args.tie_word_embeddings, search=search)
    install(model, converted.quantized, {}, device, dtype, args.tie_word_embeddings, own_biases=True)
    # tensors the preset keeps at 16 bits are rounded as a saved checkpoint would hold them
    with torch.no_grad():
        for name, t in converted.floats.items():
            if t.dim() == 2 and name in state:
                state[name].copy_(t.to(state[name].dtype))
    return converted
