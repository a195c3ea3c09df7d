"""GGUF blocks kept as they are in the file: a packed format of llmcli's for the GGUF types whose
codes do not fit the int4 kernel (5 and 6 bits), so they cost no more memory than in the file, and
where a SIMD variant of the kernels runs (native.int8_dot(): AVX-512 VNNI, AVX-VNNI, AVX2, NEON with
dot products) also for Q4_0, Q4_1, Q8_0, Q4_K and MXFP4 (gpt-oss's experts). The kernels multiply
all of these but Q5_K with integer dot products (activations quantized to int8 per 32, as llama.cpp
does), faster than torch's int4 kernel and a float path (docs/performance-choices.md).

    Q4_0   18 bytes / 32:  d f16, qs[16]                            w = d * (q - 8)
    Q4_1   20 bytes / 32:  d, m f16, qs[16]                         w = d * q + m
    Q8_0   34 bytes / 32:  d f16, qs[32] int8                       w = d * q
    Q4_K  144 bytes / 256: d, dmin f16, scales[12], qs[128]          w = d*sc * q - dmin*m, per 32
    MXFP4  17 bytes / 32:  e e8m0, qs[16] e2m1 codes                w = kvalues[q] * 2^(e - 128)

    Q5_0   22 bytes / 32:  d f16, qh u32 (5th bits), qs[16]          w = d * (q - 16)
    Q5_1   24 bytes / 32:  d, m f16, qh u32, qs[16]                 w = d * q + m
    Q5_K  176 bytes / 256: d, dmin f16, scales[12], qh[32], qs[128]  w = d*sc * q - dmin*m, per 32
    Q6_K  210 bytes / 256: ql[128], qh[64], scales[16] i8, d f16     w = d*sc * (q - 32), per 16

    F16     2 bytes / 1:   an IEEE half                              w = the half
    BF16    2 bytes / 1:   a bfloat16 (a float32's top 16 bits)      w = the bfloat16

F16 and BF16 rows (GGUF files of those types, and safetensors folders held as stored on the CPU:
quant/float_rows.py) multiply with float32 activations as they are, never int8 ones.

A (N, K) weight is its (N, K/B*bytes) rows of blocks. Decoding (few rows) runs a C++ kernel that
reads the blocks (native/src/matmul.cpp); prefill, and machines without a compiler, dequantize a tile of
rows to the activation dtype and run a dense GEMM. Nothing is rounded a second time.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import native
from ..native.checks import TYPE_IDS  # noqa: F401 (the kernel's switch; re-exported)
from ..native.interleave import interleave_rows
from ..formats.gguf import unpermute_rows
from . import kernels
from .packed import _dense_tiles

# Types that fit torch's int4/int8 kernels too, kept as blocks only where a SIMD kernel variant runs
# (gguf_import.as_stored_preset): its integer dot products (activations as int8, as llama.cpp takes
# them) beat torch's int4 kernel there. type -> (elements per block, bytes per block)
INT8_DOT_BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34), "Q4_K": (256, 144), "MXFP4": (32, 17)}
FLOAT_ROWS = {"F16": (1, 2), "BF16": (1, 2)}  # 16-bit floats, rows of K (float32 activations)
BLOCKS = {"Q5_0": (32, 22), "Q5_1": (32, 24), "Q5_K": (256, 176), "Q6_K": (256, 210), **INT8_DOT_BLOCKS, **FLOAT_ROWS}
INT8_DOT_TYPES = (*INT8_DOT_BLOCKS, "Q6_K", "Q5_0", "Q5_1")  # what the kernel multiplies with int8 activations
BITS = {"Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q6_K": 6, "Q4_0": 4, "Q4_1": 4, "Q8_0": 8, "Q4_K": 4, "F16": 16, "BF16": 16,
        "MXFP4": 4}
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # ggml's kvalues_mxfp4 (e2m1 doubled)
STEP_TYPES = frozenset(TYPE_IDS)  # the block types the native step (runtime/native_step.py) multiplies
# llmcli's group-wise formats that are a block type exactly (codes as they are, scales in f16), held as
# those blocks where INT8_DOT_BLOCKS are (quant/held.py): (bits, group size, symmetric) -> type
FROM_LLMCLI = {(4, 32, False): "Q4_1", (4, 32, True): "Q4_0", (8, 32, True): "Q8_0"}


def row_bytes(type_name: str, K: int) -> int:
    size, nbytes = BLOCKS[type_name]
    return K // size * nbytes


def _f16(b: torch.Tensor) -> torch.Tensor:
    """(..., 2) bytes -> (..., 1) float32 values of little-endian float16."""
    return b.contiguous().view(torch.float16).float()


def _nibble_pairs(qs: torch.Tensor) -> torch.Tensor:
    """(..., 4, 32) bytes -> (..., 8, 32): per 64 elements, the low nibbles, then the high ones."""
    return torch.stack((qs & 15, qs >> 4), dim=-2).flatten(-3, -2)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., 12) bytes -> 6-bit scales and mins (..., 8) as float32 (ggml's get_scale_min_k4)."""
    lo_sc, lo_m = s[..., 0:4] & 63, s[..., 4:8] & 63
    hi_sc = (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)
    hi_m = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return torch.cat((lo_sc, hi_sc), -1).float(), torch.cat((lo_m, hi_m), -1).float()


