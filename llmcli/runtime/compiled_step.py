"""The decode step through `torch.compile`, with an eager fallback.

Decoding runs the whole model for one token: hundreds of small kernels, each with Python and
dispatch overhead that dominates a small model. Compiling fuses the element-wise ones and drops
that overhead (a small model's token takes a quarter less: docs/performance-choices.md). Prefill stays eager:
its large GEMMs dominate and varying prompt lengths would only add compilations. The cache length
is dynamic (`dynamic=True`), so one graph serves every position.

Compiling costs tens of seconds the first time and a few in a later process (inductor's kernel
cache, kept in the llmcli home). `background=True` compiles on a scratch cache in a thread while the model keeps
decoding eagerly, and switches over when the graph is ready (the chat REPL does this while the user
types).
"""

from __future__ import annotations

import hashlib
import os
import threading
from functools import partial
from pathlib import Path

import torch

from .. import native
from ..hub.store import default_home


def compile_cache(base: Path) -> Path:
    """inductor's kernel cache for this CPU's features, torch's ISA choice and llmcli's operators,
    under `base`. Its own keys leave ATEN_CPU_CAPABILITY out: kernels cached under one setting decoded
    garbage under another (a home shared by machines of two CPU kinds would do the same). They leave
    the operators' schemas out too: a graph whose C++ wrapper calls llmcli_native::mm as an older
    llmcli defined it (before its `refined` argument) is never loaded by a newer one."""
    from ..native import cpu, ops

    schemas = hashlib.sha256(Path(ops.__file__).read_bytes()).hexdigest()
    seen = " ".join([torch.__version__, os.environ.get("ATEN_CPU_CAPABILITY", ""), schemas, *sorted(cpu.flags())])
    return base / hashlib.sha256(seen.encode()).hexdigest()[:12]


class CompiledStep:
    """Callable like the model (`step(tokens, cache, positions, last_only, hidden)`), for one-token steps.

    If compiling fails (no C++ compiler, an unsupported op), `fallback_reason` says why and every
    step runs eagerly from then on.
    """

    def __init__(self, model: torch.nn.Module, scratch_cache=None):
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache(default_home() / "compile-cache")))
        self.model = model
        self.fallback_reason: str | None = None
        # one graph for every caller: it always returns (logits, hidden state); emulating eager's
        # rounding of intermediates keeps its numbers close to the eager model's. On the CPU the graph's
        # wrapper is C++ too (cpp_wrapper): no Python between its ~300 kernels (measured with
        # benchmarks/speed/decode_profile.py: docs/performance-choices.md)
        cpu = next(model.parameters()).device.type == "cpu"
        native.register_ops()  # the kernels as operators a compiled graph can hold
        self._compiled = torch.compile(partial(model.forward, hidden=True), dynamic=True,
                                       options={"emulate_precision_casts": True, **({"cpp_wrapper": True} if cpu else {})})
        self.ready = threading.Event()
        self._thread = None
        if scratch_cache is not None:  # compile in the background; eager until then
            self._thread = threading.Thread(target=self._warm_up, args=(scratch_cache,), daemon=True,
                                            name="llmcli-compile")
            self._thread.start()
        else:
            self.ready.set()

    def _warm_up(self, cache) -> None:
        try:
            device = next(self.model.parameters()).device
            with torch.inference_mode():
                self.model(torch.zeros(1, 2, dtype=torch.long, device=device), cache)  # a position to attend to
                self._compiled(torch.zeros(1, 1, dtype=torch.long, device=device), cache, None, True)
        except Exception as e:  # inductor/dynamo failures are not user errors: stay eager
            self.fallback_reason = _reason(e)
        self.ready.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a background compilation is done (tests, benchmarks); True if it is."""
        return self.ready.wait(timeout)

    def __call__(self, tokens, cache, positions=None, last_only: bool = False, hidden: bool = False):
        if self.fallback_reason is None and self.ready.is_set():
            length = cache.length
            try:
                out = self._compiled(tokens, cache, positions, last_only)
                return out if hidden else out[0]
            except Exception as e:
                self.fallback_reason = _reason(e)
                cache.length = length  # a failed trace must not have advanced the cache
        return self.model(tokens, cache, positions, last_only, hidden)


def _reason(e: Exception) -> str:
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}"
