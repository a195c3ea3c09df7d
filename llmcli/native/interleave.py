"""A weight's rows copied once into the layout the row-group kernels read (interleaved), straight from
the file's blocks, releasing the file's pages under them as the copy goes: what both the torch
path's GGUFBlockWeight and the torch-free path's weights do at load (DESIGN.md: one copy of each
weight). numpy arrays in and out."""

from __future__ import annotations

import numpy as np

CHUNK = 16 << 20  # bytes of stored rows copied (and released) at a time


def unpermuted_order(N: int, heads: int) -> np.ndarray:
    """Row n of the HF order is row order[n] of llama.cpp's Q/K order (per head, interleaved rotary
    pairs -> two halves): formats/gguf.unpermute_rows on the row indices."""
    return np.ascontiguousarray(np.arange(N).reshape(heads, N // heads // 2, 2).swapaxes(1, 2)).reshape(N)


def unpermute_blocks(blocks: np.ndarray, heads: int) -> np.ndarray:
    """(N, row bytes) rows in llama.cpp's Q/K order -> a copy in HF order."""
    return np.ascontiguousarray(blocks[unpermuted_order(blocks.shape[0], heads)])


def interleave_rows(kernels, blocks: np.ndarray, type_id: int, K: int, heads: int | None = None,
                    threads: int | None = None, release=None, out=None):
    """blocks (N, row bytes), as stored -> the rows interleaved for `kernels`' row-group kernels, in
    HF order (un-permuted on the way where `heads` says the rows are in llama.cpp's Q/K order), or
    None where those kernels do not take them. `release(address, nbytes)` hears of each stretch of
    stored rows copied (at most CHUNK bytes, so a tied head of 250 MB is not in memory twice while it is
    copied). `out`: where to write (kernels.interleaved_bytes(type_id, N, K) bytes, a numpy array or a
    torch tensor); else a new numpy array."""
    N = blocks.shape[0]
    size = kernels.interleaved_bytes(type_id, N, K)
    if not size:
        return None
    out = np.empty(size, np.uint8) if out is None else out
    order = None if heads is None else unpermuted_order(N, heads)
    R, row_bytes = kernels.group_rows, blocks.shape[1]
    rows = N if order is not None else max(R, CHUNK // row_bytes // R * R)
    group = size // (N // R)  # bytes of a group of R rows
    for n0 in range(0, N, rows):
        part = blocks[n0:n0 + rows]
        kernels.interleave(part, type_id, K, order, threads, out[group * (n0 // R):group * ((n0 + part.shape[0]) // R)])
        if release is not None:
            release(part.ctypes.data, part.nbytes)
    return out
