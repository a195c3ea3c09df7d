"""The kinds of KV cache by name (--kv-type) and their sizes: what the planner and the CLI need of
caches without building one (no torch)."""

from __future__ import annotations

from ..errors import InvalidParameterError

KV_TYPES = ("bf16", "f16", "int8", "int4")
KV_ITEMSIZE = {"bf16": 2, "f16": 2}  # bytes a value of the 16-bit kinds
KV_BITS = {"int8": 8, "int4": 4}
GROUP = 32  # tokens per key scale group of the quantized kinds (quantized.py)
CHANNEL_GROUP = 32  # channels per value scale group (the whole head when it does not divide)


def check_kv_type(kv_type: str | None) -> str | None:
    """For CLI options: None / "auto" (the planner decides) or one of KV_TYPES."""
    if kv_type is None or kv_type == "auto":
        return None
    if kv_type not in KV_TYPES:
        raise InvalidParameterError(f"unknown --kv-type {kv_type!r}; choose one of auto, {', '.join(KV_TYPES)}")
    return kv_type


def channel_group(head_dim: int) -> int:
    return CHANNEL_GROUP if head_dim % CHANNEL_GROUP == 0 and (head_dim // 2) % CHANNEL_GROUP == 0 else head_dim
