"""What a tensor of GGUF blocks must be before a kernel reads it (library.py's calls and step.py's
projections): a wrong row length would have the kernel read past the tensor."""

from __future__ import annotations

import numpy as np

# GGUF's type names -> the kernels' type ids (their switch)
TYPE_IDS = {"Q5_0": 0, "Q5_1": 1, "Q5_K": 2, "Q6_K": 3, "Q4_0": 4, "Q4_1": 5, "Q8_0": 6, "Q4_K": 7, "F16": 8, "BF16": 9,
            "MXFP4": 10}
# type id -> (weights a block, bytes a block)
BLOCKS = {0: (32, 22), 1: (32, 24), 2: (256, 176), 3: (256, 210), 4: (32, 18), 5: (32, 20), 6: (32, 34), 7: (256, 144),
          8: (1, 2), 9: (1, 2), 10: (32, 17)}  # (8, 9: F16 and BF16 rows, a "block" of one weight)

# type id -> K -> the bytes of a row of K weights (None where K is not whole blocks)
ROW_BYTES = {t: (lambda K, size=size, nbytes=nbytes: K // size * nbytes if K % size == 0 else None)
             for t, (size, nbytes) in BLOCKS.items()}


def array(t) -> np.ndarray:
    """A numpy array as it is, or a CPU torch tensor viewed as one (no copy, but of bfloat16 values)."""
    if isinstance(t, np.ndarray):
        return t
    if t.device.type != "cpu":
        raise ValueError("the kernels read CPU memory only")
    t = t.detach()
    return (t.float() if str(t.dtype) == "torch.bfloat16" else t).numpy()  # (numpy has no bfloat16: a float32 copy)


def check_blocks(blocks, type_id: int, K: int) -> None:
    """Refuses (ValueError) blocks that are not (N, row bytes) uint8 on the CPU holding K weights a row
    (a numpy array, or a torch tensor)."""
    if not isinstance(blocks, np.ndarray) and blocks.device.type != "cpu":
        raise ValueError("blocks must be (N, row bytes) uint8 on the CPU, of a known type")
    blocks = array(blocks)
    if type_id not in BLOCKS or blocks.dtype != np.uint8 or blocks.ndim != 2:
        raise ValueError("blocks must be (N, row bytes) uint8 on the CPU, of a known type")
    size, nbytes = BLOCKS[type_id]
    if K % size or blocks.shape[1] != K // size * nbytes:
        raise ValueError(f"rows of {blocks.shape[1]} bytes do not hold {K} weights of type {type_id}")
