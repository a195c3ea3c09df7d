"""A model on disk (a `.gguf` file or a Hugging Face folder) -> model + tokenizer + template."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import chat_template, gguf_file, hf_folder, models
from .device import Placement
from .errors import ModelNotFoundError, UnsupportedModelError
from .models.llama import ModelArgs  # the base of every family's ModelArgs
from .tokenizer import Tokenizer, from_gguf_metadata, from_hf_folder


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Tokenizer
    args: ModelArgs
    chat_template: str | None
    path: Path
    format: str  # "gguf" | "safetensors"
    weights_bytes: int  # size of the weights on disk
    weights_type: str  # e.g. "Q4_1", "bfloat16"
    placement: Placement
    load_seconds: float
    metadata: dict = field(default_factory=dict)  # e.g. general.name, license

    @property
    def name(self) -> str:
        return self.metadata.get("name") or self.path.name


def load_model(path: str | Path, placement: Placement, preset=None) -> LoadedModel:
    """Load weights in `placement.dtype` onto `placement.device`; `preset` (quant.presets.Preset)
    quantizes them at load. An llmcli quantized checkpoint folder loads as it was saved."""
    t0 = time.perf_counter()
    path = check_model_path(path)
    loaded = _load_folder(path, placement, preset) if path.is_dir() else _load_gguf(path, placement, preset)
    loaded.load_seconds = time.perf_counter() - t0
    return loaded


def check_model_path(path: str | Path) -> Path:
    """A model folder or a .gguf file, or the error that says what to pass instead."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelNotFoundError(f"{path} does not exist; pass a .gguf file or a model folder")
    if path.is_dir():
        return path
    if not path.is_file():  # a FIFO would block the first read, a device never end
        raise UnsupportedModelError(f"{path} is not a regular file (a FIFO or a device?); "
                                    "pass a .gguf file or a model folder")
    if gguf_file.is_gguf(path):
        return path
    if path.suffix == ".safetensors":
        raise UnsupportedModelError(f"{path} is a bare weights file; pass the folder that holds it with config.json")
    raise UnsupportedModelError(f"{path} is neither a GGUF file nor a model folder")


def _load_gguf(path: Path, placement: Placement, preset=None) -> LoadedModel:
    from gguf import LlamaFileType

    reader = gguf_file.open_gguf(path)
    meta = gguf_file.read_metadata(reader)
    names = {t.name for t in reader.tensors}
    args = gguf_file.model_args(meta, names, reader)
    tokenizer = from_gguf_metadata(meta)
    try:
        weights_type = LlamaFileType(meta.get("general.file_type", -1)).name.removeprefix("MOSTLY_")
    except ValueError:
        weights_type = "unknown"
    from .quant import convert, pipeline
    from .quant.gguf_import import as_stored_preset

    sources = convert.gguf_sources(reader, args, meta["general.architecture"])
    if preset is None and placement.keeps_blocks:
        # keep the file's quantized blocks packed (exact: quant/gguf_import.py); --dtype float32 is the full-precision mode
        preset = as_stored_preset(sources, placement.device)
    if preset is None:
        state = gguf_file.load_state_dict(reader, args, meta["general.architecture"], placement.dtype, placement.device)
        model = models.build(args, state, placement.device)
    else:  # GGUF blocks the preset can use are taken as they are; the rest quantized or kept
        model = pipeline.model_from_sources(sources, args, preset, placement)
        weights_type = weights_type if preset.name == "as-stored" else f"{preset.name} (from {weights_type})"
    template = meta.get("tokenizer.chat_template") or chat_template.fallback_template(
        meta["general.architecture"], {tokenizer.token_text(i) for i in tokenizer.special_ids})
    return LoadedModel(model, tokenizer, args, template, path, "gguf",
                       path.stat().st_size, weights_type, placement, 0.0,
                       {"name": meta.get("general.name"), "license": meta.get("general.license"),
                        "architecture": meta.get("general.architecture")})


def _load_folder(path: Path, placement: Placement, preset=None) -> LoadedModel:
    config = hf_folder.read_config(path)
    files = hf_folder.safetensors_files(path)
    args = models.args_from_hf_config(config)
    tokenizer = from_hf_folder(path, config)
    weights_type = str(config.get("torch_dtype", config.get("dtype", "?")))
    if "quantization" in config or preset is not None:  # structural: the config says how it is packed
        from .quant import convert, pipeline

        if "quantization" in config:
            if preset is not None:
                raise pipeline.AlreadyQuantizedError(
                    f"{path} is already quantized (preset {config['quantization'].get('preset')!r}); drop --quant")
            model = pipeline.model_from_checkpoint(files, config, args, placement)
            weights_type = f"{config['quantization'].get('preset')} (llmcli)"
        else:
            model = pipeline.model_from_sources(convert.folder_sources(files), args, preset, placement)
            weights_type = f"{preset.name} (from {weights_type})"
    else:
        state = hf_folder.load_state_dict(files, placement.dtype, placement.device)
        model = models.build(args, state, placement.device)
    return LoadedModel(model, tokenizer, args, hf_folder.chat_template(path), path, "safetensors",
                       hf_folder.weights_bytes(files), weights_type, placement, 0.0,
                       {"architecture": config.get("model_type")})
