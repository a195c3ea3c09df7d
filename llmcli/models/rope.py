"""RoPE's inverse frequencies and cos/sin tables in numpy: one computation for the torch models
(llama.py's rope_inv_freq wraps it), the native step's tables and the torch-free CPU path.

Scalings: none, linear, llama3 (wavelength bands), GGUF's per-frequency factors (`rope_freqs.weight`)
and Phi-3's LongRoPE (short and long factor sets). Frequencies are computed in float64 and kept as
float32, as transformers keeps them.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import CorruptModelError, UnsupportedModelError


def inv_freq(args, theta: float | None = None, scaling: dict | None = None) -> np.ndarray:
    """(rotary_dim/2,) float32 inverse frequencies with the model's rope scaling applied (or the given
    theta and scaling: gemma3's local layers)."""
    dim = args.rotary_dim
    theta = args.rope_theta if theta is None else theta
    f = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if args.rope_freq_factors is not None:
        f = f / np.asarray(args.rope_freq_factors, dtype=np.float64)
    scaling = (args.rope_scaling or {}) if scaling is None else scaling
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        f = f / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_ctx = scaling.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / f
        scaled = np.where(wavelen > old_ctx / low, f / factor, f)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        f = np.where(medium, smoothed, scaled)
    elif kind != "default":
        raise UnsupportedModelError(f"rope scaling {kind!r} is not supported; supported: default, linear, llama3")
    return f.astype(np.float32)


def longrope_inv_freq(args, long: bool = False) -> np.ndarray:
    """(rotary_dim/2,) float32: Phi-3's LongRoPE short (or long) factor set."""
    dim = args.rotary_dim
    factors = np.asarray(args.rope_scaling["long_factor" if long else "short_factor"], dtype=np.float64)
    if factors.size != dim // 2:
        raise CorruptModelError(f"LongRoPE has {factors.size} factors for {dim // 2} frequencies; the config is broken")
    return (1.0 / (factors * args.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))).astype(np.float32)


def cos_sin(freqs: np.ndarray, positions: np.ndarray, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """positions (T,) -> cos, sin (T, rotary_dim) float32 in the half-split layout (entries j and
    j + R/2 equal), times `scale` (LongRoPE's attention factor). The angles are float32 products, as
    transformers forms them; their cos and sin are taken in float64 and rounded once."""
    angles = (np.asarray(positions, dtype=np.float32)[:, None] * freqs[None, :]).astype(np.float64)
    angles = np.concatenate((angles, angles), axis=1)
    return (np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32)
