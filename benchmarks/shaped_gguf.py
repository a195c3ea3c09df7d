"""GGUF files of random weights with real models' shapes (shape_configs.py), written as llama.cpp's
converter writes them, so that llmcli and llama.cpp time the same bytes: F16 files for llama-quantize
(qwen2, llama 3, qwen3moe), and TinyLlama's Q4_0 with a real SentencePiece vocabulary.

    write_llama3_f16(out, tokenizer_gguf, "llama3.1-8b", LLAMAS["llama3.1-8b"])
    write_tinyllama_q4_0(out, spm_tokenizer(None))

Each file is written under a .partial name and renamed when whole (finish()). Large matrices are
RandomF16: made and written a slice of rows at a time, so an 8B model's 16 GB never sit in memory.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from .gguf_blocks import quantize
from .shape_configs import QWEN2, QWEN3_30B_A3B, TINYLLAMA


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
