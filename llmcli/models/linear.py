"""The dense projection every model file uses: `nn.Linear` with a faster one-row path.

Decoding feeds one token, so each projection is a matrix-vector product. On CPU, `torch.mv`
reaches the GEMV kernel directly and is faster in bf16 than `F.linear`'s GEMM path
(docs/performance-choices.md); elsewhere it is the same cuBLAS/MPS call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == self.in_features:  # (..., in) holding a single row
            y = torch.mv(self.weight, x.reshape(-1))
            if self.bias is not None:
                y = y + self.bias
            return y.view(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)

    def weight_rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.weight[ids].to(dtype)
