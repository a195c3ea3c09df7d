"""What every command that runs a model needs: place it, load it, size its cache, build prompts.

Kept apart from cli.py so `run`, `chat` and `bench` share one path from flags to a ready model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import chat_template
from .device import Placement, place
from .errors import InvalidParameterError
from .kv_cache import StaticKVCache
from .loader import LoadedModel, load_model


@dataclass
class Runtime:
    loaded: LoadedModel
    ctx_size: int

    @property
    def placement(self) -> Placement:
        return self.loaded.placement

    def new_cache(self):
        return StaticKVCache.for_model(self.loaded.args, self.ctx_size, self.placement.device, self.placement.dtype)

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


def locate(model: str) -> Path:
    """MODEL as the user typed it -> a local .gguf file or model folder."""
    return Path(model).expanduser()


def open_model(model: str, *, device: str = "auto", dtype: str = "auto", threads: int | None = None,
               ctx_size: int | None = None, quant: str | None = None) -> Runtime:
    """`quant`: a preset name or file to quantize the weights with at load (None: as stored)."""
    if ctx_size is not None and ctx_size < 1:
        raise InvalidParameterError(f"--ctx-size must be at least 1, got {ctx_size}")
    preset = None
    if quant is not None:
        from .quant.presets import check_preset_name

        preset = check_preset_name(quant)
    placement = place(device, dtype, threads)
    loaded = load_model(locate(model), placement, preset)
    return Runtime(loaded, check_ctx_size(ctx_size, loaded.args.max_position_embeddings))
