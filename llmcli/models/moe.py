"""What mixture-of-experts families share: a router over the experts, the experts themselves (each a
SwiGLU MLP, llama.MLP, of its own Linear modules, named as the Hub's checkpoints name them:
`mlp.gate.weight`, `mlp.experts.3.gate_proj.weight`, so a checkpoint's and a GGUF's expert matrices
load, quantize and pack as any other projection), an optional shared expert, and the decoder layer
that holds them. The families (qwen3moe.py, qwen2moe.py, mixtral.py, olmoe.py, gpt_oss.py) only choose.

A token's hidden state goes to the `top_k` experts its router scores highest; their outputs are
summed, weighted by the router's probabilities. The experts run one at a time over the rows routed
to them (a prompt's tokens grouped by expert: each expert's weights read once a call).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import llama
from .linear import Linear


class ExpertArgs:
    """What one expert's llama.MLP reads of the model's args: its sizes, no bias."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        self.hidden_size, self.intermediate_size, self.mlp_bias = hidden_size, intermediate_size, False


class SparseMoe(nn.Module):
    """The experts of one layer behind its router (args: models/args.py's MoeArgs), and its shared
    expert where the family has one. `expert()` makes a family's own expert (gpt_oss.py's: biases, a
    clamped SwiGLU), else each is a SwiGLU llama.MLP; `router_bias`: the router's logits have one."""

    def __init__(self, args, act=F.silu, expert=None, router_bias: bool = False):
        super().__init__()
        self.top_k, self.normalize, self.softmax_first = args.num_experts_per_tok, args.norm_topk_prob, args.softmax_first
        h = args.hidden_size
        self.gate = Linear(h, args.num_experts, bias=router_bias)
        expert = expert or (lambda: llama.MLP(ExpertArgs(h, args.moe_intermediate_size), act))
        self.experts = nn.ModuleList(expert() for _ in range(args.num_experts))
        if args.shared_expert_intermediate_size:
            self.shared_expert = llama.MLP(ExpertArgs(h, args.shared_expert_intermediate_size), act)
            self.shared_expert_gate = Linear(h, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (T, hidden) -> (weights (T, k) in x's dtype, expert ids (T, k))."""
        logits = self.gate(x.to(self.gate.weight.dtype))  # (a router is kept in float32: quant/convert.py)
        if self.softmax_first:
            weights, ids = torch.softmax(logits, dim=-1, dtype=torch.float32).topk(self.top_k, dim=-1)
            if self.normalize:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        else:
            top, ids = logits.topk(self.top_k, dim=-1)
            weights = torch.softmax(top, dim=-1, dtype=torch.float32)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, ids = self.route(x)
        out = torch.zeros_like(x)
        for e in ids.unique().tolist():
            rows, slot = torch.where(ids == e)
            y = self.experts[e](x[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(out.dtype))
        if hasattr(self, "shared_expert"):
            gate = self.shared_expert_gate(x.to(self.shared_expert_gate.weight.dtype)).to(x.dtype)
            out = out + torch.sigmoid(gate) * self.shared_expert(x)
        return out.view(shape)

    def fuse(self) -> None:
        """Nothing: a fused gate/up would copy every expert's blocks out of the file's map (all experts
        are resident or mapped; a token reads only its few)."""


class DecoderLayer(llama.DecoderLayer):
    """llama's layer (its forward) with the experts as its MLP where the layer is sparse, and the
    family's attention."""

    Attention = llama.Attention

    def __init__(self, args, layer_idx: int):
        nn.Module.__init__(self)  # (not llama's: it would make a dense MLP first)
        self.self_attn = self.Attention(args, layer_idx)
        self.mlp = SparseMoe(args) if args.sparse(layer_idx) else llama.MLP(args)
        self.input_layernorm = llama.RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = llama.RMSNorm(args.hidden_size, args.rms_norm_eps)


class Transformer(llama.Transformer):
    Layer = DecoderLayer