def dequantize_blocks(blocks: torch.Tensor, type_name: str, K: int) -> torch.Tensor:
    """(n, row bytes) uint8 -> (n, K) float32, with torch ops (the portable path)."""
    n = blocks.shape[0]
    if type_name in FLOAT_ROWS:
        return blocks.contiguous().view(torch.float16 if type_name == "F16" else torch.bfloat16).reshape(n, K).float()
    size, nbytes = BLOCKS[type_name]
    b = blocks.reshape(n, K // size, nbytes)
    if type_name == "Q4_K":  # 8 sub-blocks of 32, 6-bit scales and mins
        d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]  # (n, nb, 1, 1)
        sc, m = _k_scales(b[..., 4:16])
        q = _nibble_pairs(b[..., 16:].reshape(n, -1, 4, 32)).float()  # (n, nb, 8, 32)
        return (d * sc[..., None] * q - dmin * m[..., None]).reshape(n, K)
    if type_name == "MXFP4":  # kvalues times half the e8m0 scale (ggml's numbers), exactly
        half = torch.from_numpy(np.ldexp(np.float32(1), b[..., 0:1].numpy().astype(np.int32) - 128).astype(np.float32))
        q = torch.tensor(MXFP4_VALUES, dtype=torch.float32)[torch.cat((b[..., 1:] & 15, b[..., 1:] >> 4), -1).long()]
        return (half * q).reshape(n, K)
    if type_name in INT8_DOT_BLOCKS:
        d = _f16(b[..., 0:2])
        if type_name == "Q8_0":
            return (d * b[..., 2:].contiguous().view(torch.int8).float()).reshape(n, K)
        qs = b[..., 4:] if type_name == "Q4_1" else b[..., 2:]
        q = torch.cat((qs & 15, qs >> 4), -1).float()
        w = d * (q - 8) if type_name == "Q4_0" else d * q + _f16(b[..., 2:4])
        return w.reshape(n, K)
    if type_name in ("Q5_0", "Q5_1"):
        d = _f16(b[..., 0:2])
        off = 2 if type_name == "Q5_0" else 4
        qh = b[..., off:off + 4].contiguous().view(torch.int32)  # (n, nb, 1)
        qs = b[..., off + 4:]  # (n, nb, 16): element j low, element j + 16 high
        high = (qh >> torch.arange(32, dtype=torch.int32)) & 1
        q = (torch.cat((qs & 15, qs >> 4), -1).int() | (high << 4)).float()
        w = d * (q - 16) if type_name == "Q5_0" else d * q + _f16(b[..., 2:4])
        return w.reshape(n, K)
    if type_name == "Q5_K":
        d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]  # (n, nb, 1, 1)
        sc, m = _k_scales(b[..., 4:16])
        qh = b[..., 16:48]  # bit s of qh[l]: the 5th bit of element l of sub-block s
        high = (qh[..., None, :] >> torch.arange(8, dtype=torch.uint8)[:, None]) & 1  # (n, nb, 8, 32)
        q = (_nibble_pairs(b[..., 48:].reshape(n, -1, 4, 32)) | (high << 4)).float()
        return (d * sc[..., None] * q - dmin * m[..., None]).reshape(n, K)
    # Q6_K: per 128 elements (two halves), quarters 0..3 from ql[0:32] low, ql[32:64] low, ql[0:32]
    # high, ql[32:64] high, their top two bits from qh bits 0-1, 2-3, 4-5, 6-7
    ql = b[..., 0:128].reshape(n, -1, 2, 2, 32)
    qh = b[..., 128:192].reshape(n, -1, 2, 1, 32)
    low = torch.cat((ql & 15, ql >> 4), dim=-2)  # (n, nb, 2, 4, 32)
    high = (qh >> torch.arange(0, 8, 2, dtype=torch.uint8)[:, None]) & 3
    q = (low | (high << 4)).float().reshape(n, -1, 16, 16) - 32
    sc = b[..., 192:208].contiguous().view(torch.int8).float()  # (n, nb, 16)
    d = _f16(b[..., 208:210])[..., None]
    return (d * sc[..., None] * q).reshape(n, K)


