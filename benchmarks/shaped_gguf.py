"""Random-weight GGUF files with a real model's shapes, for speed comparisons with llama.cpp on the
same bytes (qwen2_shapes.py, tinyllama_shapes.py): the hyperparameters, then the layers' tensors.

    w = start(tmp, "llama", "tinyllama-shapes-random", SHAPES)
    ... tokenizer keys ...
    add_layers(w, SHAPES, matrix, vector)  # matrix(rows, cols) and vector(n) make the values
    finish(w, tmp, out)                    # written whole, then renamed into place
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def start(tmp: Path, arch: str, name: str, s: dict, rope_dims: bool = False):
    """A GGUFWriter with the shapes' hyperparameters: hidden, intermediate, layers, heads, kv_heads,
    ctx, rope_theta, eps."""
    import gguf

    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_name(name)
    w.add_block_count(s["layers"])
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["intermediate"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    if rope_dims:
        w.add_rope_dimension_count(s["hidden"] // s["heads"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_rope_freq_base(s["rope_theta"])
    return w


def add_layers(w, s: dict, matrix, vector=None, **raw) -> None:
    """Every layer's norms and projections; with `vector`, q/k/v biases (qwen2). `raw` goes to each
    matrix's add_tensor (raw_dtype= for pre-quantized bytes)."""
    hidden, kv = s["hidden"], s["kv_heads"] * (s["hidden"] // s["heads"])
    for i in range(s["layers"]):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        for part, rows in (("q", hidden), ("k", kv), ("v", kv)):
            w.add_tensor(f"blk.{i}.attn_{part}.weight", matrix(rows, hidden), **raw)
            if vector is not None:
                w.add_tensor(f"blk.{i}.attn_{part}.bias", vector(rows))
        w.add_tensor(f"blk.{i}.attn_output.weight", matrix(hidden, hidden), **raw)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", matrix(s["intermediate"], hidden), **raw)
        w.add_tensor(f"blk.{i}.ffn_up.weight", matrix(s["intermediate"], hidden), **raw)
        w.add_tensor(f"blk.{i}.ffn_down.weight", matrix(hidden, s["intermediate"]), **raw)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))


def finish(w, tmp: Path, out: Path) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
