"""GGUF weights made here, for the benchmarks and the tests: encoders for GGUF's K-quant blocks
(gguf-py only decodes them), and random-weight models with real models' shapes, so that llmcli and
llama.cpp time the same bytes (quality is irrelevant; memory traffic is what they measure).

    python -m benchmarks.shapes tinyllama [--out FILE] [--tokenizer tokenizer.model]
    python -m benchmarks.shapes qwen2 --llama-quantize PATH/llama-quantize --tokenizer-from SmolLM2.gguf [--out FILE]
    llmcli bench FILE -t 2 -p 512 -n 128 -r 5 --llama-bench PATH/llama-bench

tinyllama  TinyLlama-1.1B's shapes in Q4_0, with a real 32000-piece SentencePiece vocabulary (--tokenizer,
           e.g. mistral-common's tokenizer.model.v1; else fetched from the mistral-common wheel on PyPI)
qwen2      Qwen2.5-0.5B's shapes (q/k/v bias, tied embeddings, 151936 entries), written F16 and quantized
           by llama.cpp's own llama-quantize to Q4_K_M, the format users download. The vocabulary is
           SmolLM2's byte-level BPE (a GGUF given with --tokenizer-from), padded with unreachable pieces
           to Qwen2's size: the embedding and head are full-size, which is what decoding speed depends on.

The K-quant encoders write the exact byte layout llama.cpp writes (ggml-common.h), with simple min/max
scales, not llama.cpp's search: tests need valid blocks, not the best ones. Checked by round-tripping
through `gguf.quants.dequantize` (tests/test_gguf_kquants.py). Their float16 bytes and nibble packing
are the package's (llmcli/quant/gguf_encode.py, which writes `quantize --format gguf`'s blocks).

    Q4_K  144 bytes / 256: d f16, dmin f16, scales[12] (6-bit scale and min per 32), qs[128]
    Q5_K  176 bytes / 256: d, dmin, scales[12], qh[32] (5th bits), qs[128]
    Q6_K  210 bytes / 256: ql[128], qh[64], scales[16] int8 (one per 16), d f16
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from llmcli.quant.gguf_encode import f16_bytes as _f16
from llmcli.quant.gguf_encode import pack_nibbles

# ------------------------------------------------------------------------------ K-quant blocks

QK = 256

def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(n, 8) 6-bit scales and mins -> (n, 12) bytes, the inverse of ggml's get_scale_min_k4."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return out


def _asymmetric(x: np.ndarray, levels: int):
    """(n, 8, 32) values -> d, dmin (n,), 6-bit sc, m (n, 8), codes (n, 8, 32) with w = d*sc*q - dmin*m."""
    lo = np.minimum(x.min(-1), 0.0)
    scale, mins = (x.max(-1) - lo) / levels, -lo
    d = np.maximum(scale.max(-1), 1e-12) / 63
    dmin = np.maximum(mins.max(-1), 1e-12) / 63
    d, dmin = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / d[:, None]), 1, 63).astype(np.uint8)
    m = np.clip(np.round(mins / dmin[:, None]), 0, 63).astype(np.uint8)
    step = (d[:, None] * sc)[..., None]
    q = np.clip(np.round((x + (dmin[:, None] * m)[..., None]) / step), 0, levels).astype(np.uint8)
    return d, dmin, sc, m, q


def _low_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 256) codes -> (n, 128) bytes: per 64 elements, element l low, element l + 32 high."""
    return pack_nibbles(q.reshape(-1, 256), 32)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """(N, K) float32, K a multiple of 256 -> (N, K/256*144) uint8."""
    N, K = x.shape
    d, dmin, sc, m, q = _asymmetric(x.reshape(-1, 8, 32).astype(np.float32), 15)
    blocks = np.concatenate([_f16(d), _f16(dmin), _pack_scales(sc, m), _low_nibbles(q.reshape(-1, QK))], axis=1)
    return blocks.reshape(N, -1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    N, K = x.shape
    d, dmin, sc, m, q = _asymmetric(x.reshape(-1, 8, 32).astype(np.float32), 31)
    q = q.reshape(-1, 8, 32)
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for s in range(8):  # the 5th bit of sub-block s is bit s of qh[l]
        qh |= ((q[:, s] >> 4) & 1) << s
    blocks = np.concatenate([_f16(d), _f16(dmin), _pack_scales(sc, m), qh, _low_nibbles(q.reshape(-1, QK))], axis=1)
    return blocks.reshape(N, -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    N, K = x.shape
    x = x.reshape(-1, 16, 16).astype(np.float32)  # (blocks, 16 sub-blocks, 16)
    amax = np.abs(x).max(-1)
    scale = np.where(amax > 0, amax / 31, 1e-12)
    d = (np.abs(scale).max(-1) / 127).astype(np.float16).astype(np.float32)
    d = np.where(d > 0, d, np.float32(1e-7))
    sc = np.clip(np.round(scale / d[:, None]), 1, 127).astype(np.int8)
    q = np.clip(np.round(x / (d[:, None] * sc)[..., None]), -32, 31).astype(np.int16) + 32
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)  # (blocks, half, quarter, l)
    ql = np.concatenate([(q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4),
                         (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)], axis=2).reshape(-1, 128)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    blocks = np.concatenate([ql, qh.reshape(-1, 64), sc.view(np.uint8), _f16(d)], axis=1)
    return blocks.reshape(N, -1)


ENCODERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}


