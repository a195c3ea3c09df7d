"""A model's tensors -> the formats a preset asks for, one tensor at a time.

Sources are read lazily (a memory-mapped GGUF file or safetensors shards), so converting never holds
the whole float model (formats/tensors.py). GGUF tensors already in a block format the preset wants (Q4_0, Q4_1, Q4_K -> int4
g32; Q8_0 -> int8 g32; Q5_x, Q6_K kept as blocks) are imported as they are (gguf_import.py); everything else is dequantized to
float32 and quantized per the preset. The result is portable (CPU tensors, no device layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from ..formats.gguf import unpermute_rows
from ..formats.tensors import Source
from .bnb_formats import pack_nf4, quantize_nf4
from .float_rows import to_rows
from .gguf_import import direct_spec, import_block_quants
from .presets import KEEP, ROW_KINDS, Preset, QuantSpec
from .primitives import SCALE_DTYPE, pack_int4, quantize

EMBEDDING, HEAD = "model.embed_tokens.weight", "lm_head.weight"
# a mixture of experts' routers and shared-expert gates: kept in float32 whatever the preset (llama.cpp
# keeps ffn_gate_inp F32: a rounded router picks other experts where scores are close)
ROUTERS = (".mlp.gate.weight", ".mlp.gate.bias", ".mlp.shared_expert_gate.weight")  # (gpt-oss: a bias)
Progress = Callable[[int, int, str], None]  # (elements done, elements in all, tensor name)


@dataclass
class QuantizedTensor:
    spec: QuantSpec
    stored: dict[str, torch.Tensor]  # portable: qweight, scales (and zeros); or GGUF "blocks"
    direct: bool = False  # imported from GGUF blocks without re-quantizing
    # GGUF blocks in llama.cpp's Q/K row order (its heads): `state` un-permutes them on first use, and
    # the native step interleaves them from the file in HF order (no copy of them in between)
    heads: int | None = None

    @property
    def state(self) -> dict[str, torch.Tensor]:
        if self.heads is not None:
            self.stored = {"blocks": unpermute_rows(self.stored["blocks"], self.heads).contiguous()}
            self.heads = None
        return self.stored

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.stored.values())


@dataclass
class Converted:
    floats: dict[str, torch.Tensor] = field(default_factory=dict)  # kept in floating point
    quantized: dict[str, QuantizedTensor] = field(default_factory=dict)  # by weight name
    notes: list[str] = field(default_factory=list)  # group-size fallbacks, for the user

    def formats(self) -> dict[str, dict]:
        return {name: q.spec.as_json() for name, q in self.quantized.items()}

    @property
    def nbytes(self) -> int:
        return (sum(q.nbytes for q in self.quantized.values())
                + sum(t.numel() * t.element_size() for t in self.floats.values()))


def stronger(a: QuantSpec, b: QuantSpec) -> QuantSpec:
    """The more precise of two formats (more bits, then smaller groups)."""
    def key(s: QuantSpec):
        return (s.bits, s.kind == "int", -(s.group_size or 1 << 30), not s.symmetric)
    return max(a, b, key=key)


def plan(sources: list[Source], preset: Preset, n_layers: int, tied: bool) -> dict[str, QuantSpec]:
    """Each source tensor's format. A tied embedding is also the output head: it takes the more
    precise of the two rules."""
    specs = {s.name: KEEP if s.name.endswith(ROUTERS) else preset.spec_for(s.name, s.shape, n_layers)
             for s in sources}
    if tied and EMBEDDING in specs:
        shape = next(s.shape for s in sources if s.name == EMBEDDING)
        specs[EMBEDDING] = stronger(specs[EMBEDDING], preset.spec_for(HEAD, shape, n_layers))
        specs.pop(HEAD, None)
    return specs


def convert(sources: list[Source], preset: Preset, n_layers: int, tied: bool, *, search: bool = True,
            progress: Progress | None = None) -> Converted:
    """Quantize (or import) every source tensor as the preset says."""
    specs = plan(sources, preset, n_layers, tied)
    out = Converted(notes=list(dict.fromkeys(preset.notes)))
    keep_dtype = {"float16": torch.float16, "float32": torch.float32}.get(preset.dtype, torch.bfloat16)
    total, done = sum(s.numel for s in sources if s.name in specs), 0
    for s in sources:
        if s.name not in specs:  # the tied head: the embedding is the same tensor
            continue
        spec = specs[s.name]
        if spec == KEEP:
            w = s.values()
            out.floats[s.name] = w.to(keep_dtype) if w.dim() == 2 and not s.name.endswith(ROUTERS) else w.float()
        else:
            out.quantized[s.name] = quantize_source(s, spec, search)
        done += s.numel
        if progress:
            progress(done, total, s.name)
    return out


def quantize_source(s: Source, spec: QuantSpec, search: bool = True, portable: bool = True) -> QuantizedTensor:
    """`portable=False`: 4-bit codes stay unpacked ("codes"), for packing straight into a device
    layout (loading); the portable form ("qweight") is what checkpoints hold."""
    N, K = s.shape
    if s.gguf_type and s.raw is not None and direct_spec(s.gguf_type, spec):
        imported = import_block_quants(s.raw(), s.gguf_type, N, K, spec)
        if "blocks" in imported:  # kept as GGUF blocks (the file's): rows are independent, un-permuted when used
            return QuantizedTensor(spec, {"blocks": imported["blocks"]}, direct=True, heads=s.heads)
        codes, scales, zeros = imported["codes"], imported["scales"], imported["zeros"]
        if s.heads is not None:
            codes, scales = unpermute_rows(codes, s.heads), unpermute_rows(scales, s.heads)
            zeros = None if zeros is None else unpermute_rows(zeros, s.heads)
        return QuantizedTensor(spec, _portable(codes, scales, zeros, spec.bits, portable), direct=True)
    if spec.kind in ROW_KINDS:  # 16-bit rows of floats stored wider (an f32 folder): F16, or BF16 past its range
        kind, rows = to_rows(s.values(), spec.kind)
        return QuantizedTensor(replace(spec, kind=kind), {"blocks": rows})
    if spec.kind == "nf4":
        codes, absmax = quantize_nf4(s.values(), spec.group_size)
        return QuantizedTensor(spec, {"qweight": pack_nf4(codes), "absmax": absmax})
    q = quantize((s.stored or s.values)(), spec.bits, spec.group_size or K, spec.symmetric, search)
    return QuantizedTensor(spec, _portable(q.codes, q.scales, q.zeros, spec.bits, portable))


def _portable(codes, scales, zeros, bits: int, pack: bool = True) -> dict[str, torch.Tensor]:
    if bits == 4:
        state = {"qweight": pack_int4(codes)} if pack else {"codes": codes}
    else:
        state = {"qweight": codes.to(torch.int8).contiguous()}
    state["scales"] = scales.to(SCALE_DTYPE).contiguous()
    if zeros is not None:
        state["zeros"] = zeros.to(SCALE_DTYPE).contiguous()
    return state
