"""llmcli's quantized tensors -> GGUF block bytes, the layouts gguf_blocks.py reads (ggml-common.h).

    Q4_0   18 bytes / 32:  d f16, qs[16]          w = d * (q - 8)   = llmcli int4 g32 symmetric
    Q4_1   20 bytes / 32:  d, m f16, qs[16]       w = d * q + m     = int4 g32 with a zero: m = zero - 8 d
    Q8_0   34 bytes / 32:  d f16, qs[32] int8     w = d * q         = int8 g32

The codes go in unchanged; only the scales (and m) are rounded from bfloat16 to float16, which holds
a bfloat16 scale exactly in float16's normal range. Also the pieces benchmarks/shapes.py's K-quant
encoders share: float16 bytes and two 4-bit codes a byte.
"""

from __future__ import annotations

import numpy as np
import torch

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


def _numpy(t) -> np.ndarray:
    return t.float().numpy() if isinstance(t, torch.Tensor) and t.is_floating_point() else np.asarray(t)


def encode_blocks(codes, scales, zeros, type_name: str) -> np.ndarray:
    """Codes (N, K) (int4: 0..15 unpacked; int8: -127..127), scales (N, K/32) and zeros (N, K/32) or
    None, in llmcli's convention (primitives.py) -> (N, K/32 * block bytes) uint8 rows of blocks."""
    if type_name not in TYPES:
        raise ValueError(f"no encoder for GGUF type {type_name}; one of {', '.join(TYPES)}")
    codes, scales = _numpy(codes), _numpy(scales).astype(np.float32)
    N, K = codes.shape
    nb = K // BLOCK
    if K % BLOCK or scales.shape != (N, nb):
        raise ValueError(f"codes {codes.shape} and scales {scales.shape} are not groups of {BLOCK}")
    d = f16_bytes(scales.reshape(-1))  # (N*nb, 2)
    if type_name == "Q8_0":
        qs = np.ascontiguousarray(codes.astype(np.int8)).view(np.uint8).reshape(N * nb, BLOCK)
        return np.concatenate([d, qs], axis=1).reshape(N, -1)
    qs = pack_nibbles(codes.reshape(N * nb, BLOCK), BLOCK // 2)
    if type_name == "Q4_0":
        if zeros is not None and np.any(_numpy(zeros)):
            raise ValueError("Q4_0 has no zero point; these codes have one (Q4_1)")
        return np.concatenate([d, qs], axis=1).reshape(N, -1)
    if zeros is None:
        raise ValueError("Q4_1 needs the zero points")
    m = _numpy(zeros).astype(np.float32) - 8 * scales  # the value at code 0
    return np.concatenate([d, f16_bytes(m.reshape(-1)), qs], axis=1).reshape(N, -1)
