"""An unquantized safetensors folder held as stored on the CPU: each 2-D weight as GGUF F16 or BF16 rows
(gguf_blocks.py's FLOAT_ROWS), which the native kernels multiply with float32 activations, so a bf16
folder takes its files' size in memory, not twice that as float32 (runtime/loader.py, where the
native step decodes the folder).

    BF16 tensor  ->  BF16 rows, the file's bits
    F16 tensor   ->  F16 rows, the file's bits
    F32 tensor   ->  F16 rows (10 bits of mantissa to BF16's 7), or BF16 where a value is past F16's
                     range (|w| > 65504): decided per tensor as it is converted (to_rows)
"""

from __future__ import annotations

import torch

from .presets import Preset, QuantSpec, Rule

ROWS_OF = {"BF16": "BF16", "F16": "F16", "F32": "F16"}  # safetensors dtype -> the rows asked for
F16_MAX = 65504.0
EMBEDDING, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def rows_preset(headers: dict[str, dict]) -> Preset | None:
    """The preset that keeps every 2-D weight of a folder as rows, from its safetensors headers
    ({name: {"dtype", "shape"}}); None where some 2-D weight is of another dtype."""
    matrices = {name: h["dtype"] for name, h in headers.items() if len(h["shape"]) == 2}
    if not matrices or any(dtype not in ROWS_OF for dtype in matrices.values()):
        return None
    rules = [Rule((name,), (), _spec(ROWS_OF[dtype])) for name, dtype in matrices.items()]
    if EMBEDDING in matrices and HEAD not in matrices:  # a tied head is the embedding table: the same rows
        rules.append(Rule((HEAD,), (), _spec(ROWS_OF[matrices[EMBEDDING]])))
    return Preset("as-stored", rules, description="the folder's 16-bit weights as F16/BF16 rows")


def exact(headers: dict[str, dict]) -> bool:
    """Whether the rows hold the folder's matrices exactly (all stored in 16 bits)."""
    return all(h["dtype"] in ("BF16", "F16") for h in headers.values() if len(h["shape"]) == 2)


def label(headers: dict[str, dict]) -> str:
    """What the rows will be, for the memory plan: "BF16 rows", "F16 rows (BF16 past F16's range)"."""
    kinds = sorted({ROWS_OF.get(h["dtype"], "?") for h in headers.values() if len(h["shape"]) == 2})
    wide = any(h["dtype"] == "F32" for h in headers.values() if len(h["shape"]) == 2)
    return "/".join(kinds) + " rows" + (" (BF16 where past F16's range)" if wide else "")


def to_rows(w: torch.Tensor, kind: str) -> tuple[str, torch.Tensor]:
    """(N, K) floats -> (the kind they are held in, (N, 2K) uint8 rows): `kind`, but BF16 for F16
    where a value is beyond F16's range. Rounded to nearest even, as torch converts."""
    if kind == "F16" and w.abs().amax() > F16_MAX:
        kind = "BF16"
    rows = w.to(torch.float16 if kind == "F16" else torch.bfloat16).contiguous()
    return kind, rows.view(torch.uint8).reshape(w.shape[0], -1)


def _spec(kind: str) -> QuantSpec:
    return QuantSpec(16, 1, False, kind)
