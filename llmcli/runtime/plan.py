"""The memory planner: before loading, what a model needs, where each part lives, and what to give up.

    parts     the weights after the quantization that will be applied (probe.py), the KV
              cache for the context, by kind (its bytes are the tensors the cache allocates), the
              activations of one 512-token prefill chunk (an estimate of the largest intermediates),
              and the runtime itself (Python, torch and the kernels' libraries; a GPU's context)
    budget    what is free on the device (probe.detect_budget), and in host memory for an
              offloaded cache on CUDA/MPS
    decision  in order, the first that keeps the requested context: the KV cache on the device in the
              compute dtype; int8; int4; offloaded (the first N layers on the device, the rest in host
              memory; not on the CPU, where both are the same memory); only then a smaller context,
              and the plan says so. A context the user asked for explicitly is never shrunk: it is an
              error that says what it needs and what would fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cache import GROUP, KV_BITS, KV_ITEMSIZE, channel_group
from ..errors import InvalidParameterError, LlmcliError
from .budget import Budget

PREFILL_CHUNK = 512  # decode/prefill.py's PREFILL_CHUNK (not imported: the planner stays light)
MIN_CONTEXT = 256  # a smaller context than this is not offered in place of the one asked for
OFFLOAD_CHOICES = ("auto", "on", "off")


class NotEnoughMemoryError(LlmcliError):
    """Nothing fits: the message says what is needed and what would fit."""


@dataclass(frozen=True)
class Part:
    name: str
    nbytes: int
    where: str  # "cuda" | "mps" | "cpu" | "host"
    counted: bool = True  # False: already in memory as the plan is made (the runtime), not taken from what is free


@dataclass(frozen=True)
class CacheChoice:
    kv_type: str | None = None  # None: the compute dtype
    device_layers: int | None = None  # None: every layer on the device; else the rest offloaded

    def describe(self, args, dtype: object, device: str) -> str:
        kind = self.kv_type or _dtype_name(dtype)
        if self.device_layers is None:
            return f"{kind}, all {args.num_hidden_layers} layers on {device}"
        return f"{kind}, {self.device_layers} of {args.num_hidden_layers} layers on {device}, the rest in host memory"


# ------------------------------------------------------------------------------------ sizes


def _dtype_name(dtype) -> str:
    """A torch or numpy dtype's name: float32, bfloat16, ... (the planner takes either)."""
    return str(dtype).removeprefix("torch.")


def _layers(a: int, b: int) -> str:
    return f"layer {a}" if b == a + 1 else f"layers {a}-{b - 1}"


