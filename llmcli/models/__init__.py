"""Model architectures: one file per family, selected by Hugging Face `model_type`."""

from __future__ import annotations

from contextlib import contextmanager

from ..errors import CorruptModelError
from .args import ENCODERS, SUPPORTED_ARCHITECTURES, args_from_hf_config, is_encoder  # noqa: F401 (torch-free)


def family(model_type: str):
    """The module of a family (its ModelArgs and Transformer); importing it imports torch."""
    import importlib

    return importlib.import_module(f".{_MODULES[model_type]}", __name__)


_MODULES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama", "phi3": "phi3",
            "gemma3_text": "gemma3", "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "mixtral",
            "olmoe": "olmoe", "gpt_oss": "gpt_oss", "bert": "bert"}


def set_rope(model, args, device) -> None:
    """(Re)compute the model's RoPE tables on `device` (after the skeleton was built on the CPU)."""
    for name, t in model.rope_buffers(args).items():
        setattr(model, name, t.to(device))


@contextmanager
def _skip_init():
    """Module constructors without random initialisation: every parameter is replaced by a loaded
    tensor right after. (The meta device would do too, but its first use imports more of torch.)"""
    from torch import nn

    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters  # subclasses inherit the patch
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved


def skeleton(args):
    """The model's modules with uninitialised CPU tensors (never touched, so never resident), for
    loaded tensors to replace."""
    with _skip_init():
        return family(args.model_type).Transformer(args)


def build(args, state_dict: dict, device):
    """A skeleton that adopts the loaded tensors, already on `device`, as its parameters."""
    model = skeleton(args)
    if args.tie_word_embeddings:
        state_dict.pop("lm_head.weight", None)
    try:
        missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    except RuntimeError as e:  # torch lists every tensor whose shape differs from the config's: name the first
        first = next((line.strip() for line in str(e).splitlines() if "size mismatch" in line), str(e).splitlines()[0])
        raise CorruptModelError(f"the weights do not match the config ({first}); the download may be "
                                "incomplete or the config wrong") from None
    missing = [m for m in missing if not (args.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise CorruptModelError(f"the weights do not match the config ({what}); the download may be incomplete")
    set_rope(model, args, device)
    model.tie_weights()
    return model.eval().requires_grad_(False)
