"""GGUF blocks of any type from float32 rows, for the benchmarks and the tests: encoders for GGUF's
K-quant blocks here (gguf-py only decodes them), every other type through gguf-py.

    blocks = quantize(x, "Q4_K")    # (N, K) float32, K a multiple of 256 -> (N, K/256*144) uint8

The K-quant encoders write the exact byte layout llama.cpp writes (ggml-common.h), with simple min/max
scales, not llama.cpp's search: tests need valid blocks, not the best ones. Checked by round-tripping
through `gguf.quants.dequantize` (tests/test_gguf_kquants.py). Their float16 bytes and nibble packing
are the package's (llmcli/quant/gguf_encode.py, which writes `quantize --format gguf`'s blocks).

    Q4_K  144 bytes / 256: d f16, dmin f16, scales[12] (6-bit scale and min per 32), qs[128]
    Q5_K  176 bytes / 256: d, dmin, scales[12], qh[32] (5th bits), qs[128]
    Q6_K  210 bytes / 256: ql[128], qh[64], scales[16] int8 (one per 16), d f16
"""

from __future__ import annotations

import numpy as np

from llmcli.quant.gguf_encode import f16_bytes as _f16
from llmcli.quant.gguf_encode import pack_nibbles

QK = 256

def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(n, 8) 6-bit scales and mins -> (n, 12) bytes, the inverse of ggml's get_scale_min_k4."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return out


def _asymmetric(x: np.ndarray, levels: int):
    """(n, 8, 32) values -> d, dmin (n,), 6-bit sc, m (n, 8), codes (n, 8, 32) with w = d*sc*q - dmin*m."""
    lo = np.minimum(x.min(-1), 0.0)
    scale, mins = (x.max(-1) - lo) / levels, -lo
    d = np.maximum(scale.max(-1), 1e-12) / 63
    dmin = np.maximum(mins.max(-1), 1e-12) / 63
    d, dmin = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    nonzero = lambda v: np.where(v > 0, v, 1.0)  # a block of zeros rounds d to 0 in half precision
    sc = np.clip(np.round(scale / nonzero(d)[:, None]), 1, 63).astype(np.uint8)
    m = np.clip(np.round(mins / nonzero(dmin)[:, None]), 0, 63).astype(np.uint8)
    step = nonzero(d[:, None] * sc)[..., None]
    q = np.clip(np.round((x + (dmin[:, None] * m)[..., None]) / step), 0, levels).astype(np.uint8)
    return d, dmin, sc, m, q


def _low_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 256) codes -> (n, 128) bytes: per 64 elements, element l low, element l + 32 high."""
    return pack_nibbles(q.reshape(-1, 256), 32)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """(N, K) float32, K a multiple of 256 -> (N, K/256*144) uint8."""
    N, K = x.shape
    d, dmin, sc, m, q = _asymmetric(x.reshape(-1, 8, 32).astype(np.float32), 15)
    blocks = np.concatenate([_f16(d), _f16(dmin), _pack_scales(sc, m), _low_nibbles(q.reshape(-1, QK))], axis=1)
    return blocks.reshape(N, -1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    N, K = x.shape
    d, dmin, sc, m, q = _asymmetric(x.reshape(-1, 8, 32).astype(np.float32), 31)
    q = q.reshape(-1, 8, 32)
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for s in range(8):  # the 5th bit of sub-block s is bit s of qh[l]
        qh |= ((q[:, s] >> 4) & 1) << s
    blocks = np.concatenate([_f16(d), _f16(dmin), _pack_scales(sc, m), qh, _low_nibbles(q.reshape(-1, QK))], axis=1)
    return blocks.reshape(N, -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    N, K = x.shape
    x = x.reshape(-1, 16, 16).astype(np.float32)  # (blocks, 16 sub-blocks, 16)
    amax = np.abs(x).max(-1)
    scale = np.where(amax > 0, amax / 31, 1e-12)
    d = (np.abs(scale).max(-1) / 127).astype(np.float16).astype(np.float32)
    d = np.where(d > 0, d, np.float32(1e-7))
    sc = np.clip(np.round(scale / d[:, None]), 1, 127).astype(np.int8)
    q = np.clip(np.round(x / (d[:, None] * sc)[..., None]), -32, 31).astype(np.int16) + 32
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)  # (blocks, half, quarter, l)
    ql = np.concatenate([(q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4),
                         (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)], axis=2).reshape(-1, 128)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    blocks = np.concatenate([ql, qh.reshape(-1, 64), sc.view(np.uint8), _f16(d)], axis=1)
    return blocks.reshape(N, -1)


ENCODERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}


def quantize(x: np.ndarray, type_name: str) -> np.ndarray:
    """Any GGUF block type: K-quants here, the rest through gguf-py."""
    import gguf
    from gguf.quants import quantize as gguf_quantize

    if type_name in ENCODERS:
        return ENCODERS[type_name](np.asarray(x, dtype=np.float32))
    return gguf_quantize(np.asarray(x, dtype=np.float32), gguf.GGMLQuantizationType[type_name])
