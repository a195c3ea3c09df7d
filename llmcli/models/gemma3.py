"""Gemma 3 (text): the Llama decoder with Gemma's changes.

- RMSNorm scales by (1 + w), in float32 before casting back; four norms per layer (around attention
  and around the MLP) and a norm over each head of q and k.
- Embeddings are multiplied by sqrt(hidden_size), rounded to the compute dtype first.
- Sliding-window ("local") layers alternate with global ones (`layer_types`, by default five local
  then one global); local layers use their own RoPE base (`rope_local_base_freq`, 10000) and no
  rope scaling, global ones `rope_theta` and the config's scaling.
- Attention scale `query_pre_attn_scalar ** -0.5`; GeGLU (tanh-approximated GELU) MLP; tied head.
- Optional soft-capping of the final logits, cap * tanh(x / cap). Gemma 2's attention-score capping is
  gone in Gemma 3: configs still carry `attn_logit_softcapping`, but transformers and llama.cpp
  ignore it, and so does this file.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from . import llama
from .args import Gemma3Args as ModelArgs  # noqa: F401 (re-exported)
from .llama import per_row, rope_cos_sin, rope_inv_freq


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class RMSNorm(llama.RMSNorm):
    """x / rms(x) * (1 + w), all in float32 (Llama casts before scaling; Gemma after)."""

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


class Attention(llama.Attention):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__(args, layer_idx)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps)  # (D,) Gemma norms over each head
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps)
        self.scale = args.query_pre_attn_scalar ** -0.5


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        h, eps = args.hidden_size, args.rms_norm_eps
        self.self_attn = Attention(args, layer_idx)
        self.mlp = llama.MLP(args, act=gelu_tanh)
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.pre_feedforward_layernorm = RMSNorm(h, eps)
        self.post_feedforward_layernorm = RMSNorm(h, eps)

    def forward(self, x, cos, sin, cache, start, mask):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, cache, start, mask))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Transformer(llama.Transformer):
    """As llama.Transformer; `self.inv_freq` serves the global layers, `self.inv_freq_local` the others."""

    Layer, Norm = DecoderLayer, RMSNorm

    @staticmethod
    def rope_buffers(args: ModelArgs) -> dict[str, torch.Tensor]:
        return {"inv_freq": rope_inv_freq(args),
                "inv_freq_local": rope_inv_freq(args, theta=args.rope_local_base_freq, scaling={})}

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(tokens)  # (B, T, hidden)
        return x * self.embed_scale(x.dtype)

    def embed_scale(self, dtype: torch.dtype) -> torch.Tensor:
        """What embed multiplies the table's rows by: sqrt(hidden), rounded to `dtype` as HF's is."""
        return torch.tensor(self.args.hidden_size ** 0.5, dtype=dtype)

    def run_layers(self, x, positions, cache, start, mask, slots) -> torch.Tensor:
        global_rope = per_row(*rope_cos_sin(self.inv_freq, positions, x.dtype), slots)
        local_rope = per_row(*rope_cos_sin(self.inv_freq_local, positions, x.dtype), slots)
        for layer, kind in zip(self.model.layers, self.args.layer_types):
            cos, sin = local_rope if kind == "sliding_attention" else global_rope
            x = layer(x, cos, sin, cache, start, mask)
        return x

    def output(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(h).float()
        cap = self.args.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits
