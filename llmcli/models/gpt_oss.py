"""gpt-oss (gpt-oss-20b, gpt-oss-120b): a mixture of experts in every layer, and attention of its own.

What differs from the other mixtures of experts (models/moe.py), and nothing else:
- attention: q, k, v and o with biases; each head has a learned sink, a logit added to the softmax's
  denominator (a slot every query may attend to that holds no value), so a head can attend to
  "nothing"; even layers see the last `sliding_window` (128) positions, odd layers all of them;
  RoPE with YaRN scaling (models/rope.py), its cos/sin scaled by the attention factor (llama.py).
- the router has a bias; the top k logits' softmax weighs the chosen experts (moe.SparseMoe).
- each expert has biases and a clamped SwiGLU: gate clamped above and up on both sides at `limit`
  (7), then (up + 1) * gate * sigmoid(alpha * gate), alpha 1.702.

The Hub's checkpoints hold each layer's experts as three 3-D tensors (`mlp.experts.gate_up_proj`
(E, hidden, 2I), gate and up interleaved in its columns; `down_proj` (E, I, hidden)), or as MXFP4
`*_blocks` and `*_scales`; formats/hf_folder.py splits them into these modules' per-expert
matrices (HF's `mlp.router` is `mlp.gate` here, the name the other families' routers have), as
formats/gguf.py splits llama.cpp's ffn_{gate,up,down}_exps.
"""

from __future__ import annotations

import torch
from torch import nn

from . import llama, moe
from .args import GptOssArgs as ModelArgs  # noqa: F401 (re-exported)
from .linear import Linear

QUERY_CHUNK = 256  # queries scored at a time: a long prompt's (heads, T, S) scores stay small


class Expert(nn.Module):
    """One expert: gate, up and down with biases and gpt-oss's clamped SwiGLU."""

    act = "clamped_swiglu"  # (what runtime/native_step.py matches the C++ step's activation by)

    def __init__(self, hidden: int, intermediate: int, alpha: float, limit: float):
        super().__init__()
        self.alpha, self.limit = alpha, limit
        self.gate_proj = Linear(hidden, intermediate, bias=True)
        self.up_proj = Linear(hidden, intermediate, bias=True)
        self.down_proj = Linear(intermediate, hidden, bias=True)

    def fuse(self) -> None:
        """Nothing (the experts are read from the file's map as they are: moe.SparseMoe.fuse)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x).clamp(max=self.limit)  # (rows, I)
        up = self.up_proj(x).clamp(-self.limit, self.limit)
        return self.down_proj((up + 1) * gate * torch.sigmoid(gate * self.alpha))


class Attention(llama.Attention):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__(args, layer_idx)
        self.sinks = nn.Parameter(torch.empty(self.n_heads))  # (H,) one logit a head

    def forward(self, x, cos, sin, cache, start, mask) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        k, v = cache.update(self.layer_idx, start, k, v)  # (B, KV, S, D): the valid part only
        allowed = _allowed(mask, start, T, k.shape[2], self.window, x.device)
        y = attend_with_sinks(q, k, v, allowed, self.sinks, self.head_dim ** -0.5)  # (B, H, T, D)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


def _allowed(mask, start, T: int, S: int, window: int | None, device) -> torch.Tensor:
    """Which keys each query sees: bool (T, S), or (B, 1, 1, S) in a batched decode step (llama.py's
    forward_layout masks), causal and within the window where the layer has one."""
    if window is not None and S > window:
        return llama._window_mask(mask, start, T, S, window, device)
    if mask is not None:
        return mask
    q_slot = torch.arange(start, start + T, device=device)[:, None]  # (mask None: plainly causal)
    return torch.arange(S, device=device)[None, :] <= q_slot


def attend_with_sinks(q, k, v, allowed, sinks, scale: float) -> torch.Tensor:
    """q (B, H, T, D), k and v (B, KV, S, D), `allowed` bool broadcastable to (B, 1, T, S), sinks
    (H,) -> (B, H, T, D): softmax over the keys and the head's sink logit, the sink's share dropped
    (it has no value). Scores in float32; the H/KV query heads of a KV head are scored together
    (no copy of k and v for grouped-query attention)."""
    B, H, T, D = q.shape
    KV = k.shape[1]
    q = q.view(B, KV, H // KV, T, D)  # head h = kv * (H/KV) + r, as transformers' repeat_kv
    kt, v = k.unsqueeze(2).transpose(-1, -2), v.unsqueeze(2)  # (B, KV, 1, D, S), (B, KV, 1, S, D)
    if allowed.dim() == 2:
        allowed = allowed[None, None]
    allowed = allowed.unsqueeze(2)  # (B or 1, 1, 1, T or 1, S)
    sink = sinks.float().view(1, KV, H // KV, 1, 1)
    out = []
    for t0 in range(0, T, QUERY_CHUNK):
        t1 = min(T, t0 + QUERY_CHUNK)
        scores = (q[:, :, :, t0:t1] @ kt).float() * scale  # (B, KV, H/KV, t, S)
        seen = allowed[..., t0:t1, :] if allowed.shape[-2] == T else allowed
        scores = scores.masked_fill(~seen, float("-inf"))
        scores = torch.cat((scores, sink.expand(*scores.shape[:-1], 1)), dim=-1)
        p = torch.softmax(scores, dim=-1)[..., :-1]  # (the sink's share dropped)
        out.append(p.to(v.dtype) @ v)  # (B, KV, H/KV, t, D)
    return torch.cat(out, dim=3).reshape(B, H, T, D)


class DecoderLayer(moe.DecoderLayer):
    def __init__(self, args: ModelArgs, layer_idx: int):
        nn.Module.__init__(self)
        self.self_attn = Attention(args, layer_idx)
        h, i = args.hidden_size, args.moe_intermediate_size
        self.mlp = moe.SparseMoe(args, expert=lambda: Expert(h, i, args.swiglu_alpha, args.swiglu_limit),
                                 router_bias=True)
        self.input_layernorm = llama.RMSNorm(h, args.rms_norm_eps)
        self.post_attention_layernorm = llama.RMSNorm(h, args.rms_norm_eps)


class Transformer(moe.Transformer):
    Layer = DecoderLayer
