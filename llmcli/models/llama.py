"""The Llama family: llama (incl. Llama 3 rope scaling), mistral, qwen2 (q/k/v bias), qwen3 (q/k norm).

One readable decoder: grouped-query attention with RoPE, RMSNorm, SwiGLU, tied or untied head.
Parameter names follow Hugging Face (`model.layers.0.self_attn.q_proj.weight`), so safetensors from
the Hub load without conversion. The model holds no generation state: the KV cache is an argument.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import native
from . import rope
from .args import LlamaArgs as ModelArgs  # noqa: F401 (the family's, re-exported)
from .fusion import fuse_linears
from .linear import Linear


def rope_inv_freq(args: ModelArgs, theta: float | None = None, scaling: dict | None = None) -> torch.Tensor:
    """(rotary_dim/2,) float32 inverse frequencies, with the model's rope scaling applied (or the
    given theta and scaling: gemma3's local layers): rope.py's."""
    return torch.from_numpy(rope.inv_freq(args, theta, scaling))


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """positions (T,) -> cos, sin of shape (T, head_dim), in the half-split layout HF uses."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D); rotates the first and second halves of D as pairs. With cos (T, R) for R < D
    (partial rotary), only the first R channels turn; the rest pass through."""
    if cos.shape[-1] < x.shape[-1]:
        R = cos.shape[-1]
        return torch.cat((apply_rope(x[..., :R], cos, sin), x[..., R:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in float32 like the reference, then scale in the input dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    scale: float | None = None  # softmax scale; None: 1/sqrt(head_dim)

    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.window = args.layer_window(layer_idx)
        qkv_bias = args.attention_bias or args.qkv_bias
        h = args.hidden_size
        self.q_proj = Linear(h, self.n_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = Linear(h, self.n_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = Linear(h, self.n_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = Linear(self.n_heads * self.head_dim, h, bias=args.attention_bias)
        if args.qk_norm:  # (D,) weights shared by every head
            self.q_norm = RMSNorm(self.head_dim, args.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, args.rms_norm_eps)

    def fuse(self) -> None:
        """One GEMM for q, k and v (fewer, larger kernels per token); names change, so runtime only."""
        if not hasattr(self, "q_proj"):  # built fused (phi3's qkv_proj)
            return
        fused = fuse_linears([self.q_proj, self.k_proj, self.v_proj])
        if fused is not None:
            self.qkv_proj = fused
            del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x, cos, sin, cache, start: int, mask) -> torch.Tensor:
        B, T, _ = x.shape
        H, KV, D = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.project(x, cos, sin)
        k, v = cache.update(self.layer_idx, start, k, v)  # (B, KV, start+T, D): the valid part only
        if self.window is not None and k.shape[2] > self.window:
            mask = _window_mask(mask, start, T, k.shape[2], self.window, x.device)
        if T == 1:
            y = attend_one(q, k, v, mask, self.scale)
        else:
            is_causal = mask is None  # only when start == 0: queries and keys line up
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale,
                                               enable_gqa=H != KV)  # (B, H, T, D)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * D))

    def project(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, hidden) -> q (B, H, T, D), k and v (B, KV, T, D), q and k normed and rotated."""
        B, T, _ = x.shape
        H, KV, D = self.n_heads, self.n_kv_heads, self.head_dim
        if hasattr(self, "qkv_proj"):
            qkv = self.qkv_proj(x).view(B, T, H + 2 * KV, D).transpose(1, 2)  # (B, H+2KV, T, D)
            if hasattr(self, "q_norm"):
                q, k, v = self.q_norm(qkv[:, :H]), self.k_norm(qkv[:, H:H + KV]), qkv[:, H + KV:]
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            else:
                qk = apply_rope(qkv[:, : H + KV], cos, sin)  # q and k rotated in one go
                q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + KV:]
        else:
            q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
            k = self.k_proj(x).view(B, T, KV, D).transpose(1, 2)  # (B, KV, T, D)
            v = self.v_proj(x).view(B, T, KV, D).transpose(1, 2)
            if hasattr(self, "q_norm"):
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v


