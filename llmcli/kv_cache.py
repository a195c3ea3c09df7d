"""KV caches. A cache is an argument to the model's forward, never part of the model.

Interface every cache kind implements:
    length             tokens held (slots 0 .. length-1 are valid)
    max_len            capacity in tokens
    update(layer, start, k, v) -> (k_all, v_all)
                       store k, v (B, KV, T, D) at slots [start, start+T) and return the valid
                       part (B, KV, start+T, D) in the compute dtype, ready for attention
    reset()            forget everything (length = 0)
    truncate(n)        keep the first n tokens (a chat rolls back to a shared prefix)
    nbytes             bytes allocated
"""

from __future__ import annotations

import torch


class StaticKVCache:
    """Preallocated for the whole context in the compute dtype: (B, KV, max_len, D) per layer."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int,
                 device: torch.device, dtype: torch.dtype, batch: int = 1):
        shape = (batch, n_kv_heads, max_len, head_dim)
        # torch.empty: pages are only touched as the context fills, and no slot is read before written
        self.k = [torch.empty(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.v = [torch.empty(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.max_len = max_len
        self.length = 0

    @classmethod
    def for_model(cls, args, max_len: int, device: torch.device, dtype: torch.dtype, batch: int = 1):
        return cls(args.num_hidden_layers, args.num_key_value_heads, args.head_dim, max_len, device, dtype, batch)

    def update(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        end = start + k.shape[2]
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def reset(self) -> None:
        self.length = 0

    def truncate(self, n: int) -> None:
        self.length = min(self.length, max(0, n))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
