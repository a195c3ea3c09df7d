"""The llmcli quantized checkpoint: a Hugging Face-style folder whose config says how it is packed.

    config.json              the model's config plus a `quantization` block: method "llmcli",
                             format_version, preset, the preset's activations (int8 where absent),
                             and every quantized tensor's {bits, group_size, symmetric}. Loading is
                             decided by this block, never by a file name.
    model.safetensors        quantized weights as <module>.qweight / .scales / .zeros in the portable
                             layout (packed.py), everything else under its usual name
    tokenizer files          tokenizer.json, tokenizer_config.json (chat template, BOS/EOS),
                             generation_config.json: copied, or written from a GGUF's tokenizer

Writing is atomic: everything goes to a hidden temporary folder next to the target, config.json
last, then one rename. A killed run leaves only that hidden, config-less folder.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..errors import CorruptModelError, LlmcliError, UnsupportedModelError
from ..formats.hf_folder import read_tensors
from ..hub.store import held_folder, release, remove_stale
from .convert import Converted, QuantizedTensor
from .presets import QuantSpec

FORMAT_VERSION = 1
METHOD = "llmcli"
WEIGHTS = "model.safetensors"
_PARTS = ("qweight", "scales", "zeros", "absmax")


class OutputExistsError(LlmcliError):
    exit_code = 2


def quantization_block(preset, converted: Converted, extra: dict | None = None) -> dict:
    return {"quant_method": METHOD, "format_version": FORMAT_VERSION, "preset": preset.name,
            "description": preset.description, "activations": preset.activations, "tensors": converted.formats(),
            **(extra or {})}


def tensors_to_save(converted: Converted) -> dict[str, torch.Tensor]:
    out = {}
    for name, q in converted.quantized.items():
        module = name.removesuffix(".weight")
        for part, t in q.state.items():
            out[f"{module}.{part}"] = t.contiguous()
    for name, t in converted.floats.items():
        out[name] = t.contiguous()
    return out


def _partial_folder(target: Path, force: bool):
    """(a new `.NAME.partial-*` folder beside `target`, held; its hold): `target` must not exist
    unless `force`, and a killed run's leftovers (partial folders no process holds) go first."""
    if target.exists() and not force:
        raise OutputExistsError(f"{target} already exists; pass --force to replace it or choose another -o")
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target.parent, f".{glob.escape(target.name)}.partial-*")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    return tmp, held_folder(tmp)


@contextlib.contextmanager
def atomic_folder(target: Path, force: bool = False):
    """Yield a temporary folder beside `target`; on success it replaces `target` in one rename.
    The folder is held while it is written: a `.NAME.partial-*` that no process holds is what a
    killed run left, and is removed before a new one starts."""
    target = target.expanduser()
    tmp, hold = _partial_folder(target, force)
    try:
        try:
            yield tmp
            _usual_permissions(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            target.rename(old)
        tmp.rename(target)
    finally:
        release(hold)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()


@contextlib.contextmanager
def atomic_file(target: Path, force: bool = False):
    """Yield a path to write in a held temporary folder beside `target` (atomic_folder's kind, so a
    killed run's leftovers are removed the same way); on success the file replaces `target` in one rename."""
    target = target.expanduser()
    if target.is_dir():
        raise OutputExistsError(f"{target} is a folder; -o takes the .gguf file to write")
    tmp, hold = _partial_folder(target, force)
    try:
        yield tmp / target.name
        _usual_permissions(tmp)
        os.replace(tmp / target.name, target)
    finally:
        release(hold)
        shutil.rmtree(tmp, ignore_errors=True)


def _usual_permissions(folder: Path) -> None:
    """mkdtemp (and safetensors) create owner-only entries; give them what the umask allows."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


def write(folder: Path, config: dict, converted: Converted, quantization: dict) -> None:
    """Weights, then config.json (last: its presence marks a complete folder)."""
    from safetensors.torch import save_file

    save_file(tensors_to_save(converted), str(folder / WEIGHTS), metadata={"format": "pt", "quantized_by": METHOD})
    config = {**config, "quantization": quantization}
    (folder / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def read(files: list[Path], quantization: dict) -> Converted:
    """Tensors of a checkpoint, memory-mapped: quantized ones grouped per weight, the rest as floats."""
    version = quantization.get("format_version")
    if quantization.get("quant_method") != METHOD:
        raise UnsupportedModelError("this folder is quantized in a format llmcli does not read (its config.json "
                                    "'quantization' block is another tool's, e.g. MLX's); use the original model")
    if version != FORMAT_VERSION:
        raise UnsupportedModelError(f"this checkpoint uses llmcli quantization format {version!r}; this llmcli reads "
                                    f"format {FORMAT_VERSION}: upgrade llmcli or quantize the original model again")
    specs = {name: QuantSpec.from_json(d) for name, d in quantization.get("tensors", {}).items()}
    modules = {name.removesuffix(".weight"): name for name in specs}
    parts: dict[str, dict[str, torch.Tensor]] = {name: {} for name in specs}
    out = Converted()
    for key, t in read_tensors(files, "quantize the model again"):
        module, _, part = key.rpartition(".")
        if part in _PARTS and module in modules:
            parts[modules[module]][part] = t
        else:
            out.floats[key] = t
    for name, spec in specs.items():
        state = parts[name]
        needed = {"qweight", "absmax"} if spec.kind == "nf4" else {"qweight", "scales"} | (
            {"zeros"} if spec.bits == 4 and not spec.symmetric else set())
        if not needed <= state.keys():
            raise CorruptModelError(f"{name} is listed as quantized but its tensors are missing; quantize the model again")
        out.quantized[name] = QuantizedTensor(spec, state)
    return out


# ------------------------------------------------------------------------------------ tokenizer

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                    "generation_config.json", "chat_template.jinja", "added_tokens.json", "vocab.json", "merges.txt")


def copy_tokenizer_files(source: Path, folder: Path) -> None:
    for name in _TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)


def write_tokenizer(tokenizer, chat_template: str | None, folder: Path) -> None:
    """A GGUF's tokenizer as Hugging Face files that `tokenizer.from_hf_folder` reads back the same."""
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    config = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token, "add_bos_token": tokenizer.add_bos,
              "add_eos_token": False, "clean_up_tokenization_spaces": False}
    if chat_template:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    generation = {"eos_token_id": sorted(tokenizer.eos_ids)}
    if tokenizer.bos_id is not None:
        generation["bos_token_id"] = tokenizer.bos_id
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