def kv_parts(args, ctx: int, dtype: object, choice: CacheChoice, device: str, batch: int = 1) -> list[Part]:
    """The tensors a cache of `choice` allocates for `ctx` tokens (cache.new_cache), by part."""
    L, H, D = args.num_hidden_layers, args.num_key_value_heads, args.head_dim
    per_token = batch * H * D  # values of K (or V) per token per layer
    c = dtype.itemsize
    bits = KV_BITS.get(choice.kv_type)
    if bits:
        groups = ctx // GROUP
        slots = groups * GROUP
        codes = 2 * batch * H * slots * (D // 2 if bits == 4 else D)
        scales = (batch * H * groups * D + batch * H * slots * (D // channel_group(D))) * (2 if bits == 4 else 1)
        tails = 2 * batch * H * GROUP * D
        return [Part(f"KV cache {choice.kv_type}, {L} layers (scales and last group included)",
                     L * (codes + (scales + tails) * c), device),
                Part("KV attention buffer (one layer dequantized)", 2 * per_token * ctx * c, device)]
    s = KV_ITEMSIZE.get(choice.kv_type, dtype.itemsize)
    layer = 2 * per_token * ctx * s
    kind = choice.kv_type or _dtype_name(dtype)
    n = L if choice.device_layers is None else choice.device_layers
    parts = [Part(f"KV cache {kind}, {_layers(0, n)}", n * layer, device)] if n else []
    if choice.device_layers is not None:
        parts.append(Part(f"KV transfer slots ({min(2, L - n)} layers)", min(2, L - n) * layer, device))
        parts.append(Part(f"KV cache {kind}, {_layers(n, L)} (offloaded)", (L - n) * layer, "host"))
    elif s != c:
        parts.append(Part(f"KV attention buffer (one layer in {_dtype_name(dtype)})", 2 * per_token * ctx * c, device))
    return parts


def activation_bytes(args, ctx: int, dtype: object, rows: int = 1) -> int:
    """The largest intermediates (an estimate) of one prefill chunk (hidden states, q/k/v, MLP,
    mask, logits) or of one decode step of `rows` sequences (the same per row, each row's attention
    scores over the context, and its logits with their float32 log-softmax, as beam search takes)."""
    T = min(PREFILL_CHUNK, ctx)
    h, i = args.hidden_size, args.intermediate_size
    qkv = (args.num_attention_heads + 2 * args.num_key_value_heads) * args.head_dim
    per_token = 6 * h + 3 * qkv + 3 * i
    chunk = T * per_token * dtype.itemsize + T * ctx + 2 * args.vocab_size * 4
    step = rows * (per_token * dtype.itemsize + args.num_attention_heads * ctx * 4 + 4 * args.vocab_size * 4)
    return max(chunk, step)


# What the process holds before any model: Python, torch and the kernels' libraries (~230 MB resident
# after `import llmcli.cli`, measured), or a GPU's context and its libraries' workspaces (an estimate)
RUNTIME_BYTES = {"cpu": 256 * 2**20}
LEAN_RUNTIME_BYTES = 64 * 2**20  # the same without torch (the torch-free path, runtime/lean.py): ~57 MB measured
GPU_RUNTIME_BYTES = 512 * 2**20


def runtime_bytes(device: str) -> int:
    return RUNTIME_BYTES.get(device, GPU_RUNTIME_BYTES)


def margin_bytes(budget: Budget) -> int:
    """What a plan leaves free of what it found free: the allocator's fragmentation, other programs'
    growth. Not a part of the model (the table says it apart)."""
    return max(64 * 2**20, budget.free // 20)


# ------------------------------------------------------------------------------------ plan


@dataclass
class Plan:
    args: object  # ModelArgs
    dtype: object  # the compute dtype: torch's, or numpy's on the torch-free path
    budget: Budget
    ctx: int
    requested: int
    ctx_source: str  # why `requested`: "--ctx-size", "the model's trained context", ...
    choice: CacheChoice
    parts: list[Part]
    notes: list[str] = field(default_factory=list)  # what the plan gave up, for the user
    rows: int = 1  # sequences the cache holds at once (batch, serve), each of `ctx` tokens

    @property
    def device_bytes(self) -> int:
        """Everything on the device once loaded, the runtime included: the process's resident size on the CPU."""
        return sum(p.nbytes for p in self.parts if p.where != "host")

    @property
    def taken_bytes(self) -> int:
        """What loading takes of what was free on the device (device_bytes less the runtime, resident already)."""
        return sum(p.nbytes for p in self.parts if p.where != "host" and p.counted)

    @property
    def fits(self) -> bool:
        """Whether what the plan holds fits what was free, its margin kept (the choice's own test)."""
        return _fits(self.parts, self.budget)

    @property
    def host_bytes(self) -> int:
        return sum(p.nbytes for p in self.parts if p.where == "host")

    @property
    def kv_bytes(self) -> int:
        return sum(p.nbytes for p in self.parts if p.name.startswith("KV "))

    def check_rows(self, rows: int, prompt: int, answer: int, what: str) -> None:
        """Refuse a cache of `rows` more sequences of `prompt` + `answer` tokens each (a beam
        search's own, in the compute dtype) and their decode step, unless they fit beside what the
        plan holds; the error says how many rows fit, and the -n at which `rows` of them do. Without
        it, torch's allocator fails mid-search."""
        tokens = prompt + answer
        left = self.budget.free - self.taken_bytes - self.host_bytes * (self.budget.host_free is None)

        def need(r: int, t: int) -> int:
            kv = sum(p.nbytes for p in kv_parts(self.args, t, self.dtype, CacheChoice(), self.budget.device, r))
            return kv + activation_bytes(self.args, t, self.dtype, r)

        if need(rows, tokens) <= left:
            return
        fit_rows = next((r for r in range(rows - 1, 0, -1) if need(r, tokens) <= left), 0) if rows < 4096 else 0
        lo, hi = 0, tokens  # the longest sequences `rows` of them can have
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if need(rows, mid) <= left else (lo, mid - 1)
        fits = [f"{fit_rows} rows fit at that length" if fit_rows else "not even one row fits at that length"]
        if lo > prompt:
            fits.append(f"{rows} rows fit with -n {lo - prompt}")
        raise NotEnoughMemoryError(
            f"{what} needs {human(need(rows, tokens))} for {rows} rows of {tokens} tokens, but {human(left)} is left "
            f"on {self.budget.device} beside the model{_from(self.budget)}; {', or '.join(fits)}")

    def new_cache(self, device, max_len: int | None = None, rows: int = 1):
        from ..cache import new_cache

        return new_cache(self.args, max_len or self.ctx, device, self.dtype, self.choice.kv_type,
                         self.choice.device_layers, batch=rows)

    def as_dict(self) -> dict:
        b = self.budget
        return {"device": b.device, "free_bytes": b.free, "host_free_bytes": b.host_free, "free_source": b.source,
                "context": self.ctx, "requested_context": self.requested, "context_source": self.ctx_source,
                "rows": self.rows,
                "kv_type": self.choice.kv_type or _dtype_name(self.dtype), "kv_device_layers": self.choice.device_layers,
                "parts": [{"name": p.name, "where": p.where, "bytes": p.nbytes} for p in self.parts],
                "device_bytes": self.device_bytes, "host_bytes": self.host_bytes, "notes": list(self.notes),
                **({"active_weight_bytes": self.active_weights()} if self.active_weights() is not None else {})}

    def table(self) -> str:
        b = self.budget
        host = "" if b.host_free is None or not self.host_bytes else f"; host {human(b.host_free)} free"
        lines = [f"memory plan for {b.device}: {human(b.free)} free ({b.source}){host}",
                 f"context {self.ctx} tokens" + (f" ({self.ctx_source})" if self.ctx == self.requested
                                                 else f" (asked for {self.requested}: {self.ctx_source})"),
                 f"KV cache {self.choice.describe(self.args, self.dtype, b.device)}"
                 + (f", {self.rows} rows of {self.ctx} tokens" if self.rows > 1 else "")]
        width = max(len(p.name) for p in self.parts)
        lines.append(f"  {'part':{width}}  {'where':5}  {'size':>10}")
        for p in self.parts:
            lines.append(f"  {p.name:{width}}  {p.where:5}  {human(p.nbytes):>10}")
        lines.append(f"  {'total on the device':{width}}  {b.device:5}  {human(self.device_bytes):>10}")
        if self.host_bytes:
            lines.append(f"  {'total in host memory':{width}}  {'host':5}  {human(self.host_bytes):>10}")
        lines.append(f"  {'left free (5% of free, at least 64 MiB)':{width}}  {b.device:5}  {human(margin_bytes(b)):>10}")
        active = self.active_weights()
        if active is not None:
            lines.append(f"experts: all {self.args.num_experts} a layer are in memory (or mapped); a token reads "
                         f"{self.args.num_experts_per_tok} of them, about {human(active)} of the weights")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def active_weights(self) -> int | None:
        """A mixture of experts: the weights' bytes a token reads (its experts', and all the rest),
        from the parameter counts; None for a dense model."""
        count = getattr(self.args, "active_parameter_count", None)
        weights = next((p.nbytes for p in self.parts if p.name.startswith("weights")), None)
        if count is None or weights is None:
            return None
        return int(weights * count() / self.args.parameter_count())


def human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} GiB"


def _parts(args, weights: int, weights_label: str, ctx: int, dtype, choice: CacheChoice, budget: Budget,
           rows: int = 1, lean: bool = False) -> list[Part]:
    """`lean`: the torch-free path's (its C++ step reads the float16 cache as it is: no float32 buffer)."""
    d = budget.device
    kv = kv_parts(args, ctx, dtype, choice, d, rows)
    if lean:
        kv = [p for p in kv if not p.name.startswith("KV attention buffer")]
        runtime = Part("runtime (Python, numpy, kernels; no torch)", LEAN_RUNTIME_BYTES, d, counted=False)
    else:
        runtime = Part("runtime (Python, torch, kernels)" if d == "cpu" else f"runtime ({d} context, estimate)",
                       runtime_bytes(d), d, counted=False)
    return ([Part(f"weights {weights_label}", weights, d)] + kv
            + [Part(f"activations ({min(PREFILL_CHUNK, ctx)}-token prefill chunk or {rows}-row step, estimate)",
                    activation_bytes(args, ctx, dtype, rows), d), runtime])


def _from(budget: Budget) -> str:
    return f" ({budget.source})" if budget.source else ""


def _fits(parts: list[Part], budget: Budget) -> bool:
    device = sum(p.nbytes for p in parts if p.where != "host" and p.counted)
    host = sum(p.nbytes for p in parts if p.where == "host")
    if budget.host_free is None:  # one memory for both
        return device + host + margin_bytes(budget) <= budget.free
    return device + margin_bytes(budget) <= budget.free and host <= budget.host_free


def _choices(args, budget: Budget, kv_type: str | None, kv_offload: str, rows: int = 1,
             float_kv: str | None = None) -> list[CacheChoice]:
    """Cache kinds in the order the planner tries them (offloaded: as many layers on the device as
    possible, so each offloaded choice is tried from the most device layers down). Several rows
    decode from one static cache (decode/batched.py): float kinds on the device only. `float_kv`:
    the float kind `--kv-type auto` stores (None: the compute dtype; "f16" where the native CPU step
    decodes)."""
    floats, auto = kv_type is None or kv_type in KV_ITEMSIZE, kv_type is None
    kv_type = kv_type or float_kv
    if rows > 1:
        if not floats or kv_offload == "on":
            raise InvalidParameterError(f"decoding {rows} rows at once needs a float KV cache on the device; "
                                        "use --kv-type bf16 or f16 and --kv-offload off")
        return [CacheChoice(kv_type)]
    if kv_offload == "on":
        return [CacheChoice(kv_type, 0)]
    on_device = [CacheChoice(kv_type), CacheChoice("int8"), CacheChoice("int4")] if auto else [CacheChoice(kv_type)]
    if kv_offload == "off" or not floats or budget.device == "cpu":
        return on_device
    L = args.num_hidden_layers
    return on_device + [CacheChoice(kv_type, n) for n in range(L - 1, -1, -1)]


def check_kv_offload(value: str, kv_type: str | None) -> str:
    if value not in OFFLOAD_CHOICES:
        raise InvalidParameterError(f"--kv-offload must be one of {', '.join(OFFLOAD_CHOICES)}, got {value!r}")
    if value == "on" and kv_type in KV_BITS:
        raise InvalidParameterError(f"--kv-offload on keeps the cache in floating point; use --kv-type bf16 or f16 "
                                    f"with it, or drop --kv-offload to keep {kv_type} on the device")
    return value


def _largest_context(args, weights, label, dtype, choice, budget, upto: int, rows: int = 1) -> int:
    lo, hi = 0, upto  # fits(lo) holds (0 tokens: nothing to hold)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(_parts(args, weights, label, mid, dtype, choice, budget, rows), budget):
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan(args, weights: int, weights_label: str, budget: Budget, dtype: object, ctx: int, *,
         ctx_source: str = "the model's trained context", ctx_given: bool = False, kv_type: str | None = None,
         kv_offload: str = "auto", rows: int = 1, float_kv: str | None = None, lean: bool = False) -> Plan:
    """The first cache choice that keeps `ctx` (for each of `rows` sequences) in `budget`, or (when
    `ctx` was not asked for explicitly) the largest context that fits, with a note. `lean`: for the
    torch-free path (_parts). NotEnoughMemoryError when nothing fits."""
    kv_offload = check_kv_offload(kv_offload, kv_type)
    choices = _choices(args, budget, kv_type, kv_offload, rows, float_kv)
    d = budget.device
    for choice in choices:
        parts = _parts(args, weights, weights_label, ctx, dtype, choice, budget, rows, lean)
        if _fits(parts, budget):
            p = Plan(args, dtype, budget, ctx, ctx, ctx_source, choice, parts, rows=rows)
            if choice != choices[0]:
                first = _parts(args, weights, weights_label, ctx, dtype, choices[0], budget, rows)
                kind = choices[0].describe(args, dtype, d).split(",")[0]
                p.notes.append(f"with a {kind} KV cache the model would need "
                               f"{human(sum(q.nbytes for q in first if q.where != 'host' and q.counted))} on {d} but "
                               f"{human(budget.free)} is free; using {choice.describe(args, dtype, d)} "
                               f"to keep the context of {ctx}")
            return p
    no_kv = _parts(args, weights, weights_label, 1, dtype, CacheChoice(None), budget)
    base = sum(q.nbytes for q in no_kv if not q.name.startswith("KV ") and q.counted)
    if base + margin_bytes(budget) > budget.free:
        raise NotEnoughMemoryError(
            f"the weights need {human(weights)} ({weights_label}), {human(base)} with activations, "
            f"but {human(budget.free)} is free on {d}{_from(budget)}; use a smaller --quant preset (q4) "
            f"or another --device")
    # nothing keeps the context: the largest that fits, from the most compact choice of each kind
    compact = [c for c in choices if c.device_layers in (None, 0)]
    best, best_choice = 0, compact[0]
    for choice in compact:
        n = _largest_context(args, weights, weights_label, dtype, choice, budget, ctx, rows)
        if n > best:
            best, best_choice = n, choice
    best = best // 256 * 256 if best >= 512 else best
    need = min(sum(q.nbytes for q in _parts(args, weights, weights_label, ctx, dtype, c, budget, rows)) for c in compact)
    flags = f" with --kv-type {best_choice.kv_type}" if best_choice.kv_type not in (None, float_kv) and not kv_type else ""
    if ctx_given or best < min(MIN_CONTEXT, ctx):
        fit = f"--ctx-size {best}{flags} fits" if best >= 1 else "no context fits"
        each = f" for each of {rows} rows" if rows > 1 else ""
        fewer = " (or fewer --rows)" if rows > 1 else ""
        raise NotEnoughMemoryError(
            f"a context of {ctx} tokens{each} needs at least {human(need)} but {human(budget.free)} is free on "
            f"{d}{_from(budget)}; {fit}{fewer}")
    if best_choice.device_layers == 0:  # as many layers on the device as fit at that context
        best_choice = next(c for c in choices if c.device_layers is not None and
                           _fits(_parts(args, weights, weights_label, best, dtype, c, budget, rows), budget))
    p = Plan(args, dtype, budget, best, ctx, ctx_source, best_choice,
             _parts(args, weights, weights_label, best, dtype, best_choice, budget, rows), rows=rows)
    p.notes.append(f"{ctx_source} of {ctx} tokens needs at least {human(need)} but {human(budget.free)} is free "
                   f"on {d}; using a context of {best} ({best_choice.describe(args, dtype, d)}); "
                   f"--ctx-size sets it")
    return p
