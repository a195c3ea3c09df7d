"""GGUF blocks of 32 read straight into llmcli's formats, without dequantizing and re-quantizing.

    Q4_0   [d: f16][16 bytes]          w = d * (q - 8)    -> int4 g32, scale d, zero 0
    Q4_1   [d: f16][m: f16][16 bytes]  w = d * q + m      -> int4 g32, scale d, zero m + 8d
    Q8_0   [d: f16][32 x int8]         w = d * q          -> int8 g32, scale d
    Q4_K   256 per block: [d][dmin: f16][12 bytes: 6-bit sc, m per 32][128 bytes]
           w = d*sc * q - dmin*m per 32   -> int4 g32, scale d*sc, zero 8*d*sc - dmin*m

    MXFP4  [e: e8m0][16 bytes]         w = e2m1(q) * 2^(e-127) -> int8 g32, codes 2*e2m1(q) (-12..12),
           (gpt-oss's experts)                                      scale 2^(e-128): exactly

In a 4-bit block, byte j holds element j in its low nibble and element j + 16 in its high nibble
(Q4_K: per 64 elements, byte l holds element l low and element l + 32 high). The codes are kept as
they are; only the scales are rounded (to bfloat16, what the kernels read). The 5- and 6-bit types
(Q5_0, Q5_1, Q5_K, Q6_K) do not fit 4-bit codes: they stay GGUF blocks (gguf_blocks.py).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import native
from .gguf_blocks import BITS, BLOCKS, FLOAT_ROWS, INT8_DOT_BLOCKS, MXFP4_VALUES, _k_scales, _nibble_pairs
from .presets import Preset, QuantSpec, Rule

BLOCK = 32
MXFP4_CODES = MXFP4_VALUES  # ggml's kvalues_mxfp4


def direct_spec(type_name: str, spec: QuantSpec) -> bool:
    """Whether a tensor of this GGUF type imports into `spec` exactly (codes unchanged)."""
    if spec.kind == type_name:  # kept as its blocks
        return type_name in BLOCKS
    if type_name in BLOCKS and type_name not in INT8_DOT_BLOCKS:
        return False
    if spec.group_size != BLOCK or spec.kind != "int":
        return False
    if type_name == "Q4_0":
        return spec.bits == 4
    if type_name in ("Q4_1", "Q4_K"):
        return spec.bits == 4 and not spec.symmetric
    if type_name == "MXFP4":  # e2m1 values doubled are small integers: int8 codes hold them exactly
        return spec.bits == 8 and spec.symmetric
    return type_name == "Q8_0" and spec.bits == 8


def _blocks(raw: np.ndarray, N: int, K: int, block_bytes: int) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.uint8).reshape(N, K // BLOCK, block_bytes)


def _f16(b: np.ndarray) -> torch.Tensor:
    """(..., 2) bytes -> float32 values of little-endian float16."""
    return torch.from_numpy(np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32))


def _nibbles(qs: np.ndarray, N: int, K: int) -> torch.Tensor:
    """(N, K/32, 16) bytes -> (N, K) codes: element j low nibble, element j + 16 high nibble."""
    q = torch.from_numpy(np.ascontiguousarray(qs))
    return torch.cat((q & 15, q >> 4), dim=-1).reshape(N, K)


def _q4_k(raw: np.ndarray, N: int, K: int) -> dict[str, torch.Tensor]:
    b = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(N, K // 256, 144))
    d, dmin = (b[..., i:i + 2].contiguous().view(torch.float16).float() for i in (0, 2))  # (N, K/256, 1)

    sc, m = _k_scales(b[..., 4:16])  # (N, K/256, 8)
    s = d * sc
    codes = _nibble_pairs(b[..., 16:].reshape(N, -1, 4, 32)).reshape(N, K)
    return {"codes": codes, "scales": s.reshape(N, -1), "zeros": (8 * s - dmin * m).reshape(N, -1)}


def import_block_quants(raw: np.ndarray, type_name: str, N: int, K: int, spec: QuantSpec) -> dict[str, torch.Tensor]:
    """Raw GGUF bytes of a (N, K) tensor -> codes (N, K), scales (N, K/32) float32 and zeros or None;
    for the types kept as blocks, {"blocks": (N, row bytes) uint8}.

    Callers check `direct_spec` first."""
    if spec.kind == type_name:
        # a view of the file's (copy-on-write) memory map, as llama.cpp's mmap: no copy to make at load,
        # and pages the OS can drop and read back under memory pressure
        # (F16 files' data comes as float16: the same bytes, viewed)
        return {"blocks": torch.from_numpy(np.asarray(raw).view(np.uint8).reshape(N, -1))}
    if type_name == "Q4_K":
        return _q4_k(raw, N, K)
    if type_name == "Q4_0":
        b = _blocks(raw, N, K, 18)
        d = _f16(b[..., 0:2])
        zeros = None if spec.symmetric else torch.zeros_like(d)
        return {"codes": _nibbles(b[..., 2:], N, K), "scales": d, "zeros": zeros}
    if type_name == "Q4_1":
        b = _blocks(raw, N, K, 20)
        d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        return {"codes": _nibbles(b[..., 4:], N, K), "scales": d, "zeros": m + 8 * d}
    if type_name == "MXFP4":  # ggml's kvalues_mxfp4 (e2m1 doubled) times half the e8m0 scale
        b = _blocks(raw, N, K, 17)
        codes = torch.tensor(MXFP4_CODES, dtype=torch.int8)[_nibbles(b[..., 1:], N, K).long()]
        scales = torch.from_numpy(np.ldexp(1.0, b[..., 0].astype(np.int32) - 128).astype(np.float32))
        return {"codes": codes, "scales": scales, "zeros": None}
    if type_name == "Q8_0":
        b = _blocks(raw, N, K, 34)
        codes = torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(N, K))
        return {"codes": codes, "scales": _f16(b[..., 0:2]), "zeros": None}
    raise ValueError(f"no direct import for GGUF type {type_name}")


# GGUF block types kept packed at load: mapped onto llmcli's formats (codes unchanged), or kept as blocks.
# Where the kernels multiply blocks with integer dot products, Q4_0/Q4_1/Q8_0/Q4_K stay blocks too
# (quant/held.py: they decode faster than through torch's int4 kernel, benchmarks/kernels/matvec_by_format.py)
# MXFP4 (gpt-oss's experts) as int8 codes (twice its bytes) only where the kernels do not multiply its
# blocks (held.py keeps the file's 17-byte blocks where they do)
AS_STORED = {"Q4_0": QuantSpec(4, BLOCK, True), "Q4_1": QuantSpec(4, BLOCK, False), "Q8_0": QuantSpec(8, BLOCK, True),
             "Q4_K": QuantSpec(4, BLOCK, False), "MXFP4": QuantSpec(8, BLOCK, True),
             **{t: QuantSpec(BITS[t], size, False, t) for t, (size, _) in BLOCKS.items()
                if t not in INT8_DOT_BLOCKS and t not in FLOAT_ROWS}}
# F16 and BF16 matrices as their rows, on a CPU where a kernel variant multiplies them (else the compute dtype)
AS_ROWS = {t: QuantSpec(16, 1, False, t) for t in FLOAT_ROWS}


def as_stored_preset(sources, device=None):
    """A preset that keeps a GGUF file's own quantization: Q4_0/Q4_1/Q8_0/Q4_K/MXFP4 tensors stay packed
    (exactly, see the table at the top), Q5_0/Q5_1/Q5_K/Q6_K as their blocks, every other type is
    dequantized to the compute dtype. None when the file has no such tensors. On a `device` CPU
    where any kernel variant runs, F16 and BF16 matrices stay rows (no float32 copy of them).
    (Where the kernels have integer dot products, quant/held.py holds Q4_0/Q4_1/Q8_0/Q4_K as blocks.)"""
    table = AS_STORED
    if device is not None and device.type == "cpu" and native.available():
        table = {**table, **AS_ROWS}
    rules = [Rule((s.name,), (), table[s.gguf_type]) for s in sources
             if s.gguf_type in table and len(s.shape) == 2]
    embedding = next((r for r in rules if r.patterns == ("model.embed_tokens.weight",)), None)
    if embedding is not None and not any(s.name == "lm_head.weight" for s in sources):
        # a tied output head is the embedding table itself: it keeps the same packed format
        rules.append(Rule(("lm_head.weight",), (), embedding.spec))
    if not rules:
        return None
    # (dtype float32: the file's float matrices reach the compute dtype unrounded, as it holds them)
    return Preset("as-stored", rules, description="the GGUF file's own quantized blocks, unchanged", dtype="float32")
