"""gpt-oss's experts as OpenAI ships them (MXFP4 blocks and e8m0 scales in the HF checkpoint), from
float32 values: what llama.cpp's converter repacks as GGUF MXFP4. For the tests' tiny gpt-oss
(tests/tiny.py) and the MoE quality benchmark (quality/moe_vs_llamacpp.py).

    held = save_gpt_oss_mxfp4(model, folder)   # a transformers gpt-oss -> an HF folder; the values it holds
"""

from __future__ import annotations

import numpy as np

from .gguf_blocks import quantize


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
