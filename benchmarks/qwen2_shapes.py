"""A qwen2 0.5B-class benchmark model: random weights with Qwen2.5-0.5B's shapes (q/k/v bias, tied
embeddings, 151936-entry vocabulary), written as an F16 GGUF and quantized with llama.cpp's own
`llama-quantize` to Q4_K_M, the format users download, so llmcli and llama-bench read the same bytes.

    python benchmarks/qwen2_shapes.py --llama-quantize PATH/llama-quantize
    llmcli bench ~/.cache/llmcli-bench/qwen2-0.5b-shapes-q4_k_m.gguf -t 2 -p 512 -n 128 -r 5 --baseline llama-bench

The vocabulary is a real byte-level BPE (SmolLM2's, from a GGUF given with --tokenizer-from), padded
with unreachable pieces to Qwen2's 151936 entries: the embedding and head are full-size, which is
what decoding speed depends on. Quality is irrelevant.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import numpy as np
import shaped_gguf

# Qwen2.5-0.5B-Instruct config.json
SHAPES = dict(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936, ctx=32768,
              rope_theta=1000000.0, eps=1e-6)
OUT = Path.home() / ".cache" / "llmcli-bench"


def write_f16(out: Path, tokenizer_gguf: Path, seed: int = 0) -> None:
    import gguf

    src = gguf.GGUFReader(str(tokenizer_gguf))

    def field(name):
        f = src.fields[name]
        return [f.contents(i) for i in range(len(f.data))] if len(f.data) > 1 else f.contents()

    tokens, types, merges = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type"), field("tokenizer.ggml.merges")
    s = SHAPES
    pad = s["vocab"] - len(tokens)
    tokens = list(tokens) + [f"<|unused_{i}|>" for i in range(pad)]
    types = list(types) + [5] * pad  # UNUSED: never produced by the tokenizer
    tmp = out.with_suffix(".partial")
    w = shaped_gguf.start(tmp, "qwen2", "qwen2-0.5b-shapes-random", s)
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
    shaped_gguf.add_layers(w, s, matrix, vector)
    shaped_gguf.finish(w, tmp, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT / "qwen2-0.5b-shapes-q4_k_m.gguf")
    ap.add_argument("--llama-quantize", type=Path, required=True, help="llama.cpp's llama-quantize executable")
    ap.add_argument("--type", default="Q4_K_M", help="llama-quantize's target type (default: Q4_K_M)")
    ap.add_argument("--tokenizer-from", type=Path, required=True,
                    help="a GGUF with a byte-level BPE vocabulary (e.g. SmolLM2-135M-Instruct.Q4_1.gguf)")
    a = ap.parse_args()
    if a.out.exists():
        print(f"{a.out} exists ({a.out.stat().st_size / 1e6:.0f} MB)")
        return
    a.out.parent.mkdir(parents=True, exist_ok=True)
    f16 = a.out.with_name(a.out.name.replace(".gguf", "") + ".f16.gguf")
    t0 = time.perf_counter()
    if not f16.exists():
        write_f16(f16, a.tokenizer_from)
    subprocess.run([str(a.llama_quantize), str(f16), str(a.out), a.type], check=True)
    print(f"wrote {a.out} ({a.out.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s; "
          f"the F16 source is {f16}")


if __name__ == "__main__":
    main()
