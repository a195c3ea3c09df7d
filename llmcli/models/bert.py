"""BERT: the bidirectional encoder of sentence-embedding models (all-MiniLM-L6-v2, BGE, E5, ...).

Word + position + token-type embeddings, then post-LN layers: self-attention over every token of
the text (padding masked out), a residual and LayerNorm, a GELU MLP, a residual and LayerNorm.
No cache and no head: `forward(tokens, mask) -> hidden states`, which models/pooling.py turns into
one vector per text. Parameter names follow transformers' `BertModel` (`encoder.layer.0.attention.
self.query.weight`), so sentence-transformers checkpoints load as they are; `bert.`-prefixed ones
(BertForMaskedLM and the like) lose the prefix, and heads (`cls.*`, `pooler.*`) are dropped.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from .args import BertArgs as ModelArgs  # noqa: F401 (re-exported)
from .linear import Linear

ACTIVATIONS = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
               "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


class Embeddings(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.token_type_embeddings = nn.Embedding(args.type_vocab_size, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def forward(self, tokens: torch.Tensor, token_types: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.word_embeddings(tokens) + self.token_type_embeddings(token_types) + self.position_embeddings(positions)
        return self.LayerNorm(x)  # (B, T, hidden)


class SelfAttention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        h = args.hidden_size
        self.query, self.key, self.value = Linear(h, h), Linear(h, h), Linear(h, h)


class Projection(nn.Module):
    """dense, then LayerNorm of (its output + the residual): BertSelfOutput and BertOutput."""

    def __init__(self, n_in: int, args: ModelArgs):
        super().__init__()
        self.dense = Linear(n_in, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.head_dim = args.num_attention_heads, args.head_dim
        self.self = SelfAttention(args)
        self.output = Projection(args.hidden_size, args)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        q, k, v = (p(x).view(B, T, H, D).transpose(1, 2) for p in (self.self.query, self.self.key, self.self.value))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, D), every token sees every real one
        return self.output(y.transpose(1, 2).reshape(B, T, H * D), x)


class Intermediate(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dense = Linear(args.hidden_size, args.intermediate_size)
        self.act = ACTIVATIONS[args.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class Layer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.intermediate = Intermediate(args)
        self.output = Projection(args.intermediate_size, args)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class Transformer(nn.Module):
    """`forward(tokens, mask) -> hidden states`; the module tree mirrors transformers' BertModel."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embeddings = Embeddings(args)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(Layer(args) for _ in range(args.num_hidden_layers))
        self._register_load_state_dict_pre_hook(_checkpoint_names)

    @staticmethod
    def rope_buffers(args: ModelArgs) -> dict[str, torch.Tensor]:
        return {}  # absolute position embeddings: no RoPE tables

    def tie_weights(self) -> None:
        pass

    def fuse(self) -> "Transformer":
        return self

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None,
                token_types: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (B, T), mask (B, T) bool (True: a real token; None: all are) -> (B, T, hidden)."""
        if tokens.shape[1] > self.args.max_position_embeddings:
            raise ValueError(f"{tokens.shape[1]} tokens; this encoder has {self.args.max_position_embeddings} positions")
        x = self.embeddings(tokens, torch.zeros_like(tokens) if token_types is None else token_types)
        attn = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, T): keys to attend to
        for layer in self.encoder.layer:
            x = layer(x, attn)
        return x


def _checkpoint_names(state_dict, prefix, *args) -> None:
    """Names as BertModel's: `bert.` prefixes off; the pooler, MLM/NSP heads and position_ids
    buffer (none of which a sentence vector uses) dropped."""
    for key in list(state_dict):
        name = key[len(prefix):]
        if name.startswith("bert."):
            state_dict[prefix + name[5:]] = state_dict.pop(key)
            name = name[5:]
        if name.startswith(("pooler.", "cls.")) or name == "embeddings.position_ids":
            state_dict.pop(prefix + name)
