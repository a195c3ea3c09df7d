"""Mixtral: Mistral's decoder with 8 experts of intermediate_size in every layer, the softmax of the
top 2 logits weighting them (models/moe.py). The Hub's checkpoints name the experts' matrices w1
(gate), w3 (up) and w2 (down) under `block_sparse_moe`: formats/hf_folder.module_name renames them."""

from __future__ import annotations

from .args import MixtralArgs as ModelArgs  # noqa: F401 (re-exported)
from .moe import Transformer  # noqa: F401 (the family's)
