"""A 1B-class benchmark model: random weights with TinyLlama-1.1B's shapes, written once as a Q4_0 GGUF,
so llmcli and llama.cpp read the same bytes. Quality is irrelevant; memory traffic is what it measures.

    python benchmarks/tinyllama_shapes.py --out ~/.cache/llmcli-bench/tinyllama-shapes-q4_0.gguf
    llmcli bench ~/.cache/llmcli-bench/tinyllama-shapes-q4_0.gguf -p 512 -n 128 -r 5 --baseline llama.cpp

The vocabulary is a real 32000-piece SentencePiece model (TinyLlama's size): pass one with --tokenizer
(e.g. mistral-common's `tokenizer.model.v1`), or it is fetched from the mistral-common wheel on PyPI.
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
import shaped_gguf

# TinyLlama-1.1B-Chat-v1.0 config.json
SHAPES = dict(hidden=2048, intermediate=5632, layers=22, heads=32, kv_heads=4, vocab=32000, ctx=2048,
              rope_theta=10000.0, eps=1e-5)


def spm_tokenizer(path: Path | None) -> Path:
    if path:
        return path
    d = Path(tempfile.mkdtemp())
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(d), "mistral-common==1.13.1"],
                   check=True)
    wheel = next(d.glob("mistral_common-*.whl"))
    out = d / "tokenizer.model"
    out.write_bytes(zipfile.ZipFile(wheel).read("mistral_common/data/tokenizer.model.v1"))
    return out


def write(out: Path, tokenizer: Path, seed: int = 0) -> None:
    import gguf
    import sentencepiece as spm
    from gguf.quants import quantize

    sp = spm.SentencePieceProcessor()
    sp.Load(str(tokenizer))
    n = sp.GetPieceSize()
    assert n == SHAPES["vocab"], f"the tokenizer has {n} pieces; TinyLlama's shapes need {SHAPES['vocab']}"
    s = SHAPES
    tmp = out.with_suffix(".partial")
    w = shaped_gguf.start(tmp, "llama", "tinyllama-shapes-random", s, rope_dims=True)
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
        return quantize((rng.standard_normal((rows, cols), dtype=np.float32) * 0.02), q4)

    w.add_tensor("token_embd.weight", matrix(n, s["hidden"]), raw_dtype=q4)
    shaped_gguf.add_layers(w, s, matrix, raw_dtype=q4)
    w.add_tensor("output.weight", matrix(n, s["hidden"]), raw_dtype=q4)
    shaped_gguf.finish(w, tmp, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "llmcli-bench" / "tinyllama-shapes-q4_0.gguf")
    ap.add_argument("--tokenizer", type=Path, help="a 32000-piece SentencePiece tokenizer.model")
    a = ap.parse_args()
    if a.out.exists():
        print(f"{a.out} exists ({a.out.stat().st_size / 1e6:.0f} MB)")
        return
    a.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    write(a.out, spm_tokenizer(a.tokenizer))
    print(f"wrote {a.out} ({a.out.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
