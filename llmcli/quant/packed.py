"""Packed weights: one class per format, each holding a (N, K) weight in the form its device runs.

Every class answers the same four questions, so the modules in modules.py stay format-blind:

    matmul(x)          x (M, K) -> x @ W.T (M, N) in x's dtype
    rows(ids, dtype)   dequantized rows (R, K), for embedding tables
    dequantize(dtype)  the whole (N, K) weight
    state()            the portable tensors saved in a checkpoint (CPU, device-independent)

The portable form is what primitives.py produces: int4 codes two per byte along K (even column in
the low nibble), scales and zeros (N, K/G) in bfloat16; int8 codes (N, K) with scales (N, K/G).
`from_state` repacks it for the device once, at load.
"""

from __future__ import annotations

import torch

from . import kernels
from .primitives import SCALE_DTYPE, pack_int4, unpack_int4


def _dense_tiles(x: torch.Tensor, N: int, K: int, tile_t) -> torch.Tensor:
    """x @ W.T with W dequantized tile by tile: `tile_t(start, stop, dtype)` gives W[start:stop].T."""
    step = max(64, kernels.TILE_ELEMENTS // K // 64 * 64)  # whole blocks of the CPU layout
    if step >= N:
        return x @ tile_t(0, N, x.dtype)
    out = torch.empty(*x.shape[:-1], N, dtype=x.dtype, device=x.device)
    for start in range(0, N, step):
        stop = min(N, start + step)
        out[..., start:stop] = x @ tile_t(start, stop, x.dtype)
    return out


def _scales_and_zeros(scales: torch.Tensor, zeros: torch.Tensor | None) -> torch.Tensor:
    """(N, K/G) scales and zeros -> the kernels' (K/G, N, 2)."""
    z = torch.zeros_like(scales) if zeros is None else zeros
    return torch.stack((scales, z), dim=-1).transpose(0, 1).contiguous()


class Int4Weight:
    """w = (q - 8) * scale + zero for q in 0..15, one scale (and zero) per group of G along K."""

    bits = 4

    def __init__(self, qweight: torch.Tensor | None, scales: torch.Tensor, zeros: torch.Tensor | None,
                 device: torch.device, rows_needed: bool = False, codes: torch.Tensor | None = None):
        """`qweight` (N, K/2) packed two per byte, or `codes` (N, K) unpacked (saves a round trip)."""
        N, K = codes.shape if qweight is None else (qweight.shape[0], qweight.shape[1] * 2)
        self.shape, self.group_size, self.symmetric = (N, K), K // scales.shape[1], zeros is None
        self.device = device
        self.backend = kernels.int4_backend(device, N, K, self.group_size, rows_needed)
        if self.backend == "cpu":
            rows = codes if qweight is None else (lambda start, stop: unpack_int4(qweight[start:stop]))
            self.packed = kernels.cpu_int4_pack(rows, N, K)  # a slice at a time
            self.scales_and_zeros = _scales_and_zeros(scales, zeros).to(SCALE_DTYPE)
        elif self.backend == "tinygemm":
            self.packed = kernels.tinygemm_pack(pack_int4(codes) if qweight is None else qweight, device)
            self.scales_and_zeros = _scales_and_zeros(scales, zeros).to(device=device, dtype=SCALE_DTYPE)
        else:
            self.qweight = (pack_int4(codes) if qweight is None else qweight).to(device)
            self.scales = scales.to(device)
            self.zeros = None if zeros is None else zeros.to(device)

    @classmethod
    def from_state(cls, state: dict, device: torch.device, rows_needed: bool = False) -> "Int4Weight":
        """`state` holds `qweight` (portable, as saved) or `codes` (unpacked, straight from a conversion)."""
        return cls(state.get("qweight"), state["scales"], state.get("zeros"), device, rows_needed, state.get("codes"))

    @classmethod
    def cpu_packed(cls, codes, scales_and_zeros: torch.Tensor, group_size: int,
                   shape: tuple[int, int] | None = None) -> "Int4Weight":
        """Codes (N, K) packed for the CPU kernel with ready (K/G, N, 2) scales and zeros; `codes` may
        be a function of (start, stop) giving those rows' codes, with `shape` (kernels.cpu_int4_pack)."""
        w = cls.__new__(cls)
        w.shape = tuple(shape or codes.shape)
        w.group_size, w.symmetric = group_size, False
        w.device, w.backend = torch.device("cpu"), "cpu"
        w.packed, w.scales_and_zeros = kernels.cpu_int4_pack(codes, *w.shape), scales_and_zeros
        return w

    @classmethod
    def stacked(cls, weights: list["Int4Weight"]) -> "Int4Weight | None":
        """The rows of `weights` (same K, group size and symmetry) stacked, or None when their layout
        does not allow it without unpacking. The CPU layout stores blocks of BLOCK_N rows one after
        another, so when every weight but the last fills whole blocks, the packed bytes concatenate
        (fusing q/k/v or gate/up at load then costs no unpack and repack, and no peak of memory)."""
        layout = kernels.cpu_int4_layout()
        if layout is None or any(w.backend != "cpu" for w in weights) or any(w.shape[0] % layout[0] for w in weights[:-1]):
            return None
        first = weights[0]
        w = cls.__new__(cls)
        w.shape = (sum(x.shape[0] for x in weights), first.shape[1])
        w.group_size, w.symmetric, w.device, w.backend = first.group_size, first.symmetric, first.device, "cpu"
        w.packed = torch.cat([x.packed.reshape(-1) for x in weights]).view(w.shape[0], -1)
        w.scales_and_zeros = torch.cat([x.scales_and_zeros for x in weights], dim=1)
        return w

    @classmethod
    def from_codes(cls, codes, scales, zeros, device, rows_needed=False) -> "Int4Weight":
        return cls(None, scales.to(SCALE_DTYPE), None if zeros is None else zeros.to(SCALE_DTYPE),
                   device, rows_needed, codes=codes)

    # ---------------------------------------------------------------------------- portable view

    def _codes_t(self, start: int, stop: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """(K, stop - start) codes of rows start..stop-1 in `dtype` (not for the tinygemm layout)."""
        N, K = self.shape
        if self.backend == "cpu":
            return kernels.cpu_int4_codes_t(self.packed, N, K, start, stop, dtype)
        return unpack_int4(self.qweight[start:stop]).t().to(dtype, memory_format=torch.contiguous_format)

    def _sz(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Scales and zeros of rows start..stop-1 as contiguous float32 (K/G, rows)."""
        if self.backend == "cpu":
            sz = self.scales_and_zeros[:, start:stop].float()
            return sz[..., 0].contiguous(), None if self.symmetric else sz[..., 1].contiguous()
        z = None if self.zeros is None else self.zeros[start:stop].t().float().contiguous()
        return self.scales[start:stop].t().float().contiguous(), z

    def _tile_t(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """W[start:stop].T dequantized, (K, stop - start): q * s + (z - 8s) in one pass."""
        K, G, n = self.shape[1], self.group_size, stop - start
        q = self._codes_t(start, stop, dtype).view(K // G, G, n)
        s, z = self._sz(start, stop)
        offset = -8 * s if z is None else z - 8 * s
        return torch.addcmul(offset.to(dtype)[:, None, :], q, s.to(dtype)[:, None, :]).view(K, n)

    def state(self) -> dict[str, torch.Tensor]:
        if self.backend == "tinygemm":  # matmul-only layout; checkpoints are written before packing
            raise RuntimeError("a weight packed for a GPU kernel cannot be read back; save the portable form")
        N, K = self.shape
        s, z = self._sz(0, N)
        out = {"qweight": pack_int4(self._codes_t(0, N).t()).cpu(), "scales": s.t().to(SCALE_DTYPE).contiguous().cpu()}
        if z is not None:
            out["zeros"] = z.t().to(SCALE_DTYPE).contiguous().cpu()
        return out

    # ------------------------------------------------------------------------------- compute

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        N, K = self.shape
        rows = x.numel() // K
        if self.backend != "portable" and (self.backend == "tinygemm" or kernels.use_kernel(self.device, rows)):
            kd = kernels.kernel_dtype(self.device, x.dtype)
            x2 = x.reshape(rows, K).to(kd)
            sz = self.scales_and_zeros if kd == SCALE_DTYPE else self.scales_and_zeros.to(kd)
            mm = kernels.cpu_int4_mm if self.backend == "cpu" else kernels.tinygemm_mm
            return mm(x2, self.packed, self.group_size, sz).to(x.dtype).view(*x.shape[:-1], N)
        return _dense_tiles(x, N, K, self._tile_t)

    @property
    def rows_readable(self) -> bool:
        """Whether rows() works: not in tinygemm's layout, which cannot be read back."""
        return self.backend != "tinygemm"

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        N, K = self.shape
        G = self.group_size
        if self.backend == "cpu":
            q = kernels.cpu_int4_rows(self.packed, N, K, ids)
            sz = self.scales_and_zeros[:, ids]  # (K/G, R, 2)
            s, z = sz[..., 0].t(), (None if self.symmetric else sz[..., 1].t())
        else:
            q, s = unpack_int4(self.qweight[ids]), self.scales[ids]
            z = None if self.zeros is None else self.zeros[ids]
        w = (q.to(dtype).view(-1, K // G, G) - 8) * s.to(dtype)[..., None]
        if z is not None:
            w += z.to(dtype)[..., None]
        return w.view(-1, K)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._tile_t(0, self.shape[0], dtype).t()

    @property
    def nbytes(self) -> int:
        N, K = self.shape
        groups = N * K // self.group_size
        return N * K // 2 + groups * 2 * (1 if self.symmetric else 2)


class Int8Weight:
    """w = q * scale for q in -127..127, one scale per group of G along K (G = K: one per row).

    Per row, the CPU and MPS run `_weight_int8pack_mm`. Group-wise on the CPU (e.g. GGUF Q8_0) runs
    the int4 kernel exactly: with u = q + 128 = 16h + l, w = (h - 8)·16s + ((l - 8)·s + 8s), two
    4-bit halves side by side along K, fed [x, x]. Elsewhere group-wise weights use the fallback.
    """

    bits = 8

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, device: torch.device, rows_needed: bool = False):
        N, K = qweight.shape
        self.shape, self.group_size, self.device = (N, K), K // scales.shape[1], device
        self.symmetric = True
        self.halves = None
        if self.group_size == K:
            self.row_kernel = kernels.int8_row_kernel(device, N, K)
        else:
            self.row_kernel = False
            if device.type == "cpu" and kernels.int4_backend(device, N, 2 * K, self.group_size, True) == "cpu":
                def halves(start: int, stop: int) -> torch.Tensor:  # codes of rows start..stop-1, (rows, 2K)
                    u = qweight[start:stop].view(torch.uint8) ^ 128  # q + 128 as a byte
                    return torch.cat((u >> 4, u & 15), dim=1)

                s = scales.to(SCALE_DTYPE)
                sz = torch.cat((_scales_and_zeros(s * 16, None), _scales_and_zeros(s, s * 8)), dim=0)
                self.halves = Int4Weight.cpu_packed(halves, sz, self.group_size, (N, 2 * K))
                return
        self.qweight = qweight.to(device)
        self.scales = scales.to(device)

    @classmethod
    def stacked(cls, weights: list["Int8Weight"]) -> "Int8Weight | None":
        """As Int4Weight.stacked, for group-wise weights riding the CPU int4 kernel (two halves)."""
        if any(w.halves is None for w in weights):
            return None
        halves = Int4Weight.stacked([w.halves for w in weights])
        if halves is None:
            return None
        first = weights[0]
        w = cls.__new__(cls)
        w.shape = (sum(x.shape[0] for x in weights), first.shape[1])
        w.group_size, w.device, w.symmetric, w.row_kernel, w.halves = first.group_size, first.device, True, False, halves
        return w

    @classmethod
    def from_state(cls, state: dict, device: torch.device, rows_needed: bool = False) -> "Int8Weight":
        return cls(state["qweight"], state["scales"], device, rows_needed)

    @classmethod
    def from_codes(cls, codes, scales, device, rows_needed=False) -> "Int8Weight":
        return cls(codes.to(torch.int8), scales.to(SCALE_DTYPE), device, rows_needed)

    def _codes_scales(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """int8 codes (rows, K) and scales (rows, K/G) of rows start..stop-1."""
        if self.halves is None:
            return self.qweight[start:stop], self.scales[start:stop]
        K = self.shape[1]
        h = self.halves._codes_t(start, stop).t()  # (rows, 2K): high halves, then low halves
        q = (h[:, :K].to(torch.int16) * 16 + h[:, K:] - 128).to(torch.int8)
        s = self.halves.scales_and_zeros[: K // self.group_size, start:stop, 0].t() / 16
        return q, s

    def _tile_t(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        K, G, n = self.shape[1], self.group_size, stop - start
        if self.halves is None:
            q, s = self.qweight[start:stop], self.scales[start:stop]
            return (q.to(dtype).view(n, K // G, G) * s.to(dtype)[..., None]).view(n, K).t()
        c = self.halves._codes_t(start, stop, dtype)  # (2K, n): high nibbles, then low; exact integers
        q = torch.add(c[K:], c[:K], alpha=16).sub_(128).view(K // G, G, n)  # the int8 codes, exact
        s = self.halves.scales_and_zeros[: K // G, start:stop, 0].float() / 16
        return q.mul_(s.to(dtype)[:, None, :]).view(K, n)

    def state(self) -> dict[str, torch.Tensor]:
        q, s = self._codes_scales(0, self.shape[0])
        return {"qweight": q.contiguous().cpu(), "scales": s.contiguous().cpu()}

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        N, K = self.shape
        rows = x.numel() // K
        if self.halves is not None and kernels.use_kernel(self.device, rows):
            return self.halves.matmul(torch.cat((x, x), dim=-1))
        if self.row_kernel and kernels.use_kernel(self.device, rows):
            kd = kernels.kernel_dtype(self.device, x.dtype)
            y = kernels.int8_row_mm(x.reshape(rows, K).to(kd), self.qweight, self.scales.view(N).to(kd))
            return y.to(x.dtype).view(*x.shape[:-1], N)
        return _dense_tiles(x, N, K, self._tile_t)

    rows_readable = True

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        K, G = self.shape[1], self.group_size
        if self.halves is None:
            q, s = self.qweight[ids], self.scales[ids]
        else:
            h = self.halves.rows(ids, torch.float32)  # already (h-8)·16s and (l-8)·s + 8s
            return (h[:, :K] + h[:, K:]).to(dtype)
        return (q.to(dtype).view(-1, K // G, G) * s.to(dtype)[..., None]).view(-1, K)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._tile_t(0, self.shape[0], dtype).t()

    @property
    def nbytes(self) -> int:
        N, K = self.shape
        return N * K + N * K // self.group_size * 2
