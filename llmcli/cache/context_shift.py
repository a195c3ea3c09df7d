"""Context shift: generation goes on past a full context by dropping the oldest tokens.

When the cache is full, the first `keep` tokens (the system prompt and the chat template's prefix)
stay, half of the rest (the oldest) is dropped, and the newer half moves down into the freed slots
(like llama.cpp's n_keep / n_discard). The moved keys carry RoPE rotations of their old positions;
rotating them by -drop positions puts them at their new slots, since rotations compose:
R(p - d) = R(-d) R(p). Nothing is recomputed: the shift costs one pass over the cache.

Re-prefilling the kept tokens instead would compute exactly what a fresh run on the shortened text
gives (the moved tokens no longer see the dropped ones) but costs a prefill of half the context per
shift: benchmarks/speed/shift_rotate_vs_prefill.py measures both (see the README); the rotation is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import common_prefix


def rerotation(inv_freq: torch.Tensor) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """A function (k, delta) -> k re-rotated from positions p to p - delta, for keys (B, KV, T, D)
    rotated in the half-split layout (models/llama.py apply_rope) with these inverse frequencies."""
    inv = inv_freq.detach().to("cpu", torch.float64)

    def rerotate(k: torch.Tensor, delta: int) -> torch.Tensor:
        angle = -float(delta) * inv  # float64: delta * freq reaches thousands of radians
        angle = torch.cat((angle, angle))
        cos, sin = (t.to(device=k.device, dtype=torch.float32) for t in (angle.cos(), angle.sin()))
        x = k.float()
        R = cos.shape[-1]  # rotary channels: fewer than head_dim with partial rotary (phi4-mini)
        x, rest = x[..., :R], x[..., R:]
        rotated = torch.cat((-x[..., R // 2:], x[..., :R // 2]), dim=-1)
        return torch.cat((x * cos + rotated * sin, rest), dim=-1).to(k.dtype)

    return rerotate


@dataclass
class ContextShift:
    """Makes room in a full cache; generate() calls make_room() before a step that would not fit."""

    keep: int  # tokens at the start that always stay
    inv_freq: torch.Tensor  # the model's RoPE inverse frequencies (model.inv_freq)
    shifts: int = 0  # how many times room was made
    dropped: int = 0  # tokens dropped in all

    def __post_init__(self):
        self._rerotate = rerotation(self.inv_freq)

    def make_room(self, cache) -> None:
        n = cache.length
        keep = min(self.keep, n // 2)  # a prefix that fills half the context still leaves room
        drop = max(1, (n - keep) // 2)
        cache.shift(keep, drop, self._rerotate)
        ids = getattr(cache, "token_ids", None)
        if ids is not None:
            cache.token_ids = ids[:keep] + ids[keep + drop:]
        self.shifts += 1
        self.dropped += drop


def prefix_length(encode: Callable[[list[dict]], list[int]], messages: list[dict]) -> int:
    """Tokens before the last message's text: the system prompt and the template's prefix, i.e. what
    two conversations that differ only in that text share."""
    last = messages[-1]
    a = encode(messages[:-1] + [{**last, "content": "A"}])
    b = encode(messages[:-1] + [{**last, "content": "B"}])
    return common_prefix(a, b)
