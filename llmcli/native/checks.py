"""What a tensor of GGUF blocks must be before a kernel reads it (library.py's calls and step.py's
projections): a wrong row length would have the kernel read past the tensor."""

from __future__ import annotations

import torch

# quant/gguf_blocks.py's type id -> (weights a block, bytes a block)
BLOCKS = {0: (32, 22), 1: (32, 24), 2: (256, 176), 3: (256, 210), 4: (32, 18), 5: (32, 20), 6: (32, 34), 7: (256, 144),
          8: (1, 2), 9: (1, 2)}  # (8, 9: F16 and BF16 rows, a "block" of one weight)

# type id -> K -> the bytes of a row of K weights (None where K is not whole blocks)
ROW_BYTES = {t: (lambda K, size=size, nbytes=nbytes: K // size * nbytes if K % size == 0 else None)
             for t, (size, nbytes) in BLOCKS.items()}


def check_blocks(blocks: torch.Tensor, type_id: int, K: int) -> None:
    """Refuses (ValueError) blocks that are not (N, row bytes) uint8 on the CPU holding K weights a row."""
    if type_id not in BLOCKS or blocks.dtype != torch.uint8 or blocks.device.type != "cpu" or blocks.dim() != 2:
        raise ValueError("blocks must be (N, row bytes) uint8 on the CPU, of a known type")
    size, nbytes = BLOCKS[type_id]
    if K % size or blocks.shape[1] != K // size * nbytes:
        raise ValueError(f"rows of {blocks.shape[1]} bytes do not hold {K} weights of type {type_id}")
