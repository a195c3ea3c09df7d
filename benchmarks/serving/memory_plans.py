"""The planner's tables for models and machines that need not be here (computed, nothing loaded).

    python -m benchmarks.serving.memory_plans [--smollm2 PATH.gguf]

Prints the plan for SmolLM2-135M at 8192 tokens on this CPU (from the GGUF's headers when given,
else from its known shapes), and for 7-8B models (Qwen2.5-7B, Mistral-7B shapes at 32k tokens,
Llama-3.1-8B at 128k) on a 24 GB and a 12 GB GPU, with bfloat16, q8 and q4 weights: the full table
for bfloat16 weights on 24 GB, one line per case otherwise.
"""

from __future__ import annotations

import argparse

import torch

from llmcli.models.llama import ModelArgs
from llmcli.quant.presets import load_preset
from llmcli.runtime.plan import NotEnoughMemoryError, plan
from llmcli.runtime.probe import Budget, detect_budget, model_shapes, parse_size, weights_bytes, weights_from_files

SMOLLM2 = ModelArgs(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True)
SEVEN_B = {
    "Qwen2.5-7B": ModelArgs(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                            num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                            max_position_embeddings=32768, qkv_bias=True),
    "Mistral-7B-v0.3": ModelArgs(model_type="mistral", vocab_size=32768, hidden_size=4096, intermediate_size=14336,
                                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                 max_position_embeddings=32768),
    "Llama-3.1-8B": ModelArgs(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                              num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                              rope_theta=500000.0),
}


def show(title: str, make) -> None:
    print(f"### {title}\n")
    try:
        print("```\n" + make().table() + "\n```\n")
    except NotEnoughMemoryError as e:
        print(f"error: {e}\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smollm2", help="the SmolLM2 GGUF (default: its known shapes, bfloat16 weights)")
    a = p.parse_args()
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    here = detect_budget(cpu)
    if a.smollm2:
        info = weights_from_files(a.smollm2, None, bf16, cpu)
        args, weights, label = info.args, info.nbytes, info.label
    else:
        args, label = SMOLLM2, "bfloat16"
        weights = weights_bytes(model_shapes(args), args, None, bf16, cpu)
    show("SmolLM2-135M, 8192 tokens, this CPU", lambda: plan(args, weights, label, here, bf16, 8192))
    for kv in ("int8", "int4"):
        show(f"SmolLM2-135M, 8192 tokens, this CPU, --kv-type {kv}",
             lambda: plan(args, weights, label, here, bf16, 8192, kv_type=kv))
    cuda = torch.device("cuda")
    host = parse_size("64G")
    rows = []
    for gpu in ("24G", "12G"):
        budget = Budget("cuda", parse_size(gpu), host, f"a {gpu}B GPU, all of it free")
        for name, args in SEVEN_B.items():
            ctx = args.max_position_embeddings
            for preset in (None, "q8", "q4"):
                pre = load_preset(preset) if preset else None
                w = weights_bytes(model_shapes(args), args, pre, bf16, cuda)
                try:
                    p_ = plan(args, w, preset or "bfloat16", budget, bf16, ctx, ctx_source="--ctx-size", ctx_given=True)
                    kv = p_.choice.describe(args, bf16, "GPU")
                    rows.append((name, ctx, gpu, preset or "bf16", kv, f"{p_.device_bytes / 2**30:.2f} GiB",
                                 f"{p_.host_bytes / 2**30:.2f} GiB"))
                    if (gpu, preset) == ("24G", None):
                        print(f"### {name}, {ctx} tokens, {gpu}B GPU, weights bfloat16\n")
                        print("```\n" + p_.table() + "\n```\n")
                except NotEnoughMemoryError as e:
                    rows.append((name, ctx, gpu, preset or "bf16", "does not fit: " + str(e).split(";")[0], "-", "-"))
    print("| model | context | GPU | weights | KV cache | on the GPU | in host memory |\n|---|---:|---|---|---|---:|---:|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")

if __name__ == "__main__":
    main()