def attend_one(q, k, v, mask, scale: float | None) -> torch.Tensor:
    """Attention for one query per row (decoding): q (B, H, 1, D), k and v (B, KV, S, D), `mask` bool
    broadcastable to (B, 1, 1, S) or None -> (B, H, 1, D). On the CPU with a float32 cache, a C++
    kernel (native/src/attention.cpp): SDPA's per-call setup costs more than the work at this size,
    and compiled, inductor turns any spelt-out
    form back into SDPA."""
    S = k.shape[2]
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    y = native.attend_one(q, k, v, None if mask is None else mask.reshape(-1, S), scale)
    if y is not None:
        return y
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def _window_mask(mask, start, T: int, S: int, window: int, device) -> torch.Tensor:
    """(T, S) bool: causal and within the sliding window (key slot > query slot - window). In a
    batched decode step (`start` the (B,) slots of each row's one query) the (B, 1, 1, S) `mask`
    narrowed to the window."""
    k_slot = torch.arange(S, device=device)[None, :]
    if isinstance(start, torch.Tensor):
        return mask & (k_slot > start[:, None] - window)[:, None, None, :]
    q_slot = torch.arange(start, start + T, device=device)[:, None]
    return (k_slot <= q_slot) & (k_slot > q_slot - window)


def forward_layout(T: int, cache, positions, slots, device):
    """(start, positions, mask) for a forward pass of T new tokens per row.

    Usually every row's tokens go to cache slots [cache.length, cache.length + T) and `positions`
    default to those slots; mask None means plainly causal. With `slots` (B,) (batched decode,
    batched.py: rows of different lengths) row b's single token goes to slot slots[b], at that
    position, and sees the slots up to its own: start and positions are `slots`, the mask is
    (B, 1, 1, cache.length), the caller having set cache.length to max(slots) + 1."""
    if slots is not None:
        if T != 1:
            raise ValueError("slots are for one-token decode steps")
        mask = torch.arange(cache.length, device=device)[None, :] <= slots[:, None]  # (B, S)
        return slots, slots, mask[:, None, None, :]
    start = cache.length
    if start + T > cache.max_len:
        raise ValueError(f"cache holds {cache.max_len} tokens; {start} used, {T} more asked for")
    if positions is None:
        positions = torch.arange(start, start + T, device=device)
    mask = None
    if T > 1 and start > 0:  # queries see every cached slot plus the causal part of their own
        mask = torch.ones(T, start + T, dtype=torch.bool, device=device).tril(diagonal=start)
    return start, positions, mask


