"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's decoder (q/k norm per head) with experts in
its sparse layers: softmax over the experts, the top `num_experts_per_tok`, renormalized with
`norm_topk_prob` (models/moe.py)."""

from __future__ import annotations

from .args import Qwen3MoeArgs as ModelArgs  # noqa: F401 (re-exported)
from .moe import Transformer  # noqa: F401 (the family's)
