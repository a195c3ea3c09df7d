"""Quantized modules: drop-in replacements for nn.Linear and nn.Embedding over a packed weight.

One module per format (Int4Linear, Int8Linear) plus QuantEmbedding, which dequantizes only the rows
it looks up. A tied output head is a linear module sharing its embedding's packed weight. The packed
weight lives on the device it was made for: these modules are built in place, not moved with .to().
"""

from __future__ import annotations

import torch
from torch import nn

from .bnb_formats import LLMInt8Weight, NF4Weight, pack_nf4, quantize_nf4
from .gguf_blocks import BLOCKS, GGUFBlockWeight
from .packed import Int4Weight, Int8Weight
from .primitives import quantize


class QuantLinear(nn.Module):
    """y = x @ W.T + b with W held packed; the kernel is chosen per call (kernels.py)."""

    def __init__(self, packed, bias: torch.Tensor | None = None):
        super().__init__()
        self.packed = packed
        self.out_features, self.in_features = packed.shape
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.packed.matmul(x)
        if self.bias is None:
            return y
        return y + (self.bias if self.bias.dtype == y.dtype else self.bias.to(y.dtype))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.packed.dequantize(dtype)

    def weight_rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """Rows `ids` of W in `dtype`, or None where the packed layout cannot be read back."""
        if not getattr(self.packed, "rows_readable", False):
            return None
        return self.packed.rows(ids, dtype)

    def weight_dot_into(self, ids: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> bool:
        """out[ids] = rows ids of W . x in one call (GGUF blocks on the CPU: float64 sums); False where
        the packed layout has no such call (then weight_rows and a product)."""
        into = getattr(self.packed, "dot_rows_into", None)
        return bool(into is not None and self.bias is None and into(ids, x, out))

    @classmethod
    def concat(cls, modules: list["QuantLinear"]) -> "QuantLinear | None":
        """One module computing all of `modules`' outputs side by side (models/fusion.py): rows are
        independent, so the packed rows are simply stacked. None when the formats differ, or when a
        weight is in a GPU kernel's layout, which cannot be read back."""
        def key(p):
            return (type(p), p.group_size, p.symmetric, p.shape[1], p.device, getattr(p, "backend", None),
                    getattr(p, "type_name", None), getattr(p, "refined", None))

        first = modules[0].packed
        if type(first) not in (Int4Weight, Int8Weight, GGUFBlockWeight) or getattr(first, "backend", None) == "tinygemm" \
                or any(key(m.packed) != key(first) for m in modules):
            return None
        packed = type(first).stacked([m.packed for m in modules])
        if packed is None:  # through the portable form: unpack, concatenate, pack again
            states = [m.packed.state() for m in modules]
            packed = type(first).from_state({k: torch.cat([s[k] for s in states]) for k in states[0]}, first.device)
        bias = None
        if any(m.bias is not None for m in modules):
            ref = next(m.bias for m in modules if m.bias is not None)
            bias = torch.cat([m.bias if m.bias is not None else ref.new_zeros(m.out_features) for m in modules])
        return cls(packed, bias)

    def extra_repr(self) -> str:
        p = self.packed
        return f"in={self.in_features}, out={self.out_features}, group={p.group_size}, symmetric={p.symmetric}"


class Int4Linear(QuantLinear):
    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 32, symmetric: bool = False, search: bool = True,
                    device: torch.device | None = None) -> "Int4Linear":
        q = quantize(linear.weight, 4, group_size, symmetric, search)
        device = device or linear.weight.device
        bias = None if linear.bias is None else linear.bias.detach().to(device)
        return cls(Int4Weight.from_codes(q.codes, q.scales, q.zeros, device), bias)


class Int8Linear(QuantLinear):
    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int | None = None, search: bool = True,
                    device: torch.device | None = None) -> "Int8Linear":
        """group_size None: one scale per output row."""
        K = linear.in_features
        q = quantize(linear.weight, 8, group_size or K, True, search)
        device = device or linear.weight.device
        bias = None if linear.bias is None else linear.bias.detach().to(device)
        return cls(Int8Weight.from_codes(q.codes, q.scales, device), bias)


class QuantEmbedding(nn.Module):
    """Token ids -> rows of a packed table, dequantized to `dtype` on the fly."""

    def __init__(self, packed, dtype: torch.dtype):
        super().__init__()
        self.packed = packed
        self.num_embeddings, self.embedding_dim = packed.shape
        self.dtype = dtype

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, bits: int, group_size: int | None = 32, symmetric: bool = True,
                       search: bool = True, dtype: torch.dtype | None = None) -> "QuantEmbedding":
        w = embedding.weight
        q = quantize(w, bits, group_size or w.shape[1], symmetric, search)
        if bits == 4:
            packed = Int4Weight.from_codes(q.codes, q.scales, q.zeros, w.device, rows_needed=True)
        else:
            packed = Int8Weight.from_codes(q.codes, q.scales, w.device, rows_needed=True)
        return cls(packed, dtype or w.dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.packed.rows(ids.reshape(-1), self.dtype).view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, bits={self.packed.bits}, group={self.packed.group_size}"


class NF4Linear(QuantLinear):
    """bitsandbytes' NF4 (bnb_formats.py): its CUDA kernels there, dequantized tiles elsewhere."""

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 64, device: torch.device | None = None) -> "NF4Linear":
        codes, absmax = quantize_nf4(linear.weight, group_size)
        device = device or linear.weight.device
        bias = None if linear.bias is None else linear.bias.detach().to(device)
        return cls(NF4Weight(pack_nf4(codes), absmax, device), bias)


class LLMInt8Linear(QuantLinear):
    """bitsandbytes' LLM.int8 (per-row int8, 16-bit outlier columns on CUDA)."""

    @classmethod
    def from_linear(cls, linear: nn.Linear, search: bool = True, device: torch.device | None = None) -> "LLMInt8Linear":
        q = quantize(linear.weight, 8, linear.in_features, True, search)
        device = device or linear.weight.device
        bias = None if linear.bias is None else linear.bias.detach().to(device)
        return cls(LLMInt8Weight(q.codes, q.scales, device), bias)


class GGUFBlockLinear(QuantLinear):
    """GGUF Q5_0/Q5_1/Q5_K/Q6_K blocks as stored in the file (gguf_blocks.py)."""

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.packed.type_name}"


def linear_class(spec) -> type[QuantLinear]:
    """The module class for a QuantSpec (or a bit width, for llmcli's own formats)."""
    kind, bits = ("int", spec) if isinstance(spec, int) else (spec.kind, spec.bits)
    if kind in BLOCKS:
        return GGUFBlockLinear
    if kind == "nf4":
        return NF4Linear
    if kind == "llm_int8":
        return LLMInt8Linear
    return Int4Linear if bits == 4 else Int8Linear
