"""A tiny mixture-of-experts model three ways: transformers (float32, the reference), llmcli from its
HF folder, and llmcli from the GGUF that llama.cpp's own converter and quantizer make of it, whose
greedy tokens are compared with llama.cpp's on the same file (issue 37's fidelity check, outside the
suite: it needs llama.cpp's tools).

    python -m benchmarks.quality.moe_vs_llamacpp --llama-cpp /work/llama.cpp [--types F32,Q8_0,Q4_K_M]
        [--tokenizer-from ~/.cache/llmcli-bench/smollm2-135m-instruct-bf16] [--layers 4 --experts 16]
        [--family qwen3moe|gpt-oss]

The model: Qwen3-MoE's shape scaled down (hidden 256, 4 layers, 16 experts of 128, 4 a token,
norm_topk_prob), random weights, SmolLM2's tokenizer (a vocabulary llama.cpp's converter knows).
Printed: the largest logit difference of llmcli's folder path against transformers (relative to the
largest logit), then per GGUF type the greedy tokens of both engines for a prompt and where they part,
and whether the top two logits were near-tied there (llmcli's, where it parts).

`--family gpt-oss`: gpt-oss's shape scaled down the same way (head_dim 64, a window of 8 on even
layers, sinks of N(0, 1), experts with biases), saved as OpenAI ships it (experts as MXFP4 blocks and
scales, benchmarks/gpt_oss_mxfp4.py), which llama.cpp's converter repacks as GGUF MXFP4: the types are then
MXFP4 (the converter's file: experts MXFP4, the rest F32), llama-quantize's Q8_0 and Q4_K_M of it
(the experts kept MXFP4), MXFP4_MOE (llama-quantize's of the float file: its own MXFP4 experts) and
F32 (the float folder converted, experts F32 too). Default types for it: MXFP4,Q8_0,Q4_K_M,MXFP4_MOE,F32.
llmcli runs it on the torch path in float32 (llama.cpp's activations are float32 too).
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


def tiny_gpt_oss(folder: Path, tokenizer: Path, layers: int, experts: int, seed: int = 0) -> dict:
    """A float32 gpt-oss in `folder`, and the same model with MXFP4 experts in `folder`.mxfp4 (-> the
    values its blocks hold)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from benchmarks.gpt_oss_mxfp4 import save_gpt_oss_mxfp4

    vocab = json.loads((tokenizer / "config.json").read_text())["vocab_size"]
    config = AutoConfig.for_model("gpt_oss", vocab_size=vocab, hidden_size=256, intermediate_size=128,
                                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                  num_local_experts=experts, num_experts_per_tok=4, sliding_window=8,
                                  max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                  initializer_range=0.05, eos_token_id=2, bos_token_id=1, pad_token_id=0)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # sinks and biases that matter; a head 4x as wide, so top logits tie less often
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.normal_()
            elif "bias" in name:
                p.normal_(std=0.05)
        model.lm_head.weight.mul_(4)
    model.save_pretrained(folder)
    held = save_gpt_oss_mxfp4(model, folder.with_suffix(".mxfp4"))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        for out in (folder, folder.with_suffix(".mxfp4")):
            if (tokenizer / name).exists():
                shutil.copy(tokenizer / name, out / name)
    return held


