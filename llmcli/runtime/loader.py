"""A model file (formats/open.py's ModelFile) -> model + tokenizer + template, placed and quantized."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import models
from ..formats.info import runs_as
from ..formats.open import ModelFile, open_model_file
from ..formats.tokenizer import Tokenizer
from ..models.llama import ModelArgs  # the base of every family's ModelArgs
from ..quant import pipeline
from ..quant.gguf_import import as_stored_preset
from .device import Placement


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Tokenizer
    args: ModelArgs
    chat_template: str | None
    path: Path
    format: str  # "gguf" | "safetensors"
    weights_bytes: int  # size of the weights on disk
    weights_type: str  # e.g. "Q4_1", "bfloat16", "q4 (llmcli)", "bfloat16 safetensors quantized to q4 at load"
    placement: Placement
    load_seconds: float
    metadata: dict = field(default_factory=dict)  # e.g. general.name, license

    @property
    def name(self) -> str:
        return self.metadata.get("name") or self.path.name

    @property
    def runs_as(self) -> str:
        """The weights in words: "GGUF Q4_1", "bfloat16 safetensors quantized to q4 at load"."""
        return self.weights_type if self.weights_type.endswith(" at load") else runs_as(self.format, self.weights_type)


def load_model(source: ModelFile | str | Path, placement: Placement, preset=None) -> LoadedModel:
    """Load weights in `placement.dtype` onto `placement.device`; `preset` (quant.presets.Preset)
    quantizes them at load. An llmcli quantized checkpoint folder loads as it was saved. `source`:
    an opened ModelFile, or a path to open."""
    t0 = time.perf_counter()
    mf = source if isinstance(source, ModelFile) else open_model_file(source)
    model, weights_type = _build(mf, placement, preset)
    metadata = {"name": mf.metadata.get("general.name"), "license": mf.license,
                "architecture": mf.architecture} if mf.is_gguf else {"architecture": mf.architecture}
    return LoadedModel(model, mf.tokenizer, mf.args, mf.chat_template, mf.path, mf.format, mf.nbytes, weights_type,
                       placement, time.perf_counter() - t0, metadata)


def _build(mf: ModelFile, placement: Placement, preset) -> tuple[torch.nn.Module, str]:
    """The model, and how its weights are held ("Q4_1", "q4 (from bfloat16)", ...)."""
    args, stored = mf.args, mf.weights_type
    if mf.quantization is not None:  # structural: the config says how it is packed
        if preset is not None:
            raise pipeline.AlreadyQuantizedError(
                f"{mf.path} is already quantized (preset {mf.quantization.get('preset')!r}); drop --quant")
        return pipeline.model_from_checkpoint(mf.files, mf.metadata, args, placement), stored
    if preset is None and mf.is_gguf:
        # keep the file's quantized blocks packed (exact: quant/gguf_import.py); --quant f32 (or bf16) dequantizes
        sources = mf.sources()
        as_stored = as_stored_preset(sources, placement.device)
        if as_stored is not None:
            return pipeline.model_from_sources(sources, args, as_stored, placement), stored
    if preset is None:
        return models.build(args, mf.state_dict(placement.dtype, placement.device), placement.device), stored
    # GGUF blocks the preset can use are taken as they are; the rest quantized or kept
    return pipeline.model_from_sources(mf.sources(), args, preset, placement), runs_as(mf.format, stored, preset.name)
