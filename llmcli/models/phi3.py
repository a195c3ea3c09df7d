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


import torch

from . import llama, rope
from .args import Phi3Args as ModelArgs  # noqa: F401 (re-exported)
from .linear import Linear
from .llama import rope_cos_sin


def rope_inv_freq(args: ModelArgs, long: bool = False) -> torch.Tensor:
    """(rotary_dim/2,) float32: LongRoPE's short (or long) set, else whatever llama.py computes."""
    if not args.longrope:
        return llama.rope_inv_freq(args)
    return torch.from_numpy(rope.longrope_inv_freq(args, long))


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