def llmcli_greedy(path: Path, n: int, dtype: str | None = None) -> list[int]:
    from llmcli.decode.request import Request
    from llmcli.decode.sampling_plain import SamplingParams
    from llmcli.runtime.runtime import open_model

    rt = open_model(str(path), device="cpu", dtype=dtype, ctx_size=256)
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
    ap.add_argument("--types", default=None, help="GGUF types (default: F32,Q8_0,Q4_K_M; gpt-oss: see above)")
    ap.add_argument("--tokenizer-from", type=Path, default=Path.home() / ".cache/llmcli-bench/smollm2-135m-instruct-bf16")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--family", choices=("qwen3moe", "gpt-oss"), default="qwen3moe")
    a = ap.parse_args()
    gpt_oss = a.family == "gpt-oss"
    types = a.types or ("MXFP4,Q8_0,Q4_K_M,MXFP4_MOE,F32" if gpt_oss else "F32,Q8_0,Q4_K_M")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / f"{a.family}-tiny"
        held = tiny_gpt_oss(folder, a.tokenizer_from, a.layers, a.experts) if gpt_oss else \
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
        if gpt_oss:  # the MXFP4 folder against transformers holding what its blocks hold
            import sys as _sys

            _sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
            from tiny import gpt_oss_reference

            from llmcli import models
            from llmcli.formats.open import open_model_file

            mf, cpu = open_model_file(folder.with_suffix(".mxfp4")), torch.device("cpu")
            dequantized = models.build(mf.args, mf.state_dict(torch.float32, cpu), cpu)
            mx = open_model(str(mf.path), device="cpu", dtype="float32", ctx_size=256)
            with torch.no_grad():
                want = gpt_oss_reference(ref, held)(ids).logits
                exact, got = dequantized(ids, mx.new_cache()), mx.loaded.model(ids, mx.new_cache())
            print(f"HF folder, MXFP4 experts: max |llmcli - transformers holding the blocks' values| = "
                  f"{float((exact - want).abs().max()):.2e} dequantized, {float((got - want).abs().max()):.2e} as "
                  "loaded (int8 codes times int8 activations)")
        python = a.llama_cpp / "venv/bin/python"
        converted = {}

        def convert(source: Path, name: str) -> Path:
            if name not in converted:
                out = Path(tmp) / f"tiny.{name}.gguf"
                subprocess.run([str(python), str(a.llama_cpp / "convert_hf_to_gguf.py"), str(source), "--outtype", "f32",
                                "--outfile", str(out)], check=True, capture_output=True)
                converted[name] = out
            return converted[name]

        for kind in types.split(","):
            if kind == "F32":
                path = convert(folder, "f32")
            elif kind == "MXFP4" and gpt_oss:  # the converter's file of the MXFP4 folder, as is
                path = convert(folder.with_suffix(".mxfp4"), "mxfp4")
            else:
                base = convert(folder.with_suffix(".mxfp4"), "mxfp4") if gpt_oss and kind != "MXFP4_MOE" \
                    else convert(folder, "f32")
                path = Path(tmp) / f"tiny.{kind.lower()}.gguf"
                # (the MXFP4 experts kept as they are, as ggml-org's gpt-oss files hold them: llama-quantize
                # refuses to requantize MXFP4)
                keep = ["--tensor-type", "exps=mxfp4"] if base.name == "tiny.mxfp4.gguf" else []
                subprocess.run([str(a.llama_cpp / "build/bin/llama-quantize"), *keep, str(base), str(path), kind],
                               check=True, capture_output=True)
            dtype = "float32" if gpt_oss else None  # (the torch path: float32 activations, as llama.cpp's)
            prompt_ids, ours = llmcli_greedy(path, TOKENS, dtype)
            theirs = llamacpp_greedy(a.llama_cpp / "build/bin", path, TOKENS)
            rt = open_model(str(path), device="cpu", dtype=dtype, ctx_size=256)
            tok = rt.loaded.tokenizer
            text = tok.decode(ours)
            cont = theirs.strip()[len(PROMPT):] if theirs.strip().startswith(PROMPT) else ""
            # llmcli's tokens whose text llama.cpp's continuation starts with (its text: no token ids printed)
            agree = max(i for i in range(len(ours) + 1) if cont.startswith(tok.decode(ours[:i])))
            stored = " (" + ", ".join(f"{n} {t}" for t, n in sorted(_types(path).items())) + ")" if gpt_oss else ""
            print(f"{kind}{stored}: llmcli {text!r}\n{' ' * len(kind)}  llama.cpp {theirs.strip()!r}\n"
                  f"{' ' * len(kind)}  the first {agree} of {TOKENS} tokens agree{_gap(rt, prompt_ids + ours[:agree]) if agree < TOKENS else ''}"
                  f"{_noise(rt, path, prompt_ids + ours) if gpt_oss and kind != 'F32' else ''}")
    sys.stdout.flush()


def _noise(rt, path: Path, ids: list[int]) -> str:
    """How far llmcli's logits as it runs the file (its blocks times int8 activations, as llama.cpp's)
    are from the file's weights dequantized and run in float32, over llmcli's own tokens: the size of
    a gap that rounding alone can close."""
    from llmcli import models
    from llmcli.formats.open import open_model_file

    mf = open_model_file(path)
    ref = models.build(mf.args, mf.state_dict(torch.float32, torch.device("cpu")), torch.device("cpu"))
    with torch.no_grad():
        got, want = rt.loaded.model(torch.tensor([ids]), rt.new_cache())[0], ref(torch.tensor([ids]), rt.new_cache())[0]
    per = ((got - want).abs().amax(-1) / want.abs().amax(-1)).sort().values
    return f"\n  (llmcli's blocks against their float32 values: {float(per[len(per) // 2]):.2%} of the top logit at the median position)"


def _types(path: Path) -> dict[str, int]:
    """How many matrices of each GGUF type the file holds."""
    from llmcli.formats.open import open_model_file

    mf = open_model_file(path)
    counts: dict[str, int] = {}
    for t in mf.reader.tensors:
        if len(t.shape) > 1:
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


if __name__ == "__main__":
    main()
