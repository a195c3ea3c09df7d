"""How each weight is held once loaded: the one place that turns a format (a preset's, a checkpoint's,
a GGUF file's as stored) into what the device multiplies.

On a CPU where the native kernels multiply blocks with SIMD integer dot products (native.int8_dot()),
llmcli's group-wise formats of 32 are held as the GGUF blocks they are exactly, which the kernels and
the native decode step (runtime/native_step.py) multiply as llama.cpp does, with int8 activations:

    int4 g32, zero point   w = (q - 8) * s + z   ->  Q4_1  d = s, m = z - 8s (f16)
    int4 g32, symmetric    w = (q - 8) * s       ->  Q4_0  d = s (f16)
    int8 g32               w = q * s             ->  Q8_0  d = s (f16)

A preset's `activations` says what the kernels multiply its blocks with: "int8" (llama.cpp's), or
"int8x2" (q8, q4_mixed): each activation row as 16-bit codes in two int8 rows, about 15 bits, for
twice the integer work (memory-bound decoding barely notices it). The loader marks the model and its
blocks (hold_activations); a checkpoint records it. GGUF files as stored keep llama.cpp's int8.

The codes stay as they are; only the scales (and Q4_1's m) are rounded, from bfloat16 to float16
(a bfloat16 scale in float16's normal range is exact). A GGUF tensor whose own blocks import into
the format exactly (gguf_import.direct_spec: Q4_0, Q4_1, Q4_K, Q8_0) keeps those blocks, unrounded.
Other group sizes (q4_g128: 128, 64) keep llmcli's own layout for torch's int4 kernel: as Q4_1 they
would take 5 bits a weight where the preset asks for 4.25. On other CPUs (the portable kernels, no
compiler), CUDA and MPS, every format keeps its torch kernels.
"""

from __future__ import annotations

from collections import Counter

import torch

from .. import native
from ..errors import CorruptModelError
from . import float_rows, precision
from .convert import EMBEDDING, HEAD, KEEP, QuantizedTensor, plan
from .gguf_blocks import BITS, BLOCKS, FROM_LLMCLI, INT8_DOT_BLOCKS, TYPE_IDS, GGUFBlockWeight
from .gguf_encode import to_blocks
from .gguf_import import as_stored_preset, direct_spec
from .presets import ACTIVATIONS, QuantSpec

F16_MAX = 65504.0
TO_BLOCKS = frozenset(FROM_LLMCLI.values())  # the blocks quantized_as_held writes: Q4_1, Q4_0, Q8_0


def held_spec(spec: QuantSpec, device: torch.device, source_type: str | None = None) -> QuantSpec:
    """The format a weight that `spec` describes is held in on `device`: a GGUF block type where the
    kernels multiply blocks with integer dot products (the table at the top), else `spec` itself.
    `source_type`: the weight's GGUF type in the file it comes from (its blocks are kept where they
    are the format exactly)."""
    if spec.kind != "int" or device.type != "cpu" or not native.int8_dot():
        return spec
    if source_type in INT8_DOT_BLOCKS and direct_spec(source_type, spec):
        return QuantSpec(BITS[source_type], BLOCKS[source_type][0], False, source_type)
    block = FROM_LLMCLI.get((spec.bits, spec.group_size, spec.symmetric))
    return spec if block is None else QuantSpec(spec.bits, spec.group_size, spec.symmetric, block)


def as_held(q: QuantizedTensor, device: torch.device) -> QuantizedTensor:
    """`q` in the format held_spec picks for `device` (converted to blocks, vectorised), or `q`."""
    held = held_spec(q.spec, device)
    if held is q.spec or "blocks" in q.stored:
        return q
    state = q.state
    scales, zeros = state["scales"], state.get("zeros")
    offset = None if zeros is None else zeros.float() - 8 * scales.float()  # Q4_1's m, the value at q = 0
    if scales.float().abs().max() > F16_MAX or (offset is not None and offset.abs().max() > F16_MAX):
        return q  # beyond float16: kept in llmcli's layout (no real weight comes near)
    if "codes" in state:
        codes, packed = state["codes"], False
    else:
        codes, packed = state["qweight"], held.bits == 4
    return QuantizedTensor(held, {"blocks": to_blocks(codes, scales, offset, held.kind, packed)}, q.direct)


