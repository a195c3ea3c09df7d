"""Sentence vectors from a model's last hidden states: pooling over a text's tokens, then optionally
unit length, as sentence-transformers' Pooling and Normalize modules and llama.cpp's pooling types do.

    mean   the average of the text's token states (padding excluded)
    cls    the first token's state (BERT's [CLS])
    last   the last token's state (causal models: the only token that has seen the whole text)
    max    the largest value of each dimension over the tokens
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MODES = ("mean", "cls", "last", "max")


@dataclass(frozen=True)
class Pooling:
    mode: str  # one of MODES
    normalize: bool  # scale each vector to unit length (L2)
    source: str = ""  # where the choice comes from, for messages: "1_Pooling/config.json", "--pooling", ...

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"pooling {self.mode!r}; one of {', '.join(MODES)}")

    def describe(self) -> str:
        return f"{self.mode} pooling{', normalized' if self.normalize else ''}" + (f" ({self.source})" if self.source else "")


def pool(hidden: torch.Tensor, lengths: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """hidden (B, T, H) of right-padded texts, lengths (B,) of their real tokens -> (B, H) float32."""
    import torch
    import torch.nn.functional as F

    h = hidden.float()
    B, T, _ = h.shape
    valid = torch.arange(T, device=h.device)[None, :] < lengths[:, None]  # (B, T)
    if pooling.mode == "mean":
        # sentence-transformers: sum of masked states / number of tokens (clamped as it does)
        out = (h * valid[..., None]).sum(1) / valid.sum(1, keepdim=True).clamp(min=1e-9)
    elif pooling.mode == "cls":
        out = h[:, 0]
    elif pooling.mode == "last":
        out = h[torch.arange(B, device=h.device), lengths - 1]
    else:  # max
        out = h.masked_fill(~valid[..., None], float("-inf")).amax(1)
    return F.normalize(out, p=2, dim=1) if pooling.normalize else out


def pool_one(hidden, pooling: Pooling):
    """hidden (T, H) numpy float32 states of one text (no padding) -> (H,) float32: pool()'s result
    for it, without torch (the torch-free path's embeddings)."""
    import numpy as np

    h = np.asarray(hidden, dtype=np.float32)
    out = {"mean": lambda: h.mean(0), "cls": lambda: h[0], "last": lambda: h[-1], "max": lambda: h.max(0)}[pooling.mode]()
    out = np.asarray(out, dtype=np.float32)
    if pooling.normalize:  # F.normalize's: x / max(||x||, 1e-12)
        out = out / max(float(np.linalg.norm(out)), 1e-12)
    return out.astype(np.float32)
