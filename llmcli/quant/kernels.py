"""Weight-only matmul kernels, and the one place that chooses between them per device and row count.

    CPU    torch's `_weight_int4pack_mm_for_cpu` / `_weight_int8pack_mm`, fed bfloat16 activations
           (an order of magnitude slower with float32: docs/performance-choices.md). From DENSE_FROM_ROWS rows on (prefill), a dequantized tile
           and a dense GEMM are faster than these GEMV-shaped kernels
           (measured: benchmarks/kernels/weight_only_vs_dense.py).
    CUDA   torch's tinygemm `_weight_int4pack_mm` (compute capability 8.0+, bfloat16).
    MPS    torch's Metal `_weight_int4pack_mm` and `_weight_int8pack_mm`.
    else   dequantize a tile of rows to the activation dtype and matmul (every format, every device).

The CPU int4 kernel keeps its own blocked layout (`_convert_weight_to_int4pack_for_cpu`), which
depends on the CPU's vector width. `cpu_int4_layout` finds it once by packing a probe, so dequantized
tiles and embedding rows can be read straight from the packed bytes (one copy of the weight in
memory); where no known layout matches, weights stay in the portable form and use the fallback.
"""

from __future__ import annotations

import torch

INT4_GROUP_SIZES = (32, 64, 128, 256)  # what torch's int4 kernels accept
DENSE_FROM_ROWS = {"cpu": 32}  # rows from which dequantize + dense GEMM beats the CPU kernels
TILE_ELEMENTS = 1 << 22  # weights dequantized at a time by the fallback (8 MiB in bfloat16)


def use_kernel(device: torch.device, rows: int) -> bool:
    """Quantized kernel (True) or dequantized tile + dense GEMM (False) for `rows` activation rows."""
    limit = DENSE_FROM_ROWS.get(device.type)
    return limit is None or rows < limit


def int4_backend(device: torch.device, N: int, K: int, group_size: int, rows_needed: bool) -> str:
    """"cpu" | "tinygemm" | "portable": which packed form a (N, K) int4 weight takes on `device`.

    `rows_needed`: the weight is also an embedding table, so single rows must be readable; the GPU
    kernels' layouts do not allow that, so there it stays portable.
    """
    if group_size not in INT4_GROUP_SIZES or K % group_size:
        return "portable"
    if device.type == "cpu":
        return "cpu" if N % 16 == 0 and cpu_int4_layout() is not None else "portable"
    if rows_needed:
        return "portable"
    if device.type == "cuda":
        ok = torch.cuda.get_device_capability(device)[0] >= 8 and N % 8 == 0 and K % 32 == 0
        return "tinygemm" if ok else "portable"
    if device.type == "mps":
        return "tinygemm" if N % 8 == 0 and K % 32 == 0 else "portable"
    return "portable"


def int8_row_kernel(device: torch.device, N: int, K: int) -> bool:
    """Whether `_weight_int8pack_mm` (one scale per output row) serves this device and shape."""
    if device.type == "cpu":
        return True
    if device.type == "mps":
        return N % 32 == 0 and K % 32 == 0
    return False  # CUDA's version is a naive loop: the dequantized fallback is faster


def kernel_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """Activation dtype the int4 kernels run in (CPU and CUDA want bfloat16, MPS takes any)."""
    return dtype if device.type == "mps" else torch.bfloat16


# ------------------------------------------------------------------------ CPU int4 kernel layout
# `_convert_weight_to_int4pack_for_cpu` stores rows in blocks of BLOCK_N (64 with AVX-512, 32 with
# AVX2); a block of nb rows is a (K, nb/2) byte matrix. Full blocks on vector CPUs use "split"
# lanes (row j in byte j % (BLOCK_N/2), the high nibble for the second half); other blocks hold
# neighbouring rows in one byte ("pairs": row j in byte j // 2, the high nibble for odd j).


_UNPROBED = "unprobed"
_cpu_layout = _UNPROBED  # cpu_int4_layout()'s answer, probed once (a plain global: torch.compile reads it)


def cpu_int4_layout() -> tuple[int, bool] | None:
    """(BLOCK_N, split) of this CPU's int4 layout, or None when the kernel is missing or unknown."""
    global _cpu_layout
    if _cpu_layout is _UNPROBED:
        _cpu_layout = _probe_cpu_int4_layout()
    return _cpu_layout


def _probe_cpu_int4_layout() -> tuple[int, bool] | None:
    op = getattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", None)
    if op is None:
        return None
    gen = torch.Generator().manual_seed(0)
    probe = torch.randint(0, 16, (112, 64), generator=gen, dtype=torch.int32)  # full blocks + a tail
    try:
        packed = op(probe, 1).view(-1)
    except RuntimeError:
        return None
    for layout in ((64, True), (32, True), (64, False), (32, False), (16, False)):
        if torch.equal(_cpu_unpack_t(packed, 112, 64, *layout), probe.t().to(torch.uint8)):
            return layout
    return None


