"""What every command that runs a model is told: which model, where, with what context (ModelFlags),
and the context it then runs with. No torch: the torch-free CPU path (lean.py) starts from here too."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..cache import check_kv_type
from ..errors import InvalidParameterError
from ..quant.presets import check_preset_name
from .device import DEVICE_CHOICES, check_dtype_name
from .plan import check_kv_offload

# What `llmcli chat` runs when no model is named (a registry name, resolved by locate()).
DEFAULT_MODEL = "smollm2:135m"
# The context when neither --ctx-size nor the registry gives one: the model's, at most this (llama.cpp's
# and ollama's defaults are smaller still, 4096)
DEFAULT_CONTEXT = 8192


@dataclass(frozen=True)
class ModelFlags:
    """How to find, place and size a model: the flags every command that runs one shares."""

    model: str = DEFAULT_MODEL  # a registry name, repo, pypi: source or path
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    ctx_size: int | None = None  # None: the registry's or the model's own context
    quant: str | None = None  # a preset name or file to quantize with at load (None: as stored)
    kv_type: str | None = None  # None / "auto": the planner picks
    kv_offload: str = "auto"  # auto | on | off
    registry: Path | None = None
    offline: bool = False
    rows: int = 1  # sequences decoded together (batch, serve): the cache holds rows x context
    ctx_cap: int | None = None  # without ctx_size, at most this context (serve: per request)
    allow_encoder: bool = False  # an embedding-only model (BERT) may be opened (embed, serve)
    chat_template: str | None = None  # replaces the model's own (--chat-template-file), and the registry's
    preset: object = field(default=None, init=False, repr=False, compare=False)  # quant.Preset of `quant`, or None

    def __post_init__(self):
        """Every field in range, named as its flag: a mistake ends the command before anything is found or loaded."""
        if self.ctx_size is not None and self.ctx_size < 1:
            raise InvalidParameterError(f"--ctx-size must be at least 1, got {self.ctx_size}")
        if self.threads is not None and self.threads < 1:
            raise InvalidParameterError(f"--threads must be at least 1, got {self.threads}")
        device = (self.device or "auto").lower()
        if device not in DEVICE_CHOICES and not device.startswith("cuda:"):
            raise InvalidParameterError(f"unknown device {self.device!r}; choose one of {', '.join(DEVICE_CHOICES)}")
        check_dtype_name(self.dtype)
        check_kv_offload(self.kv_offload, check_kv_type(self.kv_type))
        if self.rows < 1:
            raise InvalidParameterError(f"rows must be at least 1, got {self.rows}")
        object.__setattr__(self, "preset", check_preset_name(self.quant))  # the --quant preset, loaded once

    def with_(self, **changes) -> "ModelFlags":
        return replace(self, **changes)


def check_ctx_size(ctx_size: int | None, model_max: int) -> int:
    if ctx_size is None:
        return model_max
    if ctx_size < 1:
        raise InvalidParameterError(f"--ctx-size must be at least 1, got {ctx_size}")
    if ctx_size > model_max:
        raise InvalidParameterError(f"--ctx-size {ctx_size} is above this model's trained context of {model_max}; "
                                    f"use --ctx-size {model_max} or less")
    return ctx_size


def context_choice(ctx_size: int | None, trained: int, entry=None, ctx_cap: int | None = None) -> tuple[int, str]:
    """The context a model runs with, and where it comes from: --ctx-size (at most the trained
    context), else the registry's default, else the trained context, at most DEFAULT_CONTEXT (and at
    most `ctx_cap`, a server's per-request cap)."""
    ctx = check_ctx_size(ctx_size, trained)
    source = "--ctx-size" if ctx_size is not None else "the model's trained context"
    if ctx_size is None and ctx > DEFAULT_CONTEXT:  # a 128K-token cache is gigabytes: asked for, not a default
        ctx, source = DEFAULT_CONTEXT, f"the model's trained context of {trained}, at most {DEFAULT_CONTEXT} unless --ctx-size says more"
    if ctx_size is None and entry is not None and entry.context_length:  # the registry's default, a soft one
        ctx, source = min(entry.context_length, trained), "the registry's default context"
    if ctx_size is None and ctx_cap is not None and ctx > ctx_cap:
        ctx, source = ctx_cap, f"at most {ctx_cap} a sequence"
    return ctx, source
