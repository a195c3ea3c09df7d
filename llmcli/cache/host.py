"""The torch-free CPU path's KV cache: numpy float16 (or float32) arrays (rows, KV, max_len, D) a
layer, written in place by the native step (runtime/lean.py), in an anonymous map of the kernel's
zero pages: memory is taken as the context fills, 4 KiB at a time, as StaticKVCache's torch.empty
does. (np.zeros asks for transparent huge pages on large arrays: every layer's first token then
zeroed 2 MiB of keys and 2 MiB of values, 40-120 ms before a session's first token.)"""

from __future__ import annotations

import mmap

import numpy as np

from .slots import CacheSlots


class HostKVCache(CacheSlots):
    """Keys and values of every layer, `k[l]`, `v[l]`: (rows, KV, max_len, D); `token_ids` lists the
    ids in a one-row cache's slots (cache.reuse_prefix keeps it)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int, dtype=np.float16, rows: int = 1):
        shape = (n_layers, rows, n_kv_heads, max_len, head_dim)
        self.k_layers, self.v_layers = _zeros(shape, dtype), _zeros(shape, dtype)
        self.k, self.v = list(self.k_layers), list(self.v_layers)
        self.max_len, self.length = max_len, 0
        self.token_ids: list[int] = []

    @classmethod
    def for_model(cls, args, max_len: int, dtype=np.float16, rows: int = 1) -> "HostKVCache":
        return cls(args.num_hidden_layers, args.num_key_value_heads, args.head_dim, max_len, dtype, rows)

    def move_row(self, src: int, dst: int, n: int) -> None:
        """Row dst takes row src's first n slots (batched.py keeps its live rows at the front)."""
        for t in (self.k_layers, self.v_layers):
            t[:, dst, :, :n] = t[:, src, :, :n]

    @property
    def nbytes(self) -> int:
        return self.k_layers.nbytes + self.v_layers.nbytes


def _zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Zeros in their own anonymous map (small pages; see the module's docstring)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    return np.frombuffer(mmap.mmap(-1, max(n, 1)), dtype=dtype, count=int(np.prod(shape))).reshape(shape)
