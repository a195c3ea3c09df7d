"""The torch-free CPU path (DESIGN.md, "torch where it computes"): a GGUF model that the native step
decodes on the CPU, opened, planned, loaded and run with numpy around the C++ step, so that a start
does not pay for `import torch`.

    rt = open_lean(ModelFlags("smollm2"), request)   a LeanRuntime, or None: the torch path's
                                                     open_model() then serves the command

open_lean says None, before anything is loaded, for whatever needs torch: a GPU (asked for, or
possibly there), --quant or a registry quant, a folder, an encoder, a family or block type the step
does not run, a KV cache the planner would quantize or offload, and requests the lean generator does
not take (beams, guesses, a context shift: decode/lean.py's takes()). LeanRuntime answers what
`run`, `chat`, `bench`, `embed`, `batch` and `serve` ask of a runtime.py Runtime.
"""

from __future__ import annotations

import os
import time

import numpy as np

from .. import heap, native
from ..decode.batched import BatchEngine
from ..decode.lean import generate_lean, takes
from ..decode.rows_lean import LeanRows
from ..decode.think_first import think_first
from ..decode.request import Request
from ..formats.info import runs_as
from ..formats.open import open_model_file
from ..hub import fetch
from ..quant import precision
from .budget import detect_budget
from .device import place_without_torch
from .embedder import BATCH_TEXTS, embedder_of
from .flags import ModelFlags, context_choice
from .lean_step import ACTIVATIONS, TABLE_POSITIONS, LeanModel
from .loaded import LoadedModel
from .plan import Plan, plan
from .prompting import Prompting

TORCH_PATH_ENV = "LLMCLI_TORCH_PATH"  # set (to 1): every command takes the torch path (comparisons, bug reports)


class LeanRuntime(Prompting):
    """Runtime's face for `run`, `chat`, `bench`, `embed`, `batch` and `serve`: prompt_ids, new_cache,
    decode_step, describe_step, generate, batch_engine (prompts, grammars and tools: prompting.py's)."""

    native_decodes = True
    generates = True
    registry_quant = None

    def __init__(self, loaded: LoadedModel, ctx_size: int, memory: Plan, pooling=None, max_text_tokens=None):
        self.loaded, self.ctx_size, self.plan = loaded, ctx_size, memory
        self.pooling, self.max_text_tokens = pooling, max_text_tokens  # (embeddings: runtime.Runtime's)
        self.kv_type = "f16"
        self._cache = None  # the first cache, made (and warmed up on) at load

    @property
    def placement(self):
        return self.loaded.placement

    @property
    def model(self) -> LeanModel:
        return self.loaded.model

    def new_cache(self, max_len: int | None = None, rows: int = 1):
        if self._cache is not None and max_len in (None, self.ctx_size) and rows == 1:
            cache, self._cache = self._cache, None
            return cache
        return self.model.new_cache(max_len or self.ctx_size, rows)

    def decode_step(self, compile: bool = False, background: bool = False):
        return self.model

    def describe_step(self, step) -> str:
        floats = sorted(self.model.float_types())
        also = f"; {'/'.join(floats)} matrices: float32" if floats else ""
        return (f"native (one C++ call a step, {native.describe()} kernels, "
                f"{precision.describe(self.model.refined)}{also}, f16 KV cache)")

    def embedder(self, pooling: str | None = None, normalize: bool | None = None, batch_size: int = BATCH_TEXTS):
        return embedder_of(self, pooling, normalize, batch_size)

    def context_shift(self, messages, raw: bool = False):
        return None

    def generate(self, prompt: list[int], request: Request, cache, step=None, *, shift=None, draft=None):
        if shift is not None or draft is not None:
            raise ValueError("a context shift or a draft model needs the torch path")
        reasoning = self.reasoning(prompt, request)
        constraint = think_first(reasoning, self.constraint(request), self.loaded.tokenizer.eos_ids)
        return generate_lean(self.model, self.loaded.tokenizer, prompt, request, cache, constraint, reasoning)

    def batch_engine(self, rows: int, max_len: int | None = None, prompt_cache: int | None = None) -> BatchEngine:
        """Runtime.batch_engine on this path: the rows in a host cache, every step one C++ call."""
        max_len = max_len or self.ctx_size
        self._cache = None  # (the step is built again for the rows' cache)
        engine = BatchEngine.over(LeanRows(self.model, rows, max_len), self.loaded.tokenizer, rows, max_len,
                                  self.prompt_cache(prompt_cache))
        self.model.warm_up(engine.cache)  # the C++ buffers for the rows' cache, before a first request
        return engine


