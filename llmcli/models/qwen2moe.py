"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's decoder (q/k/v bias) with experts and a
shared expert every token runs, scaled by a sigmoid gate of its own (models/moe.py)."""

from __future__ import annotations

from .args import Qwen2MoeArgs as ModelArgs  # noqa: F401 (re-exported)
from .moe import Transformer  # noqa: F401 (the family's)
