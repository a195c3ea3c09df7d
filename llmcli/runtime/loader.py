"""A model file (formats/open.py's ModelFile) -> model + tokenizer + template, placed and quantized."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .. import models
from ..formats.info import runs_as
from ..formats.open import ModelFile, open_model_file
from ..quant import QUANTIZING, float_rows, pipeline, precision
from ..quant.gguf_import import as_stored_preset
from ..quant.held import activations_of, describe, hold_activations, model_formats
from .device import Placement
from .loaded import LoadedModel  # noqa: F401 (re-exported)
from .native_step import NativeStep


def load_model(source: ModelFile | str | Path, placement: Placement, preset=None, progress=None) -> LoadedModel:
    """Load weights in `placement.dtype` onto `placement.device`; `preset` (quant.presets.Preset)
    quantizes them at load. An llmcli quantized checkpoint folder loads as it was saved. `source`:
    an opened ModelFile, or a path to open. `progress(label, done, total)` hears about quantizing
    at load, in bytes of the file's weights (label: "quantizing (PRESET)")."""
    t0 = time.perf_counter()
    mf = source if isinstance(source, ModelFile) else open_model_file(source)
    activations = activations_of(mf, preset)  # (a checkpoint's unknown value is refused before loading)
    model, held = _build(mf, placement, preset, progress)
    hold_activations(model, activations)
    if preset is None and mf.is_gguf and mf.quantization is None:  # the native step's mask, as the lean path's
        model.refine_mask = precision.choose(mf.nbytes)
    stored = mf.weights_type
    weights_type = stored if preset is None else f"{preset.name} (from {stored})"
    words = runs_as(mf.format, stored, None if preset is None else preset.name)
    if held:
        weights_type, words = f"{weights_type} as {held}", f"{words}, held as {held}"
    metadata = {"name": mf.metadata.get("general.name"), "license": mf.license,
                "architecture": mf.architecture} if mf.is_gguf else {"architecture": mf.architecture}
    return LoadedModel(model, mf.tokenizer, mf.args, mf.chat_template, mf.path, mf.format, mf.nbytes, weights_type,
                       placement, time.perf_counter() - t0, metadata, words)


def _build(mf: ModelFile, placement: Placement, preset, progress=None) -> tuple[torch.nn.Module, str | None]:
    """The model, and what its weights are held as where that is not the file's own type ("Q4_1,
    Q8_0", "BF16 rows"; None: as stored, or in the compute dtype)."""
    args = mf.args
    if mf.quantization is not None:  # structural: the config says how it is packed
        if preset is not None:
            raise pipeline.AlreadyQuantizedError(
                f"{mf.path} is already quantized (preset {mf.quantization.get('preset')!r}); drop --quant")
        held = describe(model_formats(mf, None, placement.device).values())
        return pipeline.model_from_checkpoint(mf.files, mf.metadata, args, placement), held
    if preset is None and mf.keeps_blocks:
        # keep the file's quantized blocks packed (exact: quant/gguf_import.py); --quant f32 (or bf16) dequantizes
        sources = mf.sources()
        as_stored = as_stored_preset(sources, placement.device)
        if as_stored is not None:
            return pipeline.model_from_sources(sources, args, as_stored, placement), None
    if preset is None and NativeStep.holds_rows(mf, placement.device, placement.dtype, placement.dtype_asked):
        # the folder's matrices as F16/BF16 rows, its bf16/f16 bits as they are: no float32 copy of them
        model = pipeline.model_from_sources(mf.sources(), args, float_rows.rows_preset(mf.headers), placement)
        return model, f"{_rows_held(model)} rows"
    if preset is None:
        return models.build(args, mf.state_dict(placement.dtype, placement.device), placement.device), None
    # GGUF blocks the preset can use are taken as they are; the rest quantized or kept. Scales from
    # min/max at load, as llama.cpp's Q4_0/Q4_1/Q8_0 take them: the search takes ten times as long
    # (docs/quantize.md), too long for every start of a large model; `llmcli quantize` searches, once
    held = describe(model_formats(mf, preset, placement.device).values())
    label = f"{QUANTIZING} ({preset.name})"
    report = None if progress is None else (lambda done, total, name: progress(label, done, total))
    model = pipeline.model_from_sources(mf.sources(), args, preset, placement, search=False, progress=report)
    return model, held


def _rows_held(model: torch.nn.Module) -> str:
    """The kinds of rows a model's matrices are held in: "BF16", "F16", "F16/BF16"."""
    kinds = {getattr(m.packed, "type_name", None) for m in model.modules() if hasattr(m, "packed")}
    return "/".join(sorted(k for k in kinds if k))