def open_lean(flags: ModelFlags, request: Request | None = None, progress=None) -> LeanRuntime | None:
    """The model `flags` name on the torch-free path, or None where it needs torch (module docstring)."""
    if os.environ.get(TORCH_PATH_ENV) or (request is not None and not takes(request)):
        return None
    if flags.quant is not None or flags.kv_type not in (None, "auto", "f16") \
            or flags.kv_offload == "on":
        return None
    placement = place_without_torch(flags.device, flags.dtype, flags.threads)
    # the kernels with integer dot products (not the portable ones, where the torch path decodes eagerly)
    kernels = native.module() if placement is not None and native.int8_dot() else None
    if kernels is None:
        return None
    found = fetch.locate(flags.model, registry_file=flags.registry, offline=flags.offline, progress=progress)
    entry = found.entry
    if entry is not None and entry.quant:  # the name means a build quantized at load
        return None
    t0 = time.perf_counter()
    model_file = open_model_file(found.path)
    if not model_file.is_gguf or model_file.is_encoder or model_file.args.model_type not in ACTIVATIONS:
        return None
    args = model_file.args
    ctx, source = context_choice(flags.ctx_size, args.max_position_embeddings, entry, flags.ctx_cap)
    if ctx > TABLE_POSITIONS:
        return None
    weights = sum(int(t.n_bytes) for t in model_file.reader.tensors)
    label = "/".join(sorted(model_file.block_types())) + " as stored"
    memory = plan(args, weights, label, detect_budget("cpu"), np.dtype(np.float32), ctx, ctx_source=source,
                  ctx_given=flags.ctx_size is not None, kv_type=None if flags.kv_type == "auto" else flags.kv_type,
                  kv_offload=flags.kv_offload, rows=flags.rows, float_kv="f16", lean=True)
    if memory.choice.kv_type != "f16" or memory.choice.device_layers is not None:
        return None  # the planner quantizes or offloads the cache: the torch path's caches
    model = LeanModel.open(model_file, placement.threads, kernels, model_file.release_pages,
                           copy_experts=memory.fits)  # (else a mixture's experts stay paged from the file)
    if model is None:
        return None
    tokenizer, template = model_file.tokenizer, model_file.chat_template
    if entry is not None:  # the registry's overrides
        template = entry.chat_template or template
        if entry.stop_tokens:
            tokenizer = tokenizer.with_extra_eos(entry.stop_tokens)
    stored = model_file.weights_type
    metadata = {"name": model_file.metadata.get("general.name"), "license": model_file.license,
                "architecture": model_file.architecture}
    loaded = LoadedModel(model, tokenizer, args, flags.chat_template or template, model_file.path, model_file.format,
                         model_file.nbytes, stored, placement, 0.0, metadata, runs_as(model_file.format, stored))
    loaded.interleaved = model.interleaved
    rt = LeanRuntime(loaded, ctx, memory, model_file.pooling, min(model_file.max_text_tokens or ctx, ctx))
    if flags.rows == 1:  # (a batch engine's rows make their own cache, and warm up on it)
        rt._cache = model.new_cache(ctx)
        model.warm_up(rt._cache)
    loaded.load_seconds = time.perf_counter() - t0
    heap.trim()
    return rt
