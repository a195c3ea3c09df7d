"""bitsandbytes' formats, for people who know them from transformers: NF4 and LLM.int8.

    nf4        4-bit NormalFloat: each value is one of 16 levels spaced for normally distributed
               weights, times its block's absmax (blocks of 64 along K by default)
    llm_int8   8-bit rows, w = q * absmax / 127; at run time bitsandbytes keeps the input columns
               with outliers (|x| > 6) in 16 bits (Dettmers et al., LLM.int8())

Both are stored in bitsandbytes' own layout (NF4: two codes per byte, the first in the high nibble;
absmax float32), so on CUDA its kernels run them as they are. Elsewhere NF4 runs as dequantized
tiles and LLM.int8 as llmcli's per-row int8 (the outlier split is a CUDA-side trick).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from .packed import Int8Weight, _dense_tiles

NF4_LEVELS = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
              -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
              0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
              0.7229568362236023, 1.0)
LLM_INT8_THRESHOLD = 6.0


@lru_cache(maxsize=1)
def bitsandbytes():
    """The bitsandbytes module, or None where it is not installed (it is optional on macOS)."""
    try:
        import bitsandbytes
    except Exception:  # ImportError, or a build that fails to load its native library
        return None
    return bitsandbytes


def use_bitsandbytes(device: torch.device) -> bool:
    return device.type == "cuda" and bitsandbytes() is not None


# ----------------------------------------------------------------------------------------- NF4


def quantize_nf4(w: torch.Tensor, block: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) -> codes (N, K) uint8 in 0..15 and absmax (N, K/block) float32: nearest level."""
    N, K = w.shape
    g = w.detach().float().reshape(N, K // block, block)
    absmax = g.abs().amax(-1)
    normed = g / torch.where(absmax == 0, torch.ones_like(absmax), absmax).unsqueeze(-1)
    levels = torch.tensor(NF4_LEVELS)
    codes = torch.bucketize(normed, (levels[1:] + levels[:-1]) / 2)
    return codes.to(torch.uint8).view(N, K), absmax


def pack_nf4(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) codes -> (N, K/2) bytes, the first of each pair in the high nibble (bitsandbytes)."""
    c = codes.to(torch.uint8)
    return (c[:, 0::2] << 4) | c[:, 1::2]


def unpack_nf4(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack((packed >> 4, packed & 15), dim=-1).view(packed.shape[0], -1)


def dequantize_nf4(codes: torch.Tensor, absmax: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    N, K = codes.shape
    levels = torch.tensor(NF4_LEVELS, dtype=dtype, device=codes.device)
    w = levels[codes.long()].view(N, absmax.shape[1], -1) * absmax.to(dtype).unsqueeze(-1)
    return w.view(N, K)


class NF4Weight:
    """The packed-weight interface of packed.py over NF4 blocks."""

    bits = 4
    symmetric = True

    def __init__(self, qweight: torch.Tensor, absmax: torch.Tensor, device: torch.device, rows_needed: bool = False):
        N, K = qweight.shape[0], qweight.shape[1] * 2
        self.shape, self.group_size, self.device = (N, K), K // absmax.shape[1], device
        self.qweight, self.absmax = qweight.to(device), absmax.float().to(device)
        self.quant_state = None
        if use_bitsandbytes(device) and not rows_needed:
            self.quant_state = self.bnb_state()

    def bnb_state(self):
        """bitsandbytes' QuantState for this weight (blocks run along the row-major flattening,
        which with whole blocks per row is our (N, K/B) absmax)."""
        F = bitsandbytes().functional
        return F.QuantState(absmax=self.absmax.reshape(-1), shape=torch.Size(self.shape),
                            code=torch.tensor(NF4_LEVELS, device=self.device), blocksize=self.group_size,
                            quant_type="nf4", dtype=torch.bfloat16)

    @classmethod
    def from_state(cls, state: dict, device: torch.device, rows_needed: bool = False) -> "NF4Weight":
        return cls(state["qweight"], state["absmax"], device, rows_needed)

    def _tile_t(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_nf4(unpack_nf4(self.qweight[start:stop]), self.absmax[start:stop], dtype).t()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant_state is not None:
            self.quant_state.dtype = x.dtype
            packed = self.qweight.reshape(-1, 1)  # bitsandbytes keeps (N*K/2, 1) bytes
            return bitsandbytes().matmul_4bit(x, packed.t(), quant_state=self.quant_state)
        return _dense_tiles(x, *self.shape, self._tile_t)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_nf4(unpack_nf4(self.qweight[ids]), self.absmax[ids], dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._tile_t(0, self.shape[0], dtype).t()

    def state(self) -> dict[str, torch.Tensor]:
        return {"qweight": self.qweight.cpu(), "absmax": self.absmax.cpu()}

    @property
    def nbytes(self) -> int:
        N, K = self.shape
        return N * K // 2 + N * K // self.group_size * 4


# ------------------------------------------------------------------------------------ LLM.int8


class LLMInt8Weight(Int8Weight):
    """Per-row int8 (absmax = 127 * scale); on CUDA bitsandbytes' mixed int8/16-bit matmul."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, device: torch.device, rows_needed: bool = False):
        super().__init__(qweight, scales, device, rows_needed)
        self.bnb = None
        if use_bitsandbytes(device) and not rows_needed:
            state = bitsandbytes().MatmulLtState()
            state.CB, state.SCB = self.qweight, (self.scales.float() * 127).view(-1)
            state.threshold, state.has_fp16_weights, state.is_training = LLM_INT8_THRESHOLD, False, False
            self.bnb = state

    @classmethod
    def from_state(cls, state: dict, device: torch.device, rows_needed: bool = False) -> "LLMInt8Weight":
        return cls(state["qweight"], state["scales"], device, rows_needed)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.bnb is not None:
            return bitsandbytes().matmul(x.to(torch.float16), self.qweight, state=self.bnb).to(x.dtype)
        return super().matmul(x)