def quantize(x: np.ndarray, type_name: str) -> np.ndarray:
    """Any GGUF block type: K-quants here, the rest through gguf-py."""
    import gguf
    from gguf.quants import quantize as gguf_quantize

    if type_name in ENCODERS:
        return ENCODERS[type_name](np.asarray(x, dtype=np.float32))
    return gguf_quantize(np.asarray(x, dtype=np.float32), gguf.GGMLQuantizationType[type_name])


# ------------------------------------------------------------------------ models with real shapes

# Qwen2.5-0.5B-Instruct and TinyLlama-1.1B-Chat-v1.0, from their config.json
QWEN2 = dict(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936, ctx=32768,
             rope_theta=1000000.0, eps=1e-6)
TINYLLAMA = dict(hidden=2048, intermediate=5632, layers=22, heads=32, kv_heads=4, vocab=32000, ctx=2048,
                 rope_theta=10000.0, eps=1e-5)
OUT = Path.home() / ".cache" / "llmcli-bench"


def start(tmp: Path, arch: str, name: str, s: dict, rope_dims: bool = False):
    """A GGUFWriter with the shapes' hyperparameters: hidden, intermediate, layers, heads, kv_heads,
    ctx, rope_theta, eps. Then tokenizer keys, add_layers(), and finish()."""
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
    """Every layer's norms and projections; matrix(rows, cols) and vector(n) make the values. With
    `vector`, q/k/v biases (qwen2). `raw` goes to each matrix's add_tensor (raw_dtype= for blocks)."""
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
    """Written whole, then renamed into place: a half-written file never has the final name."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)


def write_qwen2_f16(out: Path, tokenizer_gguf: Path, s: dict = QWEN2, seed: int = 0) -> None:
    import gguf

    src = gguf.GGUFReader(str(tokenizer_gguf))

    def field(name):
        f = src.fields[name]
        return [f.contents(i) for i in range(len(f.data))] if len(f.data) > 1 else f.contents()

    tokens, types, merges = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type"), field("tokenizer.ggml.merges")
    pad = s["vocab"] - len(tokens)
    tokens = list(tokens) + [f"<|unused_{i}|>" for i in range(pad)]
    types = list(types) + [5] * pad  # UNUSED: never produced by the tokenizer
    tmp = out.with_suffix(".partial")
    w = start(tmp, "qwen2", "qwen2-0.5b-shapes-random", s)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(merges))
    w.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")))
    w.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")))
    rng = np.random.default_rng(seed)

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def vector(n, scale=0.02):
        return (rng.standard_normal(n, dtype=np.float32) * scale).astype(np.float32)

    w.add_tensor("token_embd.weight", matrix(s["vocab"], s["hidden"]))  # tied: also the output head
    add_layers(w, s, matrix, vector)
    finish(w, tmp, out)


def spm_tokenizer(path: Path | None) -> Path:
    """`path`, or mistral-common's 32000-piece tokenizer.model.v1 taken from its wheel (PyPI)."""
    if path:
        return path
    d = Path(tempfile.mkdtemp())
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(d), "mistral-common==1.13.1"],
                   check=True)
    wheel = next(d.glob("mistral_common-*.whl"))
    out = d / "tokenizer.model"
    out.write_bytes(zipfile.ZipFile(wheel).read("mistral_common/data/tokenizer.model.v1"))
    return out