class GGUFBlockWeight:
    """A (N, K) weight held as its GGUF blocks, rows of `row_bytes` bytes (packed.py's interface).
    `refined`: the kernels multiply it with int8x2 activations (a preset's, quant/held.py's
    hold_activations), else int8 ones."""
    symmetric = False
    rows_readable = True
    refined = False

    def __init__(self, blocks: torch.Tensor, type_name: str, K: int, device: torch.device, heads: int | None = None):
        if heads is not None and device.type != "cpu":  # copied to the device anyway: in HF order first
            blocks, heads = unpermute_rows(blocks, heads), None
        self._blocks = blocks.contiguous().to(device)  # (N, row bytes) uint8, in the file's row order
        self._heads = heads  # rows in llama.cpp's Q/K order, un-permuted when `blocks` is first read
        self.type_name, self.device = type_name, device
        self.shape = (blocks.shape[0], K)
        self.group_size, self.bits = BLOCKS[type_name][0], BITS[type_name]
        self.interleaved = None  # (bytes,) uint8: the rows interleaved for the decode step (interleave())
        self.interleaved_by = None  # the kernel variant whose row groups they are

    @property
    def blocks(self) -> torch.Tensor:
        """(N, row bytes) uint8, rows in HF order."""
        if self._heads is not None:
            self._blocks, self._heads = unpermute_rows(self._blocks, self._heads).contiguous(), None
        return self._blocks

    def interleave(self, kernels, threads: int | None = None, release=None) -> bool:
        """Make `interleaved`, the rows as `kernels`' row-group kernels read them (HF order, read straight
        from the file's blocks where they are still in llama.cpp's Q/K order), unless made for that
        variant already; False where those kernels do not take this weight. `release(address, nbytes)`
        hears of the stored rows copied, a few MiB at a time (a tied head of 250 MB is not in memory
        twice while it is copied)."""
        if self.device.type != "cpu":
            return False
        if self.interleaved_by != kernels.variant:
            N, K, type_id = self.shape[0], self.shape[1], TYPE_IDS[self.type_name]
            size = kernels.interleaved_bytes(type_id, N, K)
            self.interleaved, self.interleaved_by = (torch.empty(size, dtype=torch.uint8) if size else None), kernels.variant
            if size:
                interleave_rows(kernels, self._blocks.numpy(), type_id, K, self._heads, threads, release, self.interleaved)
        return self.interleaved is not None

    @property
    def stored(self) -> torch.Tensor:
        """The blocks as they are held (the file's row order): what release_pages may drop from memory."""
        return self._blocks

    @classmethod
    def from_blocks(cls, blocks: torch.Tensor, type_name: str, device: torch.device,
                    heads: int | None = None) -> "GGUFBlockWeight":
        size, nbytes = BLOCKS[type_name]
        return cls(blocks, type_name, blocks.shape[1] // nbytes * size, device, heads)

    @classmethod
    def stacked(cls, weights: list["GGUFBlockWeight"]) -> "GGUFBlockWeight | None":
        """Rows are independent: the blocks of several weights (same type and K) simply stack."""
        first = weights[0]
        if any(w.type_name != first.type_name or w.shape[1] != first.shape[1] for w in weights):
            return None
        if first.device.type == "cpu":  # numpy's one-thread memcpy: torch.cat spread the copy over the intra-op
            # threads, and on a busy CPU each call waited for them far longer than the copy
            blocks = torch.from_numpy(np.concatenate([w.blocks.numpy() for w in weights]))
        else:
            blocks = torch.cat([w.blocks for w in weights])
        stacked = cls(blocks, first.type_name, first.shape[1], first.device)
        stacked.refined = first.refined  # (QuantLinear.concat stacks only weights that agree)
        return stacked

    def state(self) -> dict[str, torch.Tensor]:
        return {"blocks": self.blocks.cpu()}

    def _tile_t(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        return self._rows(self.blocks[start:stop], dtype).t()

    def _rows(self, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        K = self.shape[1]
        if self.device.type == "cpu" and native.available():
            return native.dequantize(blocks, TYPE_IDS[self.type_name], K, dtype)
        return dequantize_blocks(blocks, self.type_name, K).to(dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        N, K = self.shape
        rows = x.numel() // K
        # F16/BF16 rows: the kernels' float32 products for any number of rows (half_rows.h tiles a prompt's)
        wide = self.type_name in FLOAT_ROWS
        if self.device.type == "cpu" and (wide or kernels.use_kernel(self.device, rows)) and native.available():
            y = native.mm(x.reshape(rows, K), self.blocks, TYPE_IDS[self.type_name], K, self.refined)
            return y.to(x.dtype).view(*x.shape[:-1], N)

        return _dense_tiles(x, N, K, self._tile_t)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # index_select: `blocks[ids]` started torch's OpenMP threads even for a batch's 8 rows, which
        # then spun beside the decode step's own threads (native_step.py's _rope says what that cost)
        return self._rows(self.blocks.index_select(0, ids.reshape(-1)).view(*ids.shape, -1), dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._rows(self.blocks, dtype)

    def dot_rows_into(self, ids: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> bool:
        """out[ids] = rows ids . x (float64 sums, rounded once) through the kernels; False where they
        do not serve (another device, no kernels, out not a float32 CPU vector)."""
        if self.device.type != "cpu" or not native.available() or out.dtype != torch.float32 or not out.is_cpu:
            return False
        native.module().dot_rows_into(self.blocks, TYPE_IDS[self.type_name], self.shape[1], ids, x, out)
        return True

    @property
    def nbytes(self) -> int:
        return self._blocks.numel()

    def held_tensors(self) -> list[torch.Tensor]:
        """What the weight holds in memory for its reader: the interleaved copy where the native step has
        one (the file's pages under the blocks are released at load), else the blocks."""
        return [self._blocks if self.interleaved is None else self.interleaved]
