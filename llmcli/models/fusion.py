"""Fusing projections that read the same input into one module: [q; k; v] and [gate; up].

One larger GEMM (or GEMV when decoding) costs less than several small ones, mostly in per-call
overhead, which dominates small models. Dense `nn.Linear`s (and subclasses) are concatenated along their outputs;
quantized formats fuse through their own `concat` classmethod (rows are independent in every
weight-only format), and a mix of formats stays unfused.
"""

from __future__ import annotations

import torch
from torch import nn


def fuse_linears(linears: list[nn.Module]) -> nn.Module | None:
    """One module whose output is the concatenation of the given modules' outputs, or None."""
    kind = type(linears[0])
    if any(type(m) is not kind for m in linears):
        return None
    if issubclass(kind, nn.Linear):
        weight = torch.cat([m.weight for m in linears])  # (sum of out, in)
        fused = kind(1, 1, bias=False)  # a shell: its parameters are replaced right away
        fused.out_features, fused.in_features = weight.shape
        fused.weight = nn.Parameter(weight, requires_grad=False)
        if any(m.bias is not None for m in linears):
            fused.bias = nn.Parameter(torch.cat([
                m.bias if m.bias is not None else weight.new_zeros(m.out_features) for m in linears]),
                requires_grad=False)
        return fused
    concat = getattr(kind, "concat", None)
    return concat(linears) if concat is not None else None
