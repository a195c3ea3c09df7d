"""Random-weight GGUF files with real models' shapes, made for the benchmarks, so that llmcli and
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

The command line only: the shapes are shape_configs.py's, the files shaped_gguf.py's (gpt-oss:
gpt_oss_shapes.py's), quantized by llama_quantize.py; 48 layers from 8 by repeat_layers.py. The GGUF
block encoders the tests share are gguf_blocks.py's, gpt-oss's MXFP4 folders gpt_oss_mxfp4.py's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from .llama_quantize import f16_source, llama_quantize
from .shape_configs import LLAMAS, OUT, QWEN3_30B_A3B
from .shaped_gguf import spm_tokenizer, write_llama3_f16, write_qwen2_f16, write_qwen3moe_f16, write_tinyllama_q4_0


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
        llama_quantize(a.llama_quantize, f16, a.out, a.type, a.threads)
        if getattr(a, "keep_f16", True):
            made = f"; the F16 source is {f16}"
        else:
            f16.unlink()
            made = f"; deleted the F16 source {f16.name}"
    print(f"wrote {a.out} ({a.out.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s{made}")


if __name__ == "__main__":
    main()
