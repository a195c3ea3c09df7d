"""The torch-free CPU path's KV cache: numpy float16 (or float32) arrays (rows, KV, max_len, D) a
layer, written in place by the native step (runtime/lean.py). np.zeros maps zero pages: memory is
taken as the context fills, as StaticKVCache's torch.empty does."""

from __future__ import annotations

import numpy as np

from .slots import CacheSlots


class HostKVCache(CacheSlots):
    """Keys and values of every layer, `k[l]`, `v[l]`: (rows, KV, max_len, D); `token_ids` lists the
    ids in a one-row cache's slots (cache.reuse_prefix keeps it)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int, dtype=np.float16, rows: int = 1):
        shape = (n_layers, rows, n_kv_heads, max_len, head_dim)
        self.k_layers, self.v_layers = np.zeros(shape, dtype), np.zeros(shape, dtype)
        self.k, self.v = list(self.k_layers), list(self.v_layers)
        self.max_len, self.length = max_len, 0
        self.token_ids: list[int] = []

    @classmethod
    def for_model(cls, args, max_len: int, dtype=np.float16, rows: int = 1) -> "HostKVCache":
        return cls(args.num_hidden_layers, args.num_key_value_heads, args.head_dim, max_len, dtype, rows)

    @property
    def nbytes(self) -> int:
        return self.k_layers.nbytes + self.v_layers.nbytes
