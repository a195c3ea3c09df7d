"""GGUF weights made here, for the benchmarks and the tests: encoders for GGUF's K-quant blocks
(gguf-py only decodes them), and random-weight models with real models' shapes, so that llmcli and
llama.cpp time the same bytes (quality is irrelevant; memory traffic is what they measure).

    python -m benchmarks.shapes tinyllama [--out FILE] [--tokenizer tokenizer.model]
    python -m benchmarks.shapes qwen2 --llama-quantize PATH/llama-quantize --tokenizer-from SmolLM2.gguf [--out FILE]
    python -m benchmarks.shapes llama3.2-3b --llama-quantize PATH/llama-quantize --tokenizer-from SmolLM2.gguf
    python -m benchmarks.shapes llama3.1-8b --llama-quantize PATH/llama-quantize --tokenizer-from SmolLM2.gguf
        options of the last three: [--type Q4_K_M] [--threads N] (llama-quantize's) [--keep-f16] [--out FILE]
    python -m benchmarks.shapes qwen3moe --layers 8 --llama-quantize PATH/llama-quantize --tokenizer-from SmolLM2.gguf
    python -m benchmarks.shapes qwen3moe --layers 48 --from-layers 8 ...   (repeat_layers.py: no 61 GB F16)
    python -m benchmarks.shapes gpt-oss --layers 4 --outtype q8_0 --llama-cpp LLAMA_CPP --tokenizer-dir SMOLLM2_FOLDER
    llmcli bench FILE -t 2 -p 512 -n 128 -r 5 --llama-bench PATH/llama-bench

tinyllama  TinyLlama-1.1B's shapes in Q4_0, with a real 32000-piece SentencePiece vocabulary (--tokenizer,
           e.g. mistral-common's tokenizer.model.v1; else fetched from the mistral-common wheel on PyPI)
qwen2      Qwen2.5-0.5B's shapes (q/k/v bias, tied embeddings, 151936 entries), written F16 and quantized
           by llama.cpp's own llama-quantize to Q4_K_M, the format users download. The vocabulary is
           SmolLM2's byte-level BPE (a GGUF given with --tokenizer-from), padded with unreachable pieces
           to Qwen2's size: the embedding and head are full-size, which is what decoding speed depends on.
llama3.2-3b  Llama-3.2-3B's shapes (hidden 3072, 28 layers, 24 heads / 8 KV heads of 128, intermediate 8192,
             vocab 128256, tied embeddings, rope_theta 500000 with llama3 RoPE scaling: a rope_freqs tensor),
             arch "llama", the same padded SmolLM2 vocabulary (and its chat template); written F16, quantized
             by llama-quantize, the F16 deleted (--keep-f16 keeps it): ~/.cache/llmcli-bench/
             llama3.2-3b-shapes.q4_k_m.gguf. Q and K rows are not permuted as llama.cpp's converter does
             (random weights: nothing to keep).
llama3.1-8b  Llama-3.1-8B's shapes (hidden 4096, 32 layers, 32 heads / 8 KV heads, intermediate 14336, vocab
             128256, an untied output head), likewise: llama3.1-8b-shapes.q4_k_m.gguf (its F16 is 16 GB).
             Random values are made and written a slice of rows at a time (64 MB of float32): the writer
             peaks under 0.5 GB (measured: 0.46 GB with the 8B's 1 GB embedding).
qwen3moe   Qwen3-30B-A3B's shapes, its first --layers (F16, then llama-quantize); with --from-layers M, the
           M-layer file (made first where missing) repeated to --layers by repeat_layers.py, which copies
           quantized layers' bytes: 48 layers are 18.6 GB of Q4_K_M, their F16 61 GB.
gpt-oss    gpt-oss-20b's shapes, MXFP4 experts, through llama.cpp's converter (gpt_oss_shapes.py).
Qwen2.5-1.5B's shapes in Q4_K_M come from the F16 file benchmarks.hf_folders writes:
    PATH/llama-quantize ~/.cache/llmcli-bench/qwen2.5-1.5b-shapes.f16.gguf ~/.cache/llmcli-bench/qwen2.5-1.5b-shapes.q4_k_m.gguf Q4_K_M

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
    nonzero = lambda v: np.where(v > 0, v, 1.0)  # a block of zeros rounds d to 0 in half precision
    sc = np.clip(np.round(scale / nonzero(d)[:, None]), 1, 63).astype(np.uint8)
    m = np.clip(np.round(mins / nonzero(dmin)[:, None]), 0, 63).astype(np.uint8)
    step = nonzero(d[:, None] * sc)[..., None]
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


def mxfp4_hf(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N, K) float32 -> gpt-oss's MXFP4 as its HF checkpoints hold it: blocks (N, K/32, 16) uint8 (byte j:
    element 2j low nibble, 2j + 1 high) and scales (N, K/32) uint8 (e8m0), quantized by gguf-py's MXFP4;
    and the values they hold."""
    import gguf
    from gguf.quants import dequantize

    N, K = w.shape
    q = quantize(w, "MXFP4").reshape(N, K // 32, 17)  # GGUF's: [e][16 bytes: element j low, j + 16 high]
    packed = q[..., 1:]
    codes = np.concatenate((packed & 15, packed >> 4), axis=-1)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return blocks, q[..., 0].copy(), dequantize(q.reshape(N, -1), gguf.GGMLQuantizationType.MXFP4).reshape(N, K)


def save_gpt_oss_mxfp4(model, folder) -> dict[str, np.ndarray]:
    """A transformers gpt-oss saved as OpenAI ships it: each layer's experts as MXFP4 `*_blocks` and
    `*_scales` ((E, N, K/32, 16) and (E, N, K/32), N the output features, gate_up's rows alternating
    gate, up), `quantization_config` {"quant_method": "mxfp4"} (what llama.cpp's converter repacks as
    GGUF MXFP4); the rest float32. -> the per-expert values the blocks hold, under llmcli's names
    (`model.layers.0.mlp.experts.3.gate_proj.weight`)."""
    import json
    from pathlib import Path

    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tensors, held = {}, {}
    for name, t in model.state_dict().items():
        a = t.detach().float().numpy()
        if not (name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj")):
            tensors[name] = np.ascontiguousarray(a)
            continue
        per = [mxfp4_hf(np.ascontiguousarray(a[e].T)) for e in range(a.shape[0])]  # each (N, K): (2I, H) or (H, I)
        tensors[name + "_blocks"] = np.stack([p[0] for p in per])
        tensors[name + "_scales"] = np.stack([p[1] for p in per])
        base = name.rsplit(".", 1)[0]
        for e, (_, _, back) in enumerate(per):
            parts = {"gate": back[0::2], "up": back[1::2]} if name.endswith("gate_up_proj") else {"down": back}
            held.update({f"{base}.{e}.{kind}_proj.weight": m.astype(np.float32) for kind, m in parts.items()})
    for f in folder.glob("*.safetensors"):
        f.unlink()
    (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return held


# ------------------------------------------------------------------------ models with real shapes

# Qwen2.5-0.5B-Instruct and TinyLlama-1.1B-Chat-v1.0, from their config.json
QWEN2 = dict(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936, ctx=32768,
             rope_theta=1000000.0, eps=1e-6)
TINYLLAMA = dict(hidden=2048, intermediate=5632, layers=22, heads=32, kv_heads=4, vocab=32000, ctx=2048,
                 rope_theta=10000.0, eps=1e-5)
# Llama-3.2-3B and Llama-3.1-8B (Instruct), from their config.json
LLAMA3_ROPE = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
LLAMA32_3B = dict(hidden=3072, intermediate=8192, layers=28, heads=24, kv_heads=8, vocab=128256, ctx=131072,
                  rope_theta=500000.0, eps=1e-5, tied=True, rope_scaling=dict(LLAMA3_ROPE, factor=32.0))
LLAMA31_8B = dict(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=128256, ctx=131072,
                  rope_theta=500000.0, eps=1e-5, tied=False, rope_scaling=dict(LLAMA3_ROPE, factor=8.0))
LLAMAS = {"llama3.2-3b": LLAMA32_3B, "llama3.1-8b": LLAMA31_8B}
# Qwen3-30B-A3B (config.json): 48 layers of 128 experts of 768, 8 a token; heads of 128 (q is 4096 wide)
QWEN3_30B_A3B = dict(hidden=2048, intermediate=6144, layers=48, heads=32, kv_heads=4, head_dim=128, vocab=151936,
                     ctx=40960, rope_theta=1000000.0, eps=1e-6, experts=128, experts_used=8, expert_ff=768)
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


class RandomF16:
    """A (rows, cols) float16 matrix of normal values (std 0.02) that GGUFWriter writes as it writes an
    array (shape, dtype, nbytes, tofile), made a slice of rows at a time: an 8B model's 16 GB never
    sit in memory. `seed` makes the same values every time."""

    def __init__(self, rows: int, cols: int, seed, std: float = 0.02, chunk_bytes: int = 64 << 20,
                 experts: int | None = None):
        self.shape = (rows, cols) if experts is None else (experts, rows, cols)  # (a 3-D stack of experts' matrices)
        self.dtype, self.nbytes = np.dtype(np.float16), rows * cols * 2 * (experts or 1)
        self.seed, self.std, self.step = seed, std, max(1, chunk_bytes // (4 * cols))

    def tofile(self, fout) -> None:
        rng = np.random.default_rng(self.seed)
        rows, cols = int(np.prod(self.shape[:-1])), self.shape[-1]
        for r in range(0, rows, self.step):
            x = rng.standard_normal((min(self.step, rows - r), cols), dtype=np.float32)
            x *= self.std
            x.astype(np.float16).tofile(fout)


def add_bpe_vocab(w, tokenizer_gguf: Path, vocab: int, pre: str | None = None, template: bool = False) -> None:
    """A GGUF's byte-level BPE vocabulary (tokens, types, merges, BOS/EOS), padded with unreachable
    pieces to `vocab` entries; `pre`: the pre-tokenizer's name (default: the source's); `template`:
    its chat template too."""
    import gguf

    src = gguf.GGUFReader(str(tokenizer_gguf))

    def field(name):
        f = src.fields[name]
        return [f.contents(i) for i in range(len(f.data))] if len(f.data) > 1 else f.contents()

    tokens, types, merges = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type"), field("tokenizer.ggml.merges")
    pad = vocab - len(tokens)
    tokens = list(tokens) + [f"<|unused_{i}|>" for i in range(pad)]
    types = list(types) + [5] * pad  # UNUSED: never produced by the tokenizer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre or str(field("tokenizer.ggml.pre")))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(merges))
    w.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")))
    w.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")))
    if template and "tokenizer.chat_template" in src.fields:
        w.add_chat_template(str(field("tokenizer.chat_template")))


def write_qwen2_f16(out: Path, tokenizer_gguf: Path, s: dict = QWEN2, seed: int = 0) -> None:
    import gguf

    tmp = out.with_suffix(".partial")
    w = start(tmp, "qwen2", "qwen2-0.5b-shapes-random", s)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_bpe_vocab(w, tokenizer_gguf, s["vocab"], pre="qwen2")
    rng = np.random.default_rng(seed)

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def vector(n, scale=0.02):
        return (rng.standard_normal(n, dtype=np.float32) * scale).astype(np.float32)

    w.add_tensor("token_embd.weight", matrix(s["vocab"], s["hidden"]))  # tied: also the output head
    add_layers(w, s, matrix, vector)
    finish(w, tmp, out)


def write_llama3_f16(out: Path, tokenizer_gguf: Path, name: str, s: dict, seed: int = 0) -> None:
    """Llama 3's shapes in F16 (RandomF16: written a slice at a time), with llama3 RoPE scaling as the
    converter stores it (a rope_freqs tensor, llmcli's own extra_tensors) and an output head unless tied."""
    from types import SimpleNamespace

    import gguf

    from llmcli.formats.gguf_hparams import extra_tensors

    tmp = out.with_suffix(".partial")
    w = start(tmp, "llama", f"{name}-shapes-random", s, rope_dims=True)
    w.add_vocab_size(s["vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_bpe_vocab(w, tokenizer_gguf, s["vocab"], template=True)
    seeds = iter(np.random.SeedSequence(seed).spawn(4 + 9 * s["layers"]))

    def matrix(rows, cols):
        return RandomF16(rows, cols, next(seeds))

    head_dim = s["hidden"] // s["heads"]
    rope = SimpleNamespace(rope_scaling=s["rope_scaling"], head_dim=head_dim, rope_theta=s["rope_theta"])
    for tensor_name, values in extra_tensors("llama", rope).items():
        w.add_tensor(tensor_name, values)
    w.add_tensor("token_embd.weight", matrix(s["vocab"], s["hidden"]))
    add_layers(w, s, matrix)
    if not s["tied"]:
        w.add_tensor("output.weight", matrix(s["vocab"], s["hidden"]))
    finish(w, tmp, out)


def write_qwen3moe_f16(out: Path, tokenizer_gguf: Path, layers: int, s: dict = QWEN3_30B_A3B, seed: int = 0) -> None:
    """Qwen3-30B-A3B's shapes, its first `layers` layers, in F16 as llama.cpp's converter writes them:
    per layer q/k/v/o with q/k norms, the router (ffn_gate_inp, F32, as llama-quantize leaves it) and
    the experts as 3-D tensors (ffn_{gate,up,down}_exps), an untied output head."""
    import gguf

    s = dict(s, layers=layers)
    tmp = out.with_suffix(".partial")
    w = start(tmp, "qwen3moe", f"qwen3-30b-a3b-{layers}-layers-shapes-random", s)
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_expert_count(s["experts"])
    w.add_expert_used_count(s["experts_used"])
    w.add_expert_feed_forward_length(s["expert_ff"])
    w.add_vocab_size(s["vocab"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_bpe_vocab(w, tokenizer_gguf, s["vocab"], pre="qwen2", template=True)
    seeds = iter(np.random.SeedSequence(seed).spawn(4 + 16 * layers))
    hidden, D, E, ff = s["hidden"], s["head_dim"], s["experts"], s["expert_ff"]
    q, kv = s["heads"] * D, s["kv_heads"] * D
    w.add_tensor("token_embd.weight", RandomF16(s["vocab"], hidden, next(seeds)))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        for part, rows in (("q", q), ("k", kv), ("v", kv)):
            w.add_tensor(f"blk.{i}.attn_{part}.weight", RandomF16(rows, hidden, next(seeds)))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(D, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(D, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_output.weight", RandomF16(hidden, q, next(seeds)))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        router = np.random.default_rng(next(seeds)).standard_normal((E, hidden), dtype=np.float32) * 0.02
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", router)
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", RandomF16(ff, hidden, next(seeds), experts=E))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", RandomF16(ff, hidden, next(seeds), experts=E))
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", RandomF16(hidden, ff, next(seeds), experts=E))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    w.add_tensor("output.weight", RandomF16(s["vocab"], hidden, next(seeds)))
    finish(w, tmp, out)


def f16_source(out: Path, type_name: str) -> Path:
    """NAME.q4_k_m.gguf -> NAME.f16.gguf (any other name: NAME.f16.gguf after the whole stem)."""
    tail = f".{type_name.lower()}.gguf"
    stem = out.name[:-len(tail)] if out.name.endswith(tail) else out.name.replace(".gguf", "")
    return out.with_name(stem + ".f16.gguf")


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
    helps = {"qwen2": ("Qwen2.5-0.5B's shapes", OUT / "qwen2-0.5b-shapes-q4_k_m.gguf"),
             "llama3.2-3b": ("Llama-3.2-3B's shapes", OUT / "llama3.2-3b-shapes.q4_k_m.gguf"),
             "llama3.1-8b": ("Llama-3.1-8B's shapes", OUT / "llama3.1-8b-shapes.q4_k_m.gguf"),
             "qwen3moe": ("Qwen3-30B-A3B's shapes (--layers of its 48)", None)}
    for key, (what, default) in helps.items():
        q = sub.add_parser(key, help=f"{what}, F16 quantized by llama-quantize (Q4_K_M)")
        q.add_argument("--out", type=Path, default=default)
        if key == "qwen3moe":
            q.add_argument("--layers", type=int, default=8, help="layers of the 48 (default 8)")
            q.add_argument("--from-layers", type=int, help="quantize this many layers, then repeat their bytes "
                           "to --layers (benchmarks/repeat_layers.py: 48 layers without a 61 GB F16)")
        q.add_argument("--llama-quantize", type=Path, required=True, help="llama.cpp's llama-quantize executable")
        q.add_argument("--type", default="Q4_K_M", help="llama-quantize's target type (default: Q4_K_M)")
        q.add_argument("--threads", type=int, help="llama-quantize's threads (default: its own, all cores)")
        q.add_argument("--tokenizer-from", type=Path, required=True,
                       help="a GGUF with a byte-level BPE vocabulary (e.g. SmolLM2-135M-Instruct.Q4_1.gguf)")
        if key in LLAMAS or key == "qwen3moe":
            q.add_argument("--keep-f16", action="store_true", help="keep the F16 file llama-quantize read")
    g = sub.add_parser("gpt-oss", help="gpt-oss-20b's shapes (--layers of its 24), MXFP4 experts, by llama.cpp's converter")
    g.add_argument("--layers", type=int, default=24)
    g.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp's source tree (convert_hf_to_gguf.py)")
    g.add_argument("--tokenizer-dir", type=Path, required=True, help="an HF folder with SmolLM2's tokenizer.json")
    g.add_argument("--outtype", default="bf16", help="the converter's type for all but the experts (bf16, q8_0)")
    g.add_argument("--keep-folder", action="store_true", help="keep the HF folder the converter read")
    g.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.model == "qwen3moe" and a.out is None:
        deep = "" if a.layers == QWEN3_30B_A3B["layers"] else f"-{a.layers}l"
        a.out = OUT / f"qwen3-30b-a3b{deep}-shapes.{a.type.lower()}.gguf"
    if a.model == "gpt-oss" and a.out is None:
        deep = "" if a.layers == 24 else f"-{a.layers}l"
        a.out = OUT / f"gpt-oss-20b{deep}-shapes.mxfp4.gguf"
    if a.out.exists():
        print(f"{a.out} exists ({a.out.stat().st_size / 1e6:.0f} MB)")
        return
    a.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if a.model == "tinyllama":
        write_tinyllama_q4_0(a.out, spm_tokenizer(a.tokenizer))
        made = ""
    elif a.model == "gpt-oss":
        from .gpt_oss_shapes import build

        build(a.out, a.llama_cpp, a.tokenizer_dir, a.layers, a.outtype, a.keep_folder)
        made = ""
    elif a.model == "qwen3moe" and a.from_layers and a.from_layers < a.layers:
        from .repeat_layers import repeat_layers

        src = OUT / f"qwen3-30b-a3b-{a.from_layers}l-shapes.{a.type.lower()}.gguf"
        if not src.exists():
            subprocess.run([sys.executable, "-m", "benchmarks.shapes", "qwen3moe", "--layers", str(a.from_layers),
                            "--out", str(src), "--llama-quantize", str(a.llama_quantize), "--type", a.type,
                            "--tokenizer-from", str(a.tokenizer_from)], check=True)
        order = repeat_layers(src, a.out, a.layers, f"qwen3-30b-a3b-{a.layers}-layers-shapes-random")
        made = f"; layers copied from {src.name}'s {order}"
    else:
        f16 = f16_source(a.out, a.type)
        if not f16.exists():
            if a.model == "qwen2":
                write_qwen2_f16(f16, a.tokenizer_from)
            elif a.model == "qwen3moe":
                write_qwen3moe_f16(f16, a.tokenizer_from, a.layers)
            else:
                write_llama3_f16(f16, a.tokenizer_from, a.model, LLAMAS[a.model])
            print(f"wrote {f16} ({f16.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s")
        threads = [str(a.threads)] if a.threads else []
        subprocess.run([str(a.llama_quantize), str(f16), str(a.out), a.type, *threads], check=True)
        if getattr(a, "keep_f16", True):
            made = f"; the F16 source is {f16}"
        else:
            f16.unlink()
            made = f"; deleted the F16 source {f16.name}"
    print(f"wrote {a.out} ({a.out.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s{made}")


if __name__ == "__main__":
    main()
