"""A deep GGUF file assembled from a shallow one's quantized layers, for models whose F16 does not fit
the disk (Qwen3-30B-A3B's is ~61 GB; its Q4_K_M ~18.6 GB): llama-quantize makes a few layers, and
this writes N layers, each a copy of one source layer's tensors' bytes.

The weights are random, so which source layer a layer copies changes nothing that speed depends on
(bytes, types, shapes), only values. Each layer copies a distinct source layer while there are ones
left, cyclically after that, among the source layers quantized the way llama-quantize quantizes that
layer of N (Q4_K_M gives a layer's ffn_down and attn_v Q6_K where llama.cpp's use_more_bits(i, N)
says so, Q4_K elsewhere): the N-layer file has the types a direct quantization gives it.

Tensor data is streamed from the source file to the new one 64 MB at a time, by plain reads (whatever
N is, the writer peaked at 0.7 GB for 48 layers: the vocabulary's metadata, not the tensors);
metadata is the source's with block_count N and the name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's llama-quant.cpp use_more_bits: the first and last eighth, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _kind(tensors: list) -> tuple:
    """A layer's signature: each tensor's suffix and type, sorted."""
    return tuple(sorted((t.name.split(".", 2)[2], t.tensor_type) for t in tensors))


def source_layers(kinds: list[tuple], n: int) -> list[int]:
    """For each of n layers, the source layer it copies: its layer of the same signature as the source
    layer quantized as layer i of n would be (use_more_bits), distinct ones first, then cyclically."""
    m = len(kinds)
    by_bits = {flag: [j for j in range(m) if use_more_bits(j, m) == flag] for flag in (False, True)}
    assert all(by_bits.values()), "the source needs layers of both kinds (8 or more layers)"
    assert len({kinds[j] for j in by_bits[True]}) == 1 and len({kinds[j] for j in by_bits[False]}) == 1, \
        "source layers of one kind differ in their tensors' types"
    used = {False: 0, True: 0}
    out = []
    for i in range(n):
        flag = use_more_bits(i, n)
        pool = by_bits[flag]
        out.append(pool[used[flag] % len(pool)])
        used[flag] += 1
    return out


def _field_value(f):
    return [f.contents(i) for i in range(len(f.data))] if len(f.data) > 1 else f.contents()


class _Bytes:
    """A source tensor's bytes as GGUFWriter writes an array (shape, dtype, nbytes, tofile), read
    from the file 64 MB at a time (plain reads, not the memory map: its pages would count as ours)."""

    def __init__(self, fd: int, t):
        self.fd, self.offset = fd, int(t.data_offset)
        self.shape = t.data.shape[:-1] + (t.data.shape[-1] * t.data.dtype.itemsize,)  # (..., bytes a row)
        self.dtype, self.nbytes = np.dtype(np.uint8), int(t.n_bytes)  # uint8: GGUFWriter takes the shape as bytes

    def tofile(self, fout) -> None:
        step = 64 << 20
        for r in range(0, self.nbytes, step):
            fout.write(os.pread(self.fd, min(step, self.nbytes - r), self.offset + r))


def repeat_layers(src: Path, out: Path, n: int, name: str | None = None) -> list[int]:
    """`src`'s layers repeated into an n-layer `out` (written to out.partial, renamed when whole).
    -> the source layer of each."""
    import gguf

    r = gguf.GGUFReader(str(src))
    arch = str(_field_value(r.fields["general.architecture"]))
    layers: dict[int, list] = {}
    others = []
    for t in r.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        (layers.setdefault(int(m.group(1)), []) if m else others).append(t)
    order = source_layers([_kind(layers[j]) for j in range(len(layers))], n)
    tmp = out.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = n if key == f"{arch}.block_count" else name if key == "general.name" and name else _field_value(f)
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub)

    fd = os.open(src, os.O_RDONLY)

    def add(new_name: str, t) -> None:
        w.add_tensor(new_name, _Bytes(fd, t), raw_dtype=t.tensor_type)

    for t in others:
        if not t.name.startswith("output"):
            add(t.name, t)
    for i, j in enumerate(order):
        for t in layers[j]:
            add(f"blk.{i}." + t.name.split(".", 2)[2], t)
    for t in others:
        if t.name.startswith("output"):
            add(t.name, t)
    try:  # (a half-written 18 GB file is not left behind on a full disk)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        tmp.replace(out)
    finally:
        os.close(fd)
        tmp.unlink(missing_ok=True)
    return order