def per_row(cos: torch.Tensor, sin: torch.Tensor, slots) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables (B, R) of a batched decode step -> (B, 1, 1, R), to broadcast over (B, H, 1, D)."""
    if slots is None:
        return cos, sin
    return cos[:, None, None, :], sin[:, None, None, :]


class MLP(nn.Module):
    def __init__(self, args: ModelArgs, act=F.silu):
        super().__init__()
        self.act = act  # SwiGLU; gemma3 passes tanh-approximated GELU (GeGLU)
        h, i, b = args.hidden_size, args.intermediate_size, args.mlp_bias
        self.gate_proj = Linear(h, i, bias=b)
        self.up_proj = Linear(h, i, bias=b)
        self.down_proj = Linear(i, h, bias=b)

    def fuse(self) -> None:
        """One GEMM for gate and up; runtime only (the parameter names change)."""
        if not hasattr(self, "gate_proj"):  # built fused (phi3's gate_up_proj)
            return
        fused = fuse_linears([self.gate_proj, self.up_proj])
        if fused is not None:
            self.gate_up_proj = fused
            del self.gate_proj, self.up_proj

    def forward(self, x):
        if hasattr(self, "gate_up_proj"):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(self.act(gate) * up)
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(args, layer_idx)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, x, cos, sin, cache, start, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, start, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """`forward(tokens, cache, positions) -> logits`; `self.model` mirrors HF's `LlamaModel`."""

    Layer, Norm = DecoderLayer, RMSNorm  # other families swap in their own

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.model.layers = nn.ModuleList(self.Layer(args, i) for i in range(args.num_hidden_layers))
        self.model.norm = self.Norm(args.hidden_size, args.rms_norm_eps)
        self.lm_head = Linear(args.hidden_size, args.vocab_size, bias=False)
        for name, t in self.rope_buffers(args).items():
            self.register_buffer(name, t, persistent=False)
        self.attention_factor = rope.attention_factor(args)  # YaRN's cos/sin scale (1 for the others)

    @staticmethod
    def rope_buffers(args: ModelArgs) -> dict[str, torch.Tensor]:
        """The RoPE tables the model keeps (recomputed on the device at load, never saved)."""
        return {"inv_freq": rope_inv_freq(args)}

    def fuse(self) -> "Transformer":
        """Fuse q/k/v and gate/up projections in every layer where their formats allow it."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self

    def rope(self, positions: torch.Tensor, cache, dtype: torch.dtype):
        """cos, sin (T, rotary_dim) for these positions (phi3 picks its factors by the cache size)."""
        if self.attention_factor != 1.0:
            cos, sin = rope_cos_sin(self.inv_freq, positions, torch.float32)
            return (cos * self.attention_factor).to(dtype), (sin * self.attention_factor).to(dtype)
        return rope_cos_sin(self.inv_freq, positions, dtype)

    def inv_freq_for(self, max_len: int) -> torch.Tensor:
        """The inverse frequencies keys are rotated with in a cache of `max_len` (context shift)."""
        return self.inv_freq

    def tie_weights(self) -> None:
        if self.args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, tokens: torch.Tensor, cache, positions: torch.Tensor | None = None,
                last_only: bool = False, hidden: bool = False, slots: torch.Tensor | None = None):
        """tokens (B, T) -> logits (B, T, vocab) float32, or (B, 1, vocab) with last_only; with
        `hidden`, (logits, the final normed hidden states) for exact_top() to rescore.

        The new tokens take cache slots [cache.length, cache.length + T); `positions` (T,) are their
        RoPE positions (default: the slots themselves). `slots` (B,): a batched decode step of rows
        at different lengths (forward_layout); the cache's length is then the caller's to keep.
        """
        B, T = tokens.shape
        start, positions, mask = forward_layout(T, cache, positions, slots, tokens.device)
        x = self.run_layers(self.embed(tokens), positions, cache, start, mask, slots)
        if slots is None:
            cache.length = start + T
        if last_only:
            x = x[:, -1:, :]
        h = self.model.norm(x)
        logits = self.output(h)
        return (logits, h) if hidden else logits

    def hidden_states(self, tokens: torch.Tensor, cache) -> torch.Tensor:
        """tokens (B, T) -> the final normed hidden states (B, T, hidden), without the head: what an
        embedding pools (runtime/embedder.py)."""
        T = tokens.shape[1]
        start, positions, mask = forward_layout(T, cache, None, None, tokens.device)
        x = self.run_layers(self.embed(tokens), positions, cache, start, mask, None)
        cache.length = start + T
        return self.model.norm(x)

    # the three steps a family may change (gemma3 scales the embedding, has two RoPE tables, caps logits)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(tokens)  # (B, T, hidden)

    def run_layers(self, x, positions, cache, start, mask, slots) -> torch.Tensor:
        cos, sin = per_row(*self.rope(positions, cache, x.dtype), slots)
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache, start, mask)
        return x

    def output(self, h: torch.Tensor) -> torch.Tensor:
        """Logits (..., vocab) float32 from the final normed hidden states."""
        return self.lm_head(h).float()
