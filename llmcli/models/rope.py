"""RoPE's inverse frequencies and cos/sin tables in numpy: one computation for the torch models
(llama.py's rope_inv_freq wraps it), the native step's tables and the torch-free CPU path.

Scalings: none, linear, llama3 (wavelength bands), YaRN (gpt-oss), GGUF's per-frequency factors (`rope_freqs.weight`)
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
    elif kind == "yarn":
        f = _yarn(f, dim, theta, scaling)
    elif kind != "default":
        raise UnsupportedModelError(f"rope scaling {kind!r} is not supported; supported: default, linear, llama3, yarn")
    return f.astype(np.float32)


def _yarn(f: np.ndarray, dim: int, theta: float, scaling: dict) -> np.ndarray:
    """YaRN (transformers' _compute_yarn_parameters): high frequencies kept, low ones divided by
    `factor`, a linear ramp between the dims that turn beta_fast and beta_slow times in the original
    context (the ends rounded outwards with `truncate`, llama.cpp's ggml_rope_yarn_corr_dims always)."""
    factor, orig = scaling["factor"], scaling["original_max_position_embeddings"]
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def dim_of(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(fast), dim_of(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # (as transformers: no division by zero)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    return f / factor * ramp + f * (1 - ramp)


def attention_factor(args) -> float:
    """The cos/sin scale of YaRN (1 for the other scalings): its `attention_factor`, else
    0.1 ln(factor) + 1 (with DeepSeek's mscale pair where given)."""
    scaling = args.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = scaling["factor"]

    def mscale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(scaling["mscale"]) / mscale(scaling["mscale_all_dim"])
    return mscale()


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