def quantized_as_held(source, held: QuantSpec) -> QuantizedTensor | None:
    """A source tensor (formats/tensors.Source, a matrix) quantized with min/max scales straight into
    the blocks `held` names (Q8_0, Q4_1, Q4_0), by the native library from the file's own floats
    (bfloat16 rows stay bfloat16: no float32 copy), the same bytes as quantize(search=False) then
    as_held. None where the library cannot (no library, another format, a scale past float16)."""
    kernels = native.module()
    if kernels is None or held.kind not in TO_BLOCKS or len(source.shape) != 2 or source.shape[1] % 32:
        return None
    blocks = kernels.quantize_weights((source.stored or source.values)(), TYPE_IDS[held.kind])
    return None if blocks is None else QuantizedTensor(held, {"blocks": blocks})


def activations_of(model_file, preset) -> str:
    """The activations (presets.ACTIVATIONS) the kernels take for `model_file` loaded with `preset`:
    the preset's, an llmcli checkpoint's own (int8 where it predates the key), a GGUF file's by its
    size (int8x2 where precision.choose refines any: the eager path's products; the native step
    reads the mask itself, runtime/loader.py's refine_mask), else int8."""
    if preset is not None:
        return preset.activations
    if model_file.quantization is None:  # a GGUF file as stored: as the torch-free step takes it (precision.py)
        return "int8x2" if model_file.is_gguf and precision.choose(model_file.nbytes) else "int8"
    chosen = model_file.quantization.get("activations", "int8")
    if chosen not in ACTIVATIONS:
        raise CorruptModelError(f"{model_file.path}: its quantization block asks for {chosen!r} activations, "
                                f"which this llmcli does not know ({', '.join(ACTIVATIONS)}); update llmcli")
    return chosen


def hold_activations(model: torch.nn.Module, activations: str) -> None:
    """Mark `model` (model.activations: the native step reads it) and its GGUF blocks (the eager
    path's native.mm) with the activations the kernels multiply them with."""
    model.activations = activations
    for m in model.modules():
        packed = getattr(m, "packed", None)
        if isinstance(packed, GGUFBlockWeight):
            packed.refined = activations == "int8x2"


# ----------------------------------------------------------------------------------- a model file


def model_formats(model_file, preset, device: torch.device) -> dict[str, QuantSpec]:
    """Every matrix of `model_file` (HF names; a tied output head is the embedding's entry) in the
    format it is held in once loaded on `device` with `preset` (None: as stored), read from headers."""
    if model_file.quantization is not None:  # an llmcli checkpoint: its block lists each quantized weight
        tensors = model_file.quantization.get("tensors", {})
        specs = {name: QuantSpec.from_json(d) for name, d in tensors.items()}
        modules = {name.removesuffix(".weight") for name in specs}
        floats = {name: KEEP for name, h in model_file.headers.items()
                  if len(h["shape"]) == 2 and name.rpartition(".")[0] not in modules}
        return {name: held_spec(spec, device) for name, spec in {**floats, **specs}.items()}
    sources = model_file.sources()
    args = model_file.args
    if preset is None and model_file.keeps_blocks:
        preset = as_stored_preset(sources, device)
    elif preset is None and device.type == "cpu" and native.available():  # an unquantized folder: rows
        preset = float_rows.rows_preset(model_file.headers)
    matrices = [s for s in sources if len(s.shape) == 2]
    if preset is None:
        specs = {s.name: KEEP for s in matrices}
        if args.tie_word_embeddings:
            specs.pop(HEAD, None)
    else:
        specs = plan(matrices, preset, args.num_hidden_layers, args.tie_word_embeddings)
    types = {s.name: s.gguf_type for s in matrices}
    return {name: held_spec(spec, device, types.get(name)) for name, spec in specs.items()}


def describe(specs) -> str:
    """'Q4_1, Q8_0' or 'int4_g128, Q8_0, float': the formats of some weights, the most common first."""
    return ", ".join(name for name, _ in Counter(s.name() for s in specs).most_common())


ROUTER = (".mlp.gate.weight", ".mlp.shared_expert_gate.weight")  # a mixture of experts' routers: read as float32


def step_multiplies(formats: dict[str, QuantSpec], tied: bool, step_types) -> bool:
    """Whether every matrix the native step multiplies (all but an untied embedding, which it only
    looks rows up in, and a router, which it reads as float32) is held as one of `step_types`."""
    return bool(formats) and all(spec.kind in step_types for name, spec in formats.items()
                                 if (name != EMBEDDING or tied) and not name.endswith(ROUTER))
