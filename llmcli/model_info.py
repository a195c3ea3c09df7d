"""What a model on disk is, read from headers only (no weights loaded): for `llmcli show` and `list`.

    .gguf   metadata keys + tensor table (types and shapes)
    folder  config.json + each safetensors file's JSON header
"""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import gguf_file, hf_folder
from .errors import CorruptModelError, ModelNotFoundError, UnsupportedModelError


@dataclass
class ModelInfo:
    path: str
    format: str  # "gguf" | "safetensors"
    architecture: str | None = None
    parameters: int | None = None
    context_length: int | None = None
    quantization: str | None = None  # e.g. "Q4_1 (Q4_1 x 210, Q8_0 x 1, F32 x 61)" or "none (bfloat16)"
    chat_template: str | None = None
    license: str | None = None
    files: list[dict] = field(default_factory=list)  # [{"name", "size"}]

    @property
    def size(self) -> int:
        return sum(f["size"] for f in self.files)

    def as_dict(self) -> dict:
        return {**asdict(self), "size": self.size}


def inspect(path: Path) -> ModelInfo:
    path = Path(path)
    if path.is_dir():
        return _folder(path)
    if gguf_file.is_gguf(path):
        return _gguf(path)
    if not path.exists():
        raise ModelNotFoundError(f"{path} does not exist")
    raise UnsupportedModelError(f"{path} is neither a GGUF file nor a model folder")


def _gguf(path: Path) -> ModelInfo:
    from gguf import LlamaFileType

    reader = gguf_file.open_gguf(path)
    meta = gguf_file.read_metadata(reader)
    arch = meta.get("general.architecture")
    types = Counter(t.tensor_type.name for t in reader.tensors)
    try:
        kind = LlamaFileType(meta.get("general.file_type", -1)).name.removeprefix("MOSTLY_")
    except ValueError:
        kind = types.most_common(1)[0][0] if types else "unknown"
    mix = ", ".join(f"{t} x {n}" for t, n in types.most_common())
    return ModelInfo(
        path=str(path), format="gguf", architecture=arch,
        parameters=sum(int(t.n_elements) for t in reader.tensors),
        context_length=meta.get(f"{arch}.context_length"), quantization=f"{kind} ({mix})",
        chat_template=meta.get("tokenizer.chat_template"), license=meta.get("general.license"),
        files=[{"name": path.name, "size": path.stat().st_size}])


def _folder(path: Path) -> ModelInfo:
    config = hf_folder.read_config(path)
    weights = hf_folder.safetensors_files(path)
    params, dtypes = 0, Counter()
    for f in weights:
        for name, t in _safetensors_header(f).items():
            if name != "__metadata__":
                params += math.prod(t["shape"])
                dtypes[t["dtype"]] += 1
    quantized = config.get("quantization_config")
    quant = quantized.get("quant_method") if isinstance(quantized, dict) else None
    names = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
    plain = ", ".join(names.get(d, d) for d, _ in dtypes.most_common())
    files = sorted((p for p in path.iterdir() if p.is_file()), key=lambda p: p.name)
    return ModelInfo(
        path=str(path), format="safetensors", architecture=config.get("model_type"), parameters=params,
        context_length=config.get("max_position_embeddings"),
        quantization=quant or f"none ({plain})", chat_template=hf_folder.chat_template(path),
        files=[{"name": p.name, "size": p.stat().st_size} for p in files])


def _safetensors_header(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                raise ValueError("header too large")
            return json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:
        raise CorruptModelError(f"{path} is truncated or corrupt ({e}); download it again") from None