PACK_ELEMENTS = 1 << 20  # codes converted at a time: the op wants int32, 4 MiB of it, not 4 bytes per weight at once


def cpu_int4_pack(codes, N: int | None = None, K: int | None = None) -> torch.Tensor:
    """(N, K) codes in 0..15 -> the CPU kernel's packed bytes, (N, K/2) uint8.

    `codes` is a tensor, or a function (start, stop) -> the codes of those rows, so that a caller
    can make them a slice at a time. Packed in slices of whole row blocks: blocks are laid out one
    after another, so the slices' bytes are the whole weight's, without an int32 copy of all of it
    (and with no large temporaries, which the allocator would keep as fragmented free memory)."""
    rows = codes if callable(codes) else (lambda start, stop: codes[start:stop])
    if not callable(codes):
        N, K = codes.shape
    block_n = cpu_int4_layout()[0]
    step = max(block_n, PACK_ELEMENTS // K // block_n * block_n)
    op = torch.ops.aten._convert_weight_to_int4pack_for_cpu
    if step >= N:
        return op(rows(0, N).to(torch.int32).contiguous(), 1)
    out = torch.empty(N, K // 2, dtype=torch.uint8)
    for i in range(0, N, step):
        out[i:i + step] = op(rows(i, min(N, i + step)).to(torch.int32).contiguous(), 1).view(-1, K // 2)
    return out


def _cpu_unpack_t(flat: torch.Tensor, N: int, K: int, block_n: int, split: bool,
                  dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """Packed bytes (flat) of rows 0..N-1 -> codes transposed, (K, N) in `dtype` (written in place:
    one masking pass and one converting copy per nibble)."""
    out = torch.empty(K, N, dtype=dtype)
    n_full = N // block_n
    if n_full:
        b = flat[: n_full * block_n * K // 2].view(n_full, K, block_n // 2).transpose(0, 1)  # (K, blocks, BN/2)
        dst = out[:, : n_full * block_n]
        if split:  # row j of a block: byte j % (BN/2), high nibble for the second half
            dst = dst.view(K, n_full, 2, block_n // 2)
            dst[:, :, 0].copy_(b & 15)
            dst[:, :, 1].copy_(b >> 4)
        else:
            dst = dst.view(K, n_full, block_n // 2, 2)
            dst[..., 0].copy_(b & 15)
            dst[..., 1].copy_(b >> 4)
    tail = N - n_full * block_n
    if tail:
        b = flat[n_full * block_n * K // 2:].view(K, tail // 2)
        dst = out[:, n_full * block_n:].view(K, tail // 2, 2)
        dst[..., 0].copy_(b & 15)
        dst[..., 1].copy_(b >> 4)
    return out


def cpu_int4_codes_t(packed: torch.Tensor, N: int, K: int, start: int = 0, stop: int | None = None,
                     dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """Codes of rows start..stop-1 (start a multiple of BLOCK_N), transposed: (K, stop - start)."""
    block_n, split = cpu_int4_layout()
    stop = N if stop is None else stop
    flat = packed.view(-1)[start * K // 2: stop * K // 2]
    return _cpu_unpack_t(flat, stop - start, K, block_n, split, dtype)


def cpu_int4_rows(packed: torch.Tensor, N: int, K: int, ids: torch.Tensor) -> torch.Tensor:
    """Codes of the rows `ids` (R,), as (R, K) uint8, read from the packed bytes."""
    block_n, split = cpu_int4_layout()
    block, j = ids // block_n, ids % block_n
    nb = (N - block * block_n).clamp(max=block_n)
    lanes = (nb == block_n) & split
    byte = torch.where(lanes, j % (block_n // 2), j // 2)
    nibble = torch.where(lanes, j // (block_n // 2), j % 2)
    index = (block * (block_n * K // 2) + byte)[:, None] + torch.arange(K)[None, :] * (nb // 2)[:, None]
    return (packed.view(-1)[index] >> (4 * nibble)[:, None].to(torch.uint8)) & 15


def cpu_int4_mm(x: torch.Tensor, packed: torch.Tensor, group_size: int, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros)


# ----------------------------------------------------------------------------- GPU int4 kernels


def tinygemm_pack(qweight: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Portable (N, K/2) bytes (even column low) -> the CUDA/MPS kernel's layout on `device`.

    Both kernels take bytes with the even column in the high nibble (gpt-fast's convention)."""
    swapped = ((qweight & 15) << 4) | (qweight >> 4)
    K = qweight.shape[1] * 2
    inner_k_tiles = 2 if device.type == "mps" else next(t for t in (8, 4, 2) if K % (16 * t) == 0)
    return torch.ops.aten._convert_weight_to_int4pack(swapped.to(device).contiguous(), inner_k_tiles)


def tinygemm_mm(x: torch.Tensor, packed: torch.Tensor, group_size: int, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int4pack_mm(x, packed, group_size, scales_and_zeros)


def int8_row_mm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int8pack_mm(x, qweight, scales)
