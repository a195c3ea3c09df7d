"""Phi-3 / Phi-3.5 / Phi-4-mini: the Llama decoder with fused projections and LongRoPE.

What differs from llama.py, and nothing else:
- q, k and v are one `self_attn.qkv_proj` and gate and up one `mlp.gate_up_proj` in the checkpoint
  (HF names), so the layers are built fused; llama.py's Attention and MLP already run fused modules.
- LongRoPE: inverse frequencies divided by per-channel factors, the short set while the context fits
  the original training length and the long set beyond it (chosen by the cache size, as llama.cpp
  does by the context size), with cos/sin scaled by sqrt(1 + ln(factor) / ln(original context)).
- Phi-4-mini turns only a leading fraction of each head (`partial_rotary_factor`, in llama.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import CorruptModelError
from . import llama
from .linear import Linear
from .llama import rope_cos_sin


@dataclass
class ModelArgs(llama.ModelArgs):
    model_type: str = "phi3"
    original_max_position_embeddings: int | None = None

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "ModelArgs":
        args = super().from_hf_config(config)
        # transformers 4.x: `rope_scaling` ("longrope", or its old names "su"/"yarn") and top-level keys
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("long_factor") is not None:
            args.rope_scaling = {**rope, "rope_type": "longrope"}
        args.partial_rotary_factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
        args.original_max_position_embeddings = (rope.get("original_max_position_embeddings")
                                                 or config.get("original_max_position_embeddings"))
        return args

    @property
    def longrope(self) -> bool:
        return (self.rope_scaling or {}).get("rope_type") == "longrope"

    def attention_factor(self) -> float:
        """The cos/sin scale LongRoPE applies (1 without it)."""
        if not self.longrope:
            return 1.0
        if self.rope_scaling.get("attention_factor") is not None:
            return float(self.rope_scaling["attention_factor"])
        orig = self.original_max_position_embeddings or self.max_position_embeddings
        factor = self.rope_scaling.get("factor") or self.max_position_embeddings / orig
        return math.sqrt(1 + math.log(factor) / math.log(orig)) if factor > 1 else 1.0


def rope_inv_freq(args: ModelArgs, long: bool = False) -> torch.Tensor:
    """(rotary_dim/2,) float32: LongRoPE's short (or long) set, else whatever llama.py computes."""
    if not args.longrope:
        return llama.rope_inv_freq(args)
    dim = args.rotary_dim
    factors = torch.tensor(args.rope_scaling["long_factor" if long else "short_factor"], dtype=torch.float64)
    if factors.numel() != dim // 2:
        raise CorruptModelError(f"LongRoPE has {factors.numel()} factors for {dim // 2} frequencies; the config is broken")
    return (1.0 / (factors * args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))).float()


class Transformer(llama.Transformer):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        h, D = args.hidden_size, args.head_dim
        for layer in self.model.layers:  # the checkpoint's fused modules in place of llama's separate ones
            attn, mlp = layer.self_attn, layer.mlp
            del attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj
            attn.qkv_proj = Linear(h, (args.num_attention_heads + 2 * args.num_key_value_heads) * D, bias=False)
            mlp.gate_up_proj = Linear(h, 2 * args.intermediate_size, bias=False)
        self.attention_factor = args.attention_factor()

    @staticmethod
    def rope_buffers(args: ModelArgs) -> dict[str, torch.Tensor]:
        return {"inv_freq": rope_inv_freq(args), "inv_freq_long": rope_inv_freq(args, long=True)}

    def inv_freq_for(self, max_len: int) -> torch.Tensor:
        """The long factors' table when a cache of `max_len` outgrows the original context."""
        args = self.args
        long = args.longrope and max_len > (args.original_max_position_embeddings or args.max_position_embeddings)
        return self.inv_freq_long if long else self.inv_freq

    def rope(self, positions: torch.Tensor, cache, dtype: torch.dtype):
        """cos, sin (T, rotary_dim), scaled by LongRoPE's attention factor."""
        cos, sin = rope_cos_sin(self.inv_freq_for(cache.max_len), positions, torch.float32)
        f = self.attention_factor
        return (cos * f).to(dtype), (sin * f).to(dtype)
