"""KV caches. A cache is an argument to the model's forward, never part of the model.

Kinds (new_cache picks one; nothing else builds a cache):
    StaticKVCache      preallocated, in the compute dtype or a 16-bit storage dtype (kv-type bf16/f16)
    QuantizedKVCache   int8 / int4 codes with scales (quantized.py)
    OffloadedKVCache   the first N layers on the device, the rest in host memory (offload.py)
    PassThroughCache   keeps nothing: one forward over whole sequences (embeddings; passthrough.py)

static.py lists the interface they share; context_shift.py drops the oldest tokens of a full cache;
prompt_cache.py keeps finished requests' KV for later requests that start the same way.
"""

from __future__ import annotations

from .kinds import (CHANNEL_GROUP, GROUP, KV_BITS, KV_ITEMSIZE, KV_TYPES, channel_group,  # noqa: F401 (re-exported)
                    check_kv_type)

_KINDS = {"StaticKVCache": "static", "QuantizedKVCache": "quantized", "OffloadedKVCache": "offload",
          "PassThroughCache": "passthrough"}


def __getattr__(name: str):
    """The cache classes and KV_DTYPES, imported on first use: they are torch's, and the planner and
    the torch-free CPU path import this package without torch."""
    if name in _KINDS:
        import importlib

        return getattr(importlib.import_module(f".{_KINDS[name]}", __name__), name)
    if name == "KV_DTYPES":
        import torch

        return {"bf16": torch.bfloat16, "f16": torch.float16}
    raise AttributeError(name)


def new_cache(args, max_len: int, device, dtype, kv_type: str | None = None,
              device_layers: int | None = None, batch: int = 1):
    """A cache of `kv_type` (None: static in the compute `dtype`) for `batch` rows of `max_len` tokens.

    `device_layers` below the layer count offloads the other layers to host memory (float kinds only).
    kv_type "none" keeps nothing (PassThroughCache): a forward pass over whole sequences, no next token."""
    from .offload import OffloadedKVCache
    from .passthrough import PassThroughCache
    from .quantized import QuantizedKVCache
    from .static import StaticKVCache

    if kv_type == "none":
        return PassThroughCache(max_len)
    bits = KV_BITS.get(kv_type)
    store = __getattr__("KV_DTYPES").get(kv_type, dtype)
    if device_layers is not None and device_layers < args.num_hidden_layers:
        if bits:
            raise ValueError("an offloaded cache stores floats; use kv_type bf16, f16 or None")
        return OffloadedKVCache.for_model(args, max_len, device, store, device_layers, batch, compute_dtype=dtype)
    if bits:
        return QuantizedKVCache.for_model(args, max_len, device, dtype, bits, batch)
    return StaticKVCache.for_model(args, max_len, device, store, batch, compute_dtype=dtype)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def reuse_prefix(cache, prompt: list[int]) -> int:
    """Keep what the cache holds of `prompt`'s start (its `token_ids` list the ids in its slots),
    leaving at least one prompt token to run for the next logits; returns the tokens kept."""
    held = getattr(cache, "token_ids", [])[: cache.length]
    reuse = min(common_prefix(held, prompt), len(prompt) - 1)
    cache.truncate(reuse)
    cache.token_ids = list(prompt[:reuse])
    return reuse
