"""Hugging Face safetensors folders in bf16, the form every HF repo comes in, and llama.cpp's own GGUF
files of the same weights: F16 by its `convert_hf_to_gguf.py`, then Q8_0 and Q4_0 (or any type) by its
`llama-quantize`. llmcli runs the folder (as it is, or with `--quant`); llama.cpp runs the files.

    python -m benchmarks.hf_folders smollm2 --gguf SmolLM2-135M-Instruct.Q4_1.gguf --llama-cpp LLAMA_CPP
    python -m benchmarks.hf_folders qwen2-1.5b --tokenizer-from SmolLM2-135M-Instruct.Q4_1.gguf --llama-cpp LLAMA_CPP
    options: [--types Q8_0,Q4_0,Q4_K_M] [--out-dir DIR] [--convert-python PY]

smollm2     SmolLM2-135M-Instruct, read from its real GGUF by transformers (Q4_1 unpacked to bf16; Q and K
            rows back in HF order), saved with its tokenizer and chat template; checked by a greedy answer.
qwen2-1.5b  Qwen2.5-1.5B's shapes (28 layers, hidden 1536, 12 heads / 2 KV heads, intermediate 8960, tied
            embeddings, q/k/v biases), random weights (normal, std 0.02). The tokenizer is SmolLM2's
            (49152 pieces) and config.json keeps vocab_size 151936: the embedding and head are full size,
            and llama.cpp's converter pads the vocabulary with unused pieces to match.

LLAMA_CPP is the llama.cpp source tree (convert_hf_to_gguf.py and its gguf-py, build/bin/llama-quantize)
or its build/bin; the converter runs with LLAMA_CPP/venv/bin/python when there is one (its own
transformers and gguf-py, not the project's). Everything lands in ~/.cache/llmcli-bench:
NAME-bf16/ (the folder), NAME.f16.gguf, NAME.q8_0.gguf, NAME.q4_0.gguf.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from .shape_configs import OUT

SMOLLM2 = "smollm2-135m-instruct"
QWEN2_1_5B = "qwen2.5-1.5b-shapes"
# Qwen2.5-1.5B-Instruct's config.json
QWEN2_1_5B_CONFIG = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                         rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         tie_word_embeddings=True, hidden_act="silu")


def folder(name: str, out_dir: Path = OUT) -> Path:
    return out_dir / f"{name}-bf16"


def gguf_file(name: str, type_name: str, out_dir: Path = OUT) -> Path:
    return out_dir / f"{name}.{type_name.lower()}.gguf"


# -------------------------------------------------------------------------------- the HF folders

def save_tokenizer(tokenizer, out: Path) -> None:
    """The tokenizer as transformers saves it, named as a fast tokenizer every transformers version
    loads (5.x writes its own class name, which llama.cpp's converter's transformers 4.x lacks)."""
    tokenizer.save_pretrained(out)
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False))


def write_smollm2(gguf: Path, out: Path) -> None:
    """The real GGUF unpacked by transformers to bf16, saved as a folder; a greedy answer checks it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert tokenizer.chat_template, f"{gguf} gave no chat template"
    packed = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
                                                  quantization_config=GgufConfig(dequantize=True))
    config = packed.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a plain bf16 model from here on
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(packed.state_dict(), strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    model.tie_weights()
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    answer = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(answer[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in text, f"the unpacked model answers {text!r}"
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)


def write_qwen2_shapes(tokenizer_gguf: Path, out: Path, seed: int = 0) -> None:
    """Qwen2.5-1.5B's shapes with random weights, built on the meta device (no float32 copy of 1.5 B
    parameters), then filled in bf16: norms 1, every other weight and bias normal with std 0.02."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_gguf.parent, gguf_file=tokenizer_gguf.name)
    config = Qwen2Config(**QWEN2_1_5B_CONFIG, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    model.tie_weights()
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)


# ------------------------------------------------------------------- llama.cpp's files of the same weights

def llama_cpp_paths(given: Path) -> tuple[Path, Path]:
    """(the source tree with convert_hf_to_gguf.py, the folder with llama-quantize) from either one."""
    given = given.expanduser().resolve()
    root, bin_dir = (given.parent.parent, given) if (given / "llama-quantize").exists() else (given, given / "build" / "bin")
    for path in (root / "convert_hf_to_gguf.py", bin_dir / "llama-quantize"):
        if not path.exists():
            sys.exit(f"no {path.name} in {path.parent}; build llama.cpp's tools as benchmarks/README.md says")
    return root, bin_dir


def convert(source: Path, root: Path, bin_dir: Path, types: list[str], name: str, out_dir: Path,
            python: Path | None = None) -> list[Path]:
    """F16 by convert_hf_to_gguf.py, then each type by llama-quantize from that F16; files already there
    are kept."""
    python = python or (root / "venv" / "bin" / "python")
    f16 = gguf_file(name, "F16", out_dir)
    if not f16.exists():
        subprocess.run([str(python if python.exists() else sys.executable), str(root / "convert_hf_to_gguf.py"),
                        str(source), "--outtype", "f16", "--outfile", str(f16)], check=True)
    made = [f16]
    for t in types:
        out = gguf_file(name, t, out_dir)
        if not out.exists():
            done = subprocess.run([str(bin_dir / "llama-quantize"), str(f16), str(out), t], capture_output=True,
                                  text=True)
            if done.returncode != 0:
                sys.exit(f"llama-quantize {t} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
        made.append(out)
    return made


def tensor_types(path: Path) -> str:
    """"Q4_0 x168, Q6_K x1, F32 x57": what llama-quantize chose per tensor (it keeps some at higher precision)."""
    import gguf
    from collections import Counter

    counts = Counter(t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors)
    return ", ".join(f"{k} x{v}" for k, v in counts.most_common())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="model", required=True)
    s = sub.add_parser("smollm2", help="SmolLM2-135M-Instruct from its real GGUF")
    s.add_argument("--gguf", type=Path, required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf (llmcli pull smollm2)")
    q = sub.add_parser("qwen2-1.5b", help="Qwen2.5-1.5B's shapes, random weights")
    q.add_argument("--tokenizer-from", type=Path, required=True, help="a GGUF whose tokenizer to borrow (SmolLM2's)")
    for p in (s, q):
        p.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp's source tree, or its build/bin")
        p.add_argument("--types", default="Q8_0,Q4_0", help="llama-quantize types made from the F16 (default Q8_0,Q4_0)")
        p.add_argument("--out-dir", type=Path, default=OUT)
        p.add_argument("--convert-python", type=Path, help="the Python that runs convert_hf_to_gguf.py "
                                                           "(default: LLAMA_CPP/venv/bin/python)")
    a = ap.parse_args()
    root, bin_dir = llama_cpp_paths(a.llama_cpp)
    name = SMOLLM2 if a.model == "smollm2" else QWEN2_1_5B
    out = folder(name, a.out_dir)
    t0 = time.perf_counter()
    if not (out / "config.json").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        if a.model == "smollm2":
            write_smollm2(a.gguf.expanduser(), partial)
        else:
            write_qwen2_shapes(a.tokenizer_from.expanduser(), partial)
        partial.replace(out)  # a half-written folder never has the final name
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"{out}: {size / 1e6:.0f} MB of safetensors", flush=True)
    for path in convert(out, root, bin_dir, [t.strip() for t in a.types.split(",") if t.strip()], name, a.out_dir,
                        a.convert_python):
        print(f"{path}: {path.stat().st_size / 1e6:.0f} MB ({tensor_types(path)})", flush=True)
    print(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
