"""The static KV cache, and the interface every cache kind implements.

Interface every cache kind implements:
    length             tokens held (slots 0 .. length-1 are valid)
    max_len            capacity in tokens
    update(layer, start, k, v) -> (k_all, v_all)
                       store k, v (B, KV, T, D) at slots [start, start+T) and return the valid
                       part (B, KV, start+T, D) in the compute dtype, ready for attention
    reset()            forget everything (length = 0)
    truncate(n)        keep the first n tokens (a chat rolls back to a shared prefix; speculative
                       decoding drops rejected draft tokens)
    shift(keep, drop, rerotate)
                       drop slots [keep, keep+drop), move the rest down by `drop`; moved keys go
                       through `rerotate(k, drop)` (context_shift.py) so their RoPE positions follow
    nbytes             bytes allocated
`token_ids` on the cache lists the ids in its slots (cache.reuse_prefix keeps it).
"""

from __future__ import annotations

import torch

from .one_thread import one_thread
from .slots import CacheSlots


class StaticKVCache(CacheSlots):
    """Preallocated for the whole context: (B, KV, max_len, D) per layer.

    Stored in `dtype`; when the model computes in another `compute_dtype` (a bf16 cache under a
    float32 model), update() converts the valid part into one buffer shared by all layers, made at
    the first update() (the native step reads a float16 cache as it is, and never needs it)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int,
                 device: torch.device, dtype: torch.dtype, batch: int = 1, compute_dtype: torch.dtype | None = None):
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        # torch.empty: pages are only touched as the context fills, and no slot is read before written.
        # Every layer's in one tensor (k_layers, v_layers; self.k[l] is layer l's): a row's slots move
        # or are copied out for every layer in one op (move_row, the prompt cache), not one a layer
        # (each op's dispatch costs more than its copy, twice the layers a finished request)
        self.k_layers = torch.empty(shape, device=device, dtype=dtype)
        self.v_layers = torch.empty(shape, device=device, dtype=dtype)
        self.k, self.v = list(self.k_layers.unbind(0)), list(self.v_layers.unbind(0))
        self.max_len = max_len
        self.length = 0
        self._out = None
        self._out_dtype = compute_dtype if compute_dtype is not None and compute_dtype != dtype else None

    @classmethod
    def for_model(cls, args, max_len: int, device: torch.device, dtype: torch.dtype, batch: int = 1,
                  compute_dtype: torch.dtype | None = None):
        return cls(args.num_hidden_layers, args.num_key_value_heads, args.head_dim, max_len, device, dtype, batch,
                   compute_dtype)

    @property
    def out(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(k, v) conversion buffers when the storage dtype is not the compute dtype, else None."""
        if self._out is None and self._out_dtype is not None:
            if self.parent is not None:  # a row view: that row of its cache's buffers
                self._out = tuple(t[self.index:self.index + 1] for t in self.parent.out)
            else:
                k = self.k[0]
                self._out = (torch.empty(k.shape, device=k.device, dtype=self._out_dtype),
                             torch.empty(k.shape, device=k.device, dtype=self._out_dtype))
        return self._out

    def update(self, layer: int, start, k: torch.Tensor, v: torch.Tensor):
        if isinstance(start, torch.Tensor):
            return self._update_rows(layer, start, k, v)
        end = start + k.shape[2]
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        if self.out is None:
            return self.k[layer][:, :, :end], self.v[layer][:, :, :end]
        ko, vo = self.out
        ko[:, :, :start] = self.k[layer][:, :, :start]
        vo[:, :, :start] = self.v[layer][:, :, :start]
        ko[:, :, start:end] = k  # the new tokens as computed
        vo[:, :, start:end] = v
        return ko[:, :, :end], vo[:, :, :end]

    def _update_rows(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """A batched decode step (batched.py): row b of rows [0, B) stores its one token (k, v: (B, KV, 1, D))
        at slot slots[b]; those rows' first `length` slots come back, the rows' own masks hiding
        what lies past each one's end."""
        B, n = k.shape[0], self.length
        rows = torch.arange(B, device=k.device)
        kl, vl = self.k[layer][:B], self.v[layer][:B]
        kl[rows, :, slots] = k[:, :, 0].to(kl.dtype)
        vl[rows, :, slots] = v[:, :, 0].to(vl.dtype)
        if self._out_dtype is None:
            return kl[:, :, :n], vl[:, :, :n]
        return kl[:, :, :n].to(self._out_dtype), vl[:, :, :n].to(self._out_dtype)

    def move_row(self, src: int, dst: int, n: int) -> None:
        """Row dst takes row src's first n slots (batched.py keeps its live rows at the front)."""
        with one_thread():
            for t in (self.k_layers, self.v_layers):
                t[:, dst, :, :n] = t[:, src, :, :n]

    def shift(self, keep: int, drop: int, rerotate) -> None:
        shift_layers(self.k, self.v, keep, drop, self.length, rerotate)
        self.length -= drop

    def reorder(self, rows: torch.Tensor) -> None:
        """Row i takes what row rows[i] held, in the valid slots (beam search following its beams)."""
        n = self.length
        for t in self.k + self.v:
            t[:, :, :n] = t[:, :, :n].index_select(0, rows)

    parent: "StaticKVCache | None" = None  # a row view's cache, and which row of it (row())
    index = 0

    def row(self, i: int) -> "StaticKVCache":
        """A batch-1 view of row i sharing this cache's storage (writes land in that row)."""
        view = object.__new__(StaticKVCache)
        view.k_layers, view.v_layers = self.k_layers[:, i:i + 1], self.v_layers[:, i:i + 1]
        view.k, view.v = [t[i:i + 1] for t in self.k], [t[i:i + 1] for t in self.v]
        view._out, view._out_dtype = None, self._out_dtype
        view.max_len, view.length = self.max_len, self.length
        view.parent, view.index = self, i
        return view

    @property
    def nbytes(self) -> int:
        out = list(self._out) if self._out is not None else []
        return sum(t.numel() * t.element_size() for t in self.k + self.v + out)


def shift_layers(ks: list[torch.Tensor], vs: list[torch.Tensor], keep: int, drop: int, n: int, rerotate) -> None:
    """Drop slots keep..keep+drop-1 of (B, H, S, D) layers holding n slots: the later ones move down,
    keys re-rotated by -drop positions (context_shift.py)."""
    for k, v in zip(ks, vs):
        k[:, :, keep:n - drop] = rerotate(k[:, :, keep + drop:n], drop)
        v[:, :, keep:n - drop] = v[:, :, keep + drop:n].clone()  # the ranges overlap
