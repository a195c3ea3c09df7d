"""Reading a Hugging Face model folder: `config.json`, safetensors shards, tokenizer files.

Only safetensors are loaded: pickled `.bin`/`.pt` checkpoints can run arbitrary code when opened,
so they are refused with a message saying how to get safetensors instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import json
import re
import struct
from pathlib import Path
from typing import Iterator


from ..errors import CorruptModelError, ModelNotFoundError, UnsupportedModelError
from ..models import SUPPORTED_ARCHITECTURES

if TYPE_CHECKING:
    import torch

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.exists():
        raise ModelNotFoundError(f"{folder} is not a model folder (no config.json); pass a folder with config.json "
                                 "and *.safetensors, or a .gguf file")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptModelError(f"{path} is not valid JSON ({e}); download the model again") from None
    if not isinstance(config, dict):
        raise CorruptModelError(f"{path} is not a JSON object (it holds a {type(config).__name__}); "
                                "download the model again")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"architecture {model_type!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    return config


def safetensors_files(folder: Path) -> list[Path]:
    """The weight shards, in index order when there is an index."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, KeyError, json.JSONDecodeError) as e:
            raise CorruptModelError(f"{index} is malformed ({e}); download the model again") from None
        files = [folder / name for name in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise CorruptModelError(f"{folder} is missing shards {', '.join(missing)}; download the model again")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise UnsupportedModelError(
            f"{folder} only has pickled weights ({pickled[0]}), which can run code when loaded; llmcli loads "
            "safetensors or GGUF only: use the repo's safetensors revision or convert it first")
    raise ModelNotFoundError(f"{folder} has no *.safetensors weights")


# checkpoint names -> the modules' (models/moe.py): Mixtral's experts are w1 (gate), w3 (up), w2 (down)
# under block_sparse_moe on the Hub
_RENAMES = [(re.compile(r"\.block_sparse_moe\.gate\."), ".mlp.gate."),
            (re.compile(r"\.block_sparse_moe\.experts\.(\d+)\.w1\."), r".mlp.experts.\1.gate_proj."),
            (re.compile(r"\.block_sparse_moe\.experts\.(\d+)\.w3\."), r".mlp.experts.\1.up_proj."),
            (re.compile(r"\.block_sparse_moe\.experts\.(\d+)\.w2\."), r".mlp.experts.\1.down_proj.")]


def module_name(name: str) -> str:
    """A checkpoint's tensor name as llmcli's modules name it (most are the same)."""
    if "block_sparse_moe" in name:
        for pattern, repl in _RENAMES:
            name = pattern.sub(repl, name)
    return name


def load_state_dict(files: list[Path], dtype: torch.dtype, device: torch.device) -> dict:
    """All tensors from the shards (memory-mapped), cast to `dtype` on `device`."""
    state = {}
    for name, t in read_tensors(files):
        if name.endswith("rotary_emb.inv_freq"):
            continue  # recomputed; older checkpoints stored it
        state[module_name(name)] = t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)
    return state


def weights_bytes(files: list[Path]) -> int:
    return sum(f.stat().st_size for f in files)


def chat_template(folder: Path) -> str | None:
    """The template from `chat_template.jinja` or `tokenizer_config.json` (the default one of several)."""
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        try:
            return jinja.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise CorruptModelError(f"{jinja} is not UTF-8 text (byte {e.start}); download the model again") from None
        except OSError as e:
            raise CorruptModelError(f"cannot read {jinja}: {e.strerror or e}") from None
    path = folder / "tokenizer_config.json"
    if not path.exists():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptModelError(f"{path} is not valid JSON ({e}); download the model again") from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if not isinstance(template, (str, list, type(None))):
        raise CorruptModelError(f"{path} has a chat_template that is not text; download the model again")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template


def read_header(path: Path) -> dict:
    """A safetensors file's JSON header: {name: {"dtype", "shape", "data_offsets"}, "__metadata__": ...}."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                raise ValueError("header too large")
            return json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:
        raise CorruptModelError(f"{path} is truncated or corrupt ({e}); download it again") from None


def read_tensors(files: list[Path], what_to_do: str = "download it again") -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the shards, memory-mapped, as stored."""
    from safetensors import SafetensorError, safe_open

    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for key in f.keys():
                    yield key, f.get_tensor(key)
        except (SafetensorError, OSError, ValueError) as e:
            raise CorruptModelError(f"{path} is truncated or corrupt ({e}); {what_to_do}") from None
