"""gpt-oss-20b's shapes as OpenAI ships the checkpoint (an HF folder, experts in MXFP4 blocks), random
weights, turned into GGUF by llama.cpp's own converter, which keeps the experts' MXFP4 as stored.

    python -m benchmarks.shapes gpt-oss --layers 4 --llama-cpp LLAMA_CPP --tokenizer-dir SMOLLM2_FOLDER

gpt-oss-20b (config.json): 24 layers, hidden 2880, 64 q heads / 8 KV heads of 64 with q/k/v/o biases
and per-head sinks, sliding window 128 on every other layer (the first sliding), 32 experts of 2880
(4 a token, biased router, SwiGLU with biases), vocab 201088, YaRN RoPE (factor 32 over 4096), an
untied head. `--layers` keeps the first N (the whole file is ~12.8 GB). The vocabulary is SmolLM2's
(a folder with tokenizer.json), padded by the converter to 201088: the embedding and head are full size.

The folder is written a layer a shard (safetensors), so memory holds one layer (~0.5 GB) at a time;
the experts' bytes are random nibbles under scales near 2^-7 (|w| <= 0.05; speed depends on bytes,
not values). The converter holds every layer's repacked experts until it writes (0.42 GB a layer).
`--outtype` is the converter's for the tensors that are not experts: bf16 as OpenAI's, or q8_0 to
save disk (the embedding and head are 1.16 GB each in bf16, 0.62 GB in Q8_0). The folder is deleted
after converting unless --keep-folder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np

GPT_OSS_20B = dict(hidden=2880, layers=24, heads=64, kv_heads=8, head_dim=64, experts=32, experts_used=4,
                   expert_ff=2880, vocab=201088, sliding_window=128, rope_theta=150000.0, eps=1e-5)


def config(s: dict, layers: int, bos: int, eos: int) -> dict:
    """config.json as gpt-oss-20b's, with `layers` layers."""
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
        "attention_dropout": 0.0, "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos,
        "experts_per_token": s["experts_used"], "num_experts_per_tok": s["experts_used"],
        "num_local_experts": s["experts"], "head_dim": s["head_dim"], "hidden_act": "silu",
        "hidden_size": s["hidden"], "intermediate_size": s["expert_ff"], "initial_context_length": 4096,
        "initializer_range": 0.02, "max_position_embeddings": 131072, "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"], "num_hidden_layers": layers, "output_router_logits": False,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "rms_norm_eps": s["eps"], "rope_theta": s["rope_theta"], "sliding_window": s["sliding_window"],
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "router_aux_loss_coef": 0.9, "swiglu_limit": 7.0, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": s["vocab"],
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
    }


def _bf16(rng, shape, std=0.02):
    """A bf16 torch tensor of normal values, made 64 MB of float32 at a time."""
    import torch

    out = torch.empty(shape, dtype=torch.bfloat16)
    flat, step = out.view(-1, shape[-1]), max(1, (16 << 20) // shape[-1])
    for r in range(0, flat.shape[0], step):
        n = min(step, flat.shape[0] - r)
        flat[r:r + n] = torch.from_numpy(rng.standard_normal((n, shape[-1]), dtype=np.float32) * std)
    return out


def _mxfp4(rng, experts: int, rows: int, cols: int):
    """(E, rows, cols/32, 16) random nibbles and (E, rows, cols/32) e8m0 scales 2^-8 .. 2^-6."""
    import torch

    blocks = rng.integers(0, 256, (experts, rows, cols // 32, 16), dtype=np.uint8)
    scales = rng.integers(119, 122, (experts, rows, cols // 32), dtype=np.uint8)
    return torch.from_numpy(blocks), torch.from_numpy(scales)


def write_folder(folder: Path, tokenizer_dir: Path, layers: int, s: dict = GPT_OSS_20B, seed: int = 0) -> None:
    """The HF folder: config.json, the tokenizer's files, one safetensors shard per layer and one for
    the embedding, the head and the final norm, and the index naming them."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tok = json.loads((tokenizer_dir / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config(s, layers, tok["bos_token_id"], tok["eos_token_id"]), indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, folder / name)
    rng = np.random.default_rng(seed)
    H, D, E, ff = s["hidden"], s["head_dim"], s["experts"], s["expert_ff"]
    q, kv = s["heads"] * D, s["kv_heads"] * D
    weight_map = {}

    def shard(name: str, tensors: dict) -> None:
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})

    for i in range(layers):
        p = f"model.layers.{i}."
        t = {p + "input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
             p + "post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
             p + "self_attn.sinks": _bf16(rng, (s["heads"],), 1.0)}
        for part, rows, cols in (("q", q, H), ("k", kv, H), ("v", kv, H), ("o", H, q)):
            t[p + f"self_attn.{part}_proj.weight"] = _bf16(rng, (rows, cols))
            t[p + f"self_attn.{part}_proj.bias"] = _bf16(rng, (rows,))
        t[p + "mlp.router.weight"], t[p + "mlp.router.bias"] = _bf16(rng, (E, H)), _bf16(rng, (E,))
        # (gate_up's rows alternate gate, up; down's rows are the hidden features)
        t[p + "mlp.experts.gate_up_proj_blocks"], t[p + "mlp.experts.gate_up_proj_scales"] = _mxfp4(rng, E, 2 * ff, H)
        t[p + "mlp.experts.gate_up_proj_bias"] = _bf16(rng, (E, 2 * ff))
        t[p + "mlp.experts.down_proj_blocks"], t[p + "mlp.experts.down_proj_scales"] = _mxfp4(rng, E, H, ff)
        t[p + "mlp.experts.down_proj_bias"] = _bf16(rng, (E, H))
        shard(f"model-{i + 1:05d}-of-{layers + 1:05d}.safetensors", t)
    shard(f"model-{layers + 1:05d}-of-{layers + 1:05d}.safetensors",
          {"model.embed_tokens.weight": _bf16(rng, (s["vocab"], H)), "lm_head.weight": _bf16(rng, (s["vocab"], H)),
           "model.norm.weight": torch.ones(H, dtype=torch.bfloat16)})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))


def build(out: Path, llama_cpp: Path, tokenizer_dir: Path, layers: int, outtype: str = "bf16",
          keep_folder: bool = False) -> None:
    """The folder beside `out`, converted by llama.cpp's convert_hf_to_gguf.py (with llama_cpp/venv's
    python where there is one), then the folder deleted unless keep_folder."""
    folder = out.with_name(out.name.split(".")[0] + "-hf")
    write_folder(folder, tokenizer_dir, layers)
    python = llama_cpp / "venv/bin/python"
    tmp = out.with_suffix(".partial")
    try:
        subprocess.run([str(python if python.exists() else "python3"), str(llama_cpp / "convert_hf_to_gguf.py"),
                        str(folder), "--outtype", outtype, "--outfile", str(tmp)], check=True)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
        if not keep_folder:
            shutil.rmtree(folder, ignore_errors=True)
