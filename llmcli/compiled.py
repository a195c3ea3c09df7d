"""The decode step through `torch.compile`, with an eager fallback.

Decoding runs the whole model for one token, tens of small kernels per layer; compiling fuses the
element-wise ones and removes Python's per-op overhead. Prefill stays eager: its large GEMMs
dominate and varying prompt lengths would only add compilations. The cache length is dynamic
(`dynamic=True`), so one graph serves every position. Compiled kernels are cached on disk
(inductor's cache, in the llmcli home) and reused by later runs.
"""

from __future__ import annotations

import os

import torch


class CompiledStep:
    """Callable like the model (`step(tokens, cache, last_only=True)`), for one-token steps.

    If compiling fails (no C++ compiler, an unsupported op), it says why in `fallback_reason`
    and runs eagerly from then on.
    """

    def __init__(self, model: torch.nn.Module):
        from .store import default_home

        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(default_home() / "compile-cache"))
        self.model = model
        self.fallback_reason: str | None = None
        self._compiled = torch.compile(model.forward, dynamic=True)

    def __call__(self, tokens, cache, positions=None, last_only: bool = False):
        if self.fallback_reason is None:
            length = cache.length
            try:
                return self._compiled(tokens, cache, positions, last_only)
            except Exception as e:  # inductor/dynamo failures are not user errors: run eagerly
                self.fallback_reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                cache.length = length  # a failed trace must not have advanced the cache
        return self.model(tokens, cache, positions, last_only)
