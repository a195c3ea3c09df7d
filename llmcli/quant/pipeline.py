"""Quantizing a model on disk: into a checkpoint folder (`llmcli quantize`), or at load (`--quant`).

    quantize_to_folder(source, preset, out)   convert a located model and write a checkpoint
    cached_quantized(source, preset, cache)   the same, once, into a cache (for tags such as
                                              `smollm2:135m-q4`); later calls return the folder
    model_from_sources(...)                   build a quantized model in memory (loader, `--quant`)
    model_from_checkpoint(...)                build one from a checkpoint folder (loader)
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import UnsupportedModelError
from ..formats.open import ModelFile, open_model_file
from ..formats.tensors import Source
from . import checkpoint
from .convert import Converted, Progress, convert
from .model import build, build_from_sources
from .presets import Preset, load_preset


class AlreadyQuantizedError(UnsupportedModelError):
    exit_code = 2


@dataclass
class SourceModel:
    path: Path
    args: object  # ModelArgs
    sources: list[Source]
    config: dict  # the config.json to write (the folder's own, or one made from GGUF metadata)
    nbytes: int  # weights on disk
    write_tokenizer: Callable[[Path], None]
    extra: dict = field(default_factory=dict)  # stored in the quantization block


@dataclass
class Summary:
    source: Path
    output: Path
    preset: str
    source_bytes: int
    output_bytes: int
    parameters: int
    bits_per_weight: float
    seconds: float
    quantized_tensors: int
    imported_tensors: int  # taken from GGUF blocks as they are
    notes: list[str]
    format: str = "llmcli"  # "llmcli" (a checkpoint folder) | "gguf"
    tensor_types: dict[str, int] | None = None  # gguf: how many tensors of each GGUF type

    def as_dict(self) -> dict:
        return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()}


def hf_config(args) -> dict:
    """A config.json that `ModelArgs.from_hf_config` reads back to the same arguments."""
    d = {k: v for k, v in dataclasses.asdict(args).items() if k != "rope_freq_factors" and v is not None}
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
    d["architectures"] = [arch.get(args.model_type, "LlamaForCausalLM")]
    if args.model_type == "qwen2" and args.sliding_window:
        d["use_sliding_window"] = True
    return d


def check_quantizable(mf: ModelFile) -> None:
    """An embedding model or an llmcli checkpoint is refused, in one line."""
    if mf.is_encoder:  # its checkpoint would lose the sentence-transformers files, and its loader is another
        raise UnsupportedModelError(f"{mf.path} is an embedding model ({mf.architecture}); llmcli quantizes "
                                    "text-generation models only: embed with it as it is")
    if not mf.is_gguf:
        if mf.quantization is not None:
            raise AlreadyQuantizedError(f"{mf.path} is already quantized (preset {mf.quantization.get('preset')!r}); "
                                        "quantize the original model instead")


def open_source(model: ModelFile | Path) -> SourceModel:
    """A model on disk (a ModelFile, or a path to open) as lazily read source tensors."""
    mf = model if isinstance(model, ModelFile) else open_model_file(model)
    check_quantizable(mf)
    if not mf.is_gguf:
        return SourceModel(mf.path, mf.args, mf.sources(), mf.metadata, mf.nbytes,
                           lambda out: checkpoint.copy_tokenizer_files(mf.path, out))
    args, tokenizer = mf.args, mf.tokenizer
    config = hf_config(args)
    if tokenizer.bos_id is not None:
        config["bos_token_id"] = tokenizer.bos_id
    config["eos_token_id"] = sorted(tokenizer.eos_ids)
    extra = {"rope_freq_factors": list(args.rope_freq_factors)} if args.rope_freq_factors else {}
    template = mf.stored_chat_template
    return SourceModel(mf.path, args, mf.sources(), config, mf.nbytes,
                       lambda out: checkpoint.write_tokenizer(tokenizer, template, out), extra)


def _source_stamp(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "bytes": st.st_size, "mtime": int(st.st_mtime)}


def quantize_to_folder(source: Path, preset: Preset | str, out: Path, *, force: bool = False, search: bool = True,
                       progress: Progress | None = None) -> Summary:
    """Convert `source` with `preset` and write a checkpoint folder at `out` (atomically)."""
    t0 = time.perf_counter()
    preset = load_preset(preset) if isinstance(preset, (str, Path)) else preset
    out, source = Path(out).expanduser(), Path(source).expanduser()
    if out.exists() and not force:
        raise checkpoint.OutputExistsError(f"{out} already exists; pass --force to replace it or choose another -o")
    if source.exists() and (out.resolve() == source.resolve() or out.resolve() in source.resolve().parents):
        raise checkpoint.OutputExistsError(f"{out} would overwrite the source model; choose another -o")
    src = open_source(source)
    args = src.args
    converted = convert(src.sources, preset, args.num_hidden_layers, args.tie_word_embeddings, search=search,
                        progress=progress)
    block = checkpoint.quantization_block(preset, converted, {**src.extra, "source": _source_stamp(source)})
    with checkpoint.atomic_folder(out, force) as tmp:
        src.write_tokenizer(tmp)
        checkpoint.write(tmp, src.config, converted, block)
    params = sum(s.numel for s in src.sources if not (args.tie_word_embeddings and s.name == "lm_head.weight"))
    return Summary(source, out, preset.name, src.nbytes, sum(f.stat().st_size for f in out.glob("*.safetensors")),
                   params, 8 * converted.nbytes / max(1, params), time.perf_counter() - t0,
                   len(converted.quantized), sum(q.direct for q in converted.quantized.values()), converted.notes)


def cached_quantized(source: Path, preset: Preset | str, cache_dir: Path, progress: Progress | None = None) -> Path:
    """`source` quantized with `preset` under `cache_dir`, converted on first use (under a lock) and
    again when the source file changes. For registry tags that name a quantized variant."""
    from filelock import FileLock

    preset = load_preset(preset) if isinstance(preset, (str, Path)) else preset
    source = Path(source).expanduser()
    target = Path(cache_dir).expanduser() / f"{source.stem}-{preset.name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _cache_current(target, source, preset):
            return target
        quantize_to_folder(source, preset, target, force=True, progress=progress)
    return target


def _cache_current(target: Path, source: Path, preset: Preset) -> bool:
    try:
        block = json.loads((target / "config.json").read_text(encoding="utf-8"))["quantization"]
    except (OSError, KeyError, ValueError):
        return False
    return block.get("preset") == preset.name and block.get("source") == _source_stamp(source) \
        and block.get("format_version") == checkpoint.FORMAT_VERSION \
        and block.get("activations", "int8") == preset.activations


def model_from_sources(sources: list[Source], args, preset: Preset, placement, search: bool | str = True,
                       progress: Progress | None = None):
    """A model quantized at load (`--quant`, or a GGUF's own blocks), one tensor at a time."""
    return build_from_sources(args, sources, preset, placement.device, placement.dtype, search, progress)


def model_from_checkpoint(files: list[Path], config: dict, args, placement):
    """A model from an llmcli checkpoint folder: nothing is re-quantized, only repacked for the device."""
    block = config["quantization"]
    if block.get("rope_freq_factors"):
        args.rope_freq_factors = tuple(block["rope_freq_factors"])
    converted: Converted = checkpoint.read(files, block)
    return build(args, converted, placement.device, placement.dtype)
