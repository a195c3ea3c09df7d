"""OLMoE: 64 experts of intermediate_size, the top 8 of the softmax, and attention whose q and k are
RMS-normed over all heads at once (one weight of H x D, another of KV x D) before RoPE, optionally
clamped to [-clip_qkv, clip_qkv] with v (models/moe.py)."""

from __future__ import annotations

from . import llama, moe
from .args import OlmoeArgs as ModelArgs  # noqa: F401 (re-exported)


class Attention(llama.Attention):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__(args, layer_idx)
        self.q_norm = llama.RMSNorm(self.n_heads * self.head_dim, args.rms_norm_eps)
        self.k_norm = llama.RMSNorm(self.n_kv_heads * self.head_dim, args.rms_norm_eps)
        self.clip = args.clip_qkv

    def fuse(self) -> None:
        """Nothing: the norms read q and k whole."""

    def project(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.q_norm(self.q_proj(x)), self.k_norm(self.k_proj(x)), self.v_proj(x)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return llama.apply_rope(q, cos, sin), llama.apply_rope(k, cos, sin), v


class DecoderLayer(moe.DecoderLayer):
    Attention = Attention


class Transformer(moe.Transformer):
    Layer = DecoderLayer
