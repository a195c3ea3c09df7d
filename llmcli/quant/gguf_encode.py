"""llmcli's quantized tensors -> GGUF block bytes, the layouts gguf_blocks.py reads (ggml-common.h).

    Q4_0   18 bytes / 32:  d f16, qs[16]          w = d * (q - 8)   = llmcli int4 g32 symmetric
    Q4_1   20 bytes / 32:  d, m f16, qs[16]       w = d * q + m     = int4 g32 with a zero: m = zero - 8 d
    Q8_0   34 bytes / 32:  d f16, qs[32] int8     w = d * q         = int8 g32

The codes go in unchanged; only the scales (and m) are rounded from bfloat16 to float16, which holds
a bfloat16 scale exactly in float16's normal range. The loader (held.py) holds llmcli's g32 weights
as these blocks on the CPU, and `quantize --format gguf` writes them (gguf_export.py). Also the
pieces benchmarks/gguf_blocks.py's K-quant encoders share: float16 bytes and two 4-bit codes a byte.
"""

from __future__ import annotations

import numpy as np
import torch

from .primitives import TASK_VALUES, in_tasks, unpack_int4

BLOCK = 32
TYPES = ("Q4_0", "Q4_1", "Q8_0")


def f16_bytes(v) -> np.ndarray:
    """(n,) values -> (n, 2) little-endian float16 bytes."""
    return np.ascontiguousarray(np.asarray(v, dtype=np.float32).astype("<f2")).view(np.uint8).reshape(-1, 2)


def pack_nibbles(q: np.ndarray, half: int) -> np.ndarray:
    """(n, 2*half*m) codes in 0..15 -> (n, half*m) bytes: per 2*half elements, element l in the low
    nibble and element l + half in the high one (Q4_0/Q4_1: half 16; Q4_K: half 32)."""
    n = q.shape[0]
    q = (q.astype(np.uint8) & 15).reshape(n, -1, 2, half)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, -1)


def encode_blocks(codes, scales, zeros, type_name: str) -> np.ndarray:
    """Codes (N, K) (int4: 0..15 unpacked; int8: -127..127), scales (N, K/32) and zeros (N, K/32) or
    None, in llmcli's convention (primitives.py) -> (N, K/32 * block bytes) uint8 rows of blocks."""
    if type_name not in TYPES:
        raise ValueError(f"no encoder for GGUF type {type_name}; one of {', '.join(TYPES)}")
    codes, scales = torch.as_tensor(codes), torch.as_tensor(scales).float()
    N, K = codes.shape
    if K % BLOCK or tuple(scales.shape) != (N, K // BLOCK):
        raise ValueError(f"codes {tuple(codes.shape)} and scales {tuple(scales.shape)} are not groups of {BLOCK}")
    zeros = None if zeros is None else torch.as_tensor(zeros).float()
    if type_name == "Q4_0" and zeros is not None and bool(zeros.any()):
        raise ValueError("Q4_0 has no zero point; these codes have one (Q4_1)")
    if type_name == "Q4_1" and zeros is None:
        raise ValueError("Q4_1 needs the zero points")
    offset = None if type_name != "Q4_1" else zeros - 8 * scales  # the value at code 0
    codes = codes.to(torch.int8 if type_name == "Q8_0" else torch.uint8)
    return to_blocks(codes, scales, offset, type_name).numpy()


_LAYOUTS = {"Q4_0": [("d", "<f2"), ("qs", "u1", 16)], "Q4_1": [("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)],
            "Q8_0": [("d", "<f2"), ("qs", "i1", 32)]}  # a block of 32, as ggml lays it out


def to_blocks(codes: torch.Tensor, scales: torch.Tensor, offset: torch.Tensor | None, type_name: str,
              packed: bool = False) -> torch.Tensor:
    """codes (N, K) (int4: 0..15 as uint8, or packed two a byte as pack_int4 packs them; int8),
    scales (N, K/32), Q4_1's offsets m (N, K/32) -> (N, K/32 * block bytes) uint8 GGUF blocks:
    [d f16][m f16, Q4_1][codes: 4-bit, byte j holding element j low and element j + 16 high;
    8-bit as int8]. In tasks of rows over torch's threads, as quantize() runs."""
    N = codes.shape[0]
    K = codes.shape[1] * (2 if packed else 1)
    n = K // 32
    out = np.empty((N, n), np.dtype(_LAYOUTS[type_name]))
    rows = max(1, TASK_VALUES // K)

    def task(start: int) -> None:
        stop = min(N, start + rows)
        block = out[start:stop]
        block["d"] = scales[start:stop].reshape(-1, n).to(torch.float16).numpy()
        if type_name == "Q4_1":
            block["m"] = offset[start:stop].reshape(-1, n).to(torch.float16).numpy()
        c = unpack_int4(codes[start:stop]) if packed else codes[start:stop]
        c = c.reshape(-1, n, 32).numpy()
        block["qs"] = c if type_name == "Q8_0" else c[..., :16] | (c[..., 16:] << 4)

    in_tasks(task, range(0, N, rows))
    return torch.from_numpy(out.view(np.uint8).reshape(N, -1))