def write_tinyllama_q4_0(out: Path, tokenizer: Path, s: dict = TINYLLAMA, seed: int = 0) -> None:
    import gguf
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    sp.Load(str(tokenizer))
    n = sp.GetPieceSize()
    assert n == s["vocab"], f"the tokenizer has {n} pieces; the shapes need {s['vocab']}"
    tmp = out.with_suffix(".partial")
    w = start(tmp, "llama", "tinyllama-shapes-random", s, rope_dims=True)
    w.add_vocab_size(n)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.IdToPiece(i) for i in range(n)])
    w.add_token_scores([sp.GetScore(i) for i in range(n)])
    w.add_token_types([3 if sp.IsControl(i) else 2 if sp.IsUnknown(i) else 6 if sp.IsByte(i) else 1 for i in range(n)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    rng = np.random.default_rng(seed)
    q4 = gguf.GGMLQuantizationType.Q4_0

    def matrix(rows, cols):
        return quantize(rng.standard_normal((rows, cols), dtype=np.float32) * 0.02, "Q4_0")

    w.add_tensor("token_embd.weight", matrix(n, s["hidden"]), raw_dtype=q4)
    add_layers(w, s, matrix, raw_dtype=q4)
    w.add_tensor("output.weight", matrix(n, s["hidden"]), raw_dtype=q4)
    finish(w, tmp, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="model", required=True)
    t = sub.add_parser("tinyllama", help="TinyLlama-1.1B's shapes, Q4_0")
    t.add_argument("--out", type=Path, default=OUT / "tinyllama-shapes-q4_0.gguf")
    t.add_argument("--tokenizer", type=Path, help="a 32000-piece SentencePiece tokenizer.model")
    q = sub.add_parser("qwen2", help="Qwen2.5-0.5B's shapes, F16 quantized by llama-quantize (Q4_K_M)")
    q.add_argument("--out", type=Path, default=OUT / "qwen2-0.5b-shapes-q4_k_m.gguf")
    q.add_argument("--llama-quantize", type=Path, required=True, help="llama.cpp's llama-quantize executable")
    q.add_argument("--type", default="Q4_K_M", help="llama-quantize's target type (default: Q4_K_M)")
    q.add_argument("--tokenizer-from", type=Path, required=True,
                   help="a GGUF with a byte-level BPE vocabulary (e.g. SmolLM2-135M-Instruct.Q4_1.gguf)")
    a = ap.parse_args()
    if a.out.exists():
        print(f"{a.out} exists ({a.out.stat().st_size / 1e6:.0f} MB)")
        return
    a.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if a.model == "tinyllama":
        write_tinyllama_q4_0(a.out, spm_tokenizer(a.tokenizer))
        made = ""
    else:
        f16 = a.out.with_name(a.out.name.replace(".gguf", "") + ".f16.gguf")
        if not f16.exists():
            write_qwen2_f16(f16, a.tokenizer_from)
        subprocess.run([str(a.llama_quantize), str(f16), str(a.out), a.type], check=True)
        made = f"; the F16 source is {f16}"
    print(f"wrote {a.out} ({a.out.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s{made}")


if __name__ == "__main__":
    main()
