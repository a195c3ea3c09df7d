"""A tiny mixture-of-experts model three ways: transformers (float32, the reference), llmcli from its
HF folder, and llmcli from the GGUF that llama.cpp's own converter and quantizer make of it, whose
greedy tokens are compared with llama.cpp's on the same file (issue 37's fidelity check, outside the
suite: it needs llama.cpp's tools).

    python -m benchmarks.quality.moe_vs_llamacpp --llama-cpp /work/llama.cpp [--types F32,Q8_0,Q4_K_M]
        [--tokenizer-from ~/.cache/llmcli-bench/smollm2-135m-instruct-bf16] [--layers 4 --experts 16]

The model: Qwen3-MoE's shape scaled down (hidden 256, 4 layers, 16 experts of 128, 4 a token,
norm_topk_prob), random weights, SmolLM2's tokenizer (a vocabulary llama.cpp's converter knows).
Printed: the largest logit difference of llmcli's folder path against transformers (relative to the
largest logit), then per GGUF type the greedy tokens of both engines for a prompt and where they part,
and whether the top two logits were near-tied there (llmcli's, where it parts).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

PROMPT = "The capital of France is"
TOKENS = 24


def tiny_moe(folder: Path, tokenizer: Path, layers: int, experts: int, seed: int = 0) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    vocab = json.loads((tokenizer / "config.json").read_text())["vocab_size"]
    config = AutoConfig.for_model("qwen3_moe", vocab_size=vocab, hidden_size=256, intermediate_size=512,
                                  moe_intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=64, num_experts=experts, num_experts_per_tok=4,
                                  norm_topk_prob=True, max_position_embeddings=2048, rms_norm_eps=1e-6,
                                  tie_word_embeddings=False, initializer_range=0.05, eos_token_id=2, bos_token_id=1)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, folder / name)


def llmcli_greedy(path: Path, n: int) -> list[int]:
    from llmcli.decode.request import Request
    from llmcli.decode.sampling_plain import SamplingParams
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(path), device="cpu", ctx_size=256)
    ids = rt.loaded.tokenizer.encode(PROMPT)
    out = [t for c in rt.generate(ids, Request(SamplingParams(temperature=0), max_tokens=n, ignore_eos=True),
                                  rt.new_cache(), rt.decode_step(False)) for t in c.tokens]
    return ids, out


def llamacpp_greedy(bin_dir: Path, path: Path, n: int) -> str:
    out = subprocess.run([str(bin_dir / "llama-simple"), "-m", str(path), "-n", str(n), PROMPT],
                         capture_output=True, text=True, timeout=600)
    return out.stdout


def _gap(rt, ids: list[int]) -> str:
    """Where the engines part: llmcli's top two logits there, and their gap relative to the top."""
    with torch.no_grad():
        logits = rt.loaded.model(torch.tensor([ids]), rt.new_cache())[0, -1].float()
    top = logits.topk(2).values.tolist()
    return f"; where they part, llmcli's top two logits are {top[0]:.4f} and {top[1]:.4f} ({(top[0] - top[1]) / abs(top[0]):.2%} apart)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp's source folder (built: build/bin)")
    ap.add_argument("--types", default="F32,Q8_0,Q4_K_M")
    ap.add_argument("--tokenizer-from", type=Path, default=Path.home() / ".cache/llmcli-bench/smollm2-135m-instruct-bf16")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen3moe-tiny"
        tiny_moe(folder, a.tokenizer_from, a.layers, a.experts)
        from transformers import AutoModelForCausalLM

        from llmcli.runtime.runtime import open_model

        ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        rt = open_model(str(folder), device="cpu", dtype="float32", ctx_size=256)
        ids = torch.tensor([rt.loaded.tokenizer.encode(PROMPT)])
        with torch.no_grad():
            want, got = ref(ids).logits, rt.loaded.model(ids, rt.new_cache())
        print(f"HF folder, float32: max |llmcli - transformers| = {float((got - want).abs().max()):.2e} "
              f"(largest logit {float(want.abs().max()):.2f})")
        f32 = Path(tmp) / "tiny.f32.gguf"
        python = a.llama_cpp / "venv/bin/python"
        subprocess.run([str(python), str(a.llama_cpp / "convert_hf_to_gguf.py"), str(folder), "--outtype", "f32",
                        "--outfile", str(f32)], check=True, capture_output=True)
        for kind in a.types.split(","):
            path = f32
            if kind != "F32":
                path = Path(tmp) / f"tiny.{kind.lower()}.gguf"
                subprocess.run([str(a.llama_cpp / "build/bin/llama-quantize"), str(f32), str(path), kind], check=True,
                               capture_output=True)
            prompt_ids, ours = llmcli_greedy(path, TOKENS)
            theirs = llamacpp_greedy(a.llama_cpp / "build/bin", path, TOKENS)
            rt = open_model(str(path), device="cpu", ctx_size=256)
            tok = rt.loaded.tokenizer
            text = tok.decode(ours)
            cont = theirs.strip()[len(PROMPT):] if theirs.strip().startswith(PROMPT) else ""
            # llmcli's tokens whose text llama.cpp's continuation starts with (its text: no token ids printed)
            agree = max(i for i in range(len(ours) + 1) if cont.startswith(tok.decode(ours[:i])))
            print(f"{kind}: llmcli {text!r}\n{' ' * len(kind)}  llama.cpp {theirs.strip()!r}\n"
                  f"{' ' * len(kind)}  the first {agree} of {TOKENS} tokens agree{_gap(rt, prompt_ids + ours[:agree]) if agree < TOKENS else ''}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
