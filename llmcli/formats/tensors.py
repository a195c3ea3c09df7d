"""A model file's tensors, read lazily one at a time under their Hugging Face names (formats/open.py
hands them out): converting or quantizing never holds the whole float model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from safetensors import SafetensorError, safe_open

from ..errors import CorruptModelError
from . import gguf as gguf_file
from . import hf_folder

if TYPE_CHECKING:
    import torch


@dataclass
class Source:
    """One tensor of the source model, under its Hugging Face name."""

    name: str
    shape: tuple[int, ...]
    values: Callable[[], torch.Tensor]  # float32 on the CPU, Q/K rows already un-permuted
    gguf_type: str | None = None  # the stored type by GGUF's names: "Q4_1" in a GGUF; "BF16", "F16", "F32" in a folder
    raw: Callable[[], np.ndarray] | None = None  # the stored bytes (or GGUF's F16 values), for a direct import
    heads: int | None = None  # rows to un-permute after a direct import (llama Q/K in GGUF)
    stored_bytes: int | None = None  # its size in the file (None: as float32)
    stored: Callable[[], torch.Tensor] | None = None  # in the file's own float dtype (folders): no float32 copy

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.stored_bytes if self.stored_bytes is not None else 4 * self.numel


def _expert_source(where: dict[str, Path], name: str, shape: tuple[int, ...], e: int, take, raw) -> Source:
    """One expert's matrix or bias of gpt-oss's 3-D tensors (hf_folder.expert_parts): float32 values,
    and an MXFP4 matrix's blocks in GGUF's layout (`raw`); `where`: each checkpoint tensor's shard
    (MXFP4 blocks and their scales may lie in two)."""
    def get(n: str):
        if n not in where:
            raise CorruptModelError(f"the checkpoint has no {n}; download the model again")
        with safe_open(str(where[n]), framework="pt", device="cpu") as g:
            return g.get_slice(n)[e]

    def values():
        return take(get).float()

    if raw is None:
        return Source(name, shape, values)
    return Source(name, shape, values, "MXFP4", lambda: raw(get), stored_bytes=shape[0] * shape[1] // 32 * 17)


_ITEMSIZE = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def gguf_sources(reader, args, arch: str) -> list[Source]:
    out = []
    for name, t, heads in gguf_file.iter_tensors(reader, args, arch):
        def values(t=t, heads=heads):
            import torch

            w = torch.from_numpy(gguf_file.tensor_values(t, arch))
            return (gguf_file.unpermute_rows(w, heads) if heads is not None else w).float()

        out.append(Source(name, gguf_file.tensor_shape(t), values, t.tensor_type.name, lambda t=t: t.data, heads,
                          int(t.n_bytes)))
    return out


_FLOATS = ("BF16", "F16", "F32")  # safetensors' names, which are GGUF's too


def folder_sources(files: list[Path]) -> list[Source]:
    out = []
    where = {k: path for path in files for k in hf_folder.read_header(path) if k != "__metadata__"}
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                slices = [(name, f.get_slice(name)) for name in f.keys()]
                names = [(name, tuple(t.get_shape()), t.get_dtype()) for name, t in slices]
        except (SafetensorError, OSError, ValueError) as e:
            raise CorruptModelError(f"{path} is truncated or corrupt ({e}); download it again") from None
        for name, shape, dtype in names:
            if name.endswith("rotary_emb.inv_freq"):
                continue
            parts = hf_folder.expert_parts(name, shape)
            if parts is not None:  # gpt-oss's 3-D experts: each expert's matrices, read one at a time
                out.extend(_expert_source(where, *part) for part in parts)
                continue

            def stored(path=path, name=name):
                with safe_open(str(path), framework="pt", device="cpu") as g:
                    return g.get_tensor(name)

            def raw(stored=stored):  # the bits as stored (16-bit rows kept as they are: quant/float_rows.py)
                import torch

                return stored().contiguous().view(torch.uint8).numpy()

            out.append(Source(hf_folder.module_name(name), shape, lambda stored=stored: stored().float(),
                              dtype if dtype in _FLOATS else None,
                              raw, stored_bytes=_ITEMSIZE.get(dtype, 4) * int(np.prod(shape)), stored=stored))
    return out
