"""Model architectures: one file per family, selected by Hugging Face `model_type`."""

from __future__ import annotations

import torch

from . import llama

# model_type -> module with ModelArgs and Transformer
ARCHITECTURES = {"llama": llama, "mistral": llama, "qwen2": llama}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)


def build(args, state_dict: dict, device: torch.device) -> torch.nn.Module:
    """Instantiate without allocating (meta device), then adopt the loaded tensors as parameters."""
    family = ARCHITECTURES[args.model_type]
    with torch.device("meta"):
        model = family.Transformer(args)
    if args.tie_word_embeddings:
        state_dict.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    missing = [m for m in missing if not (args.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        from ..errors import CorruptModelError

        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise CorruptModelError(f"the weights do not match the config ({what}); the download may be incomplete")
    model.inv_freq = family.rope_inv_freq(args).to(device)
    model.tie_weights()
    return model.eval().requires_grad_(False)
