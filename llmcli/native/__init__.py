"""Small C++ CPU kernels for GGUF blocks, one build per instruction set, picked at run time.

The C++ (plain C++17 with a C interface, src/api.h; no torch headers; README.md has the map): generic
code in src/ (matmul.cpp: y = x @ W.T reading GGUF blocks with int8 activations, as llama.cpp does;
attention.cpp: decoding's one-query attention; select.cpp: top-k of the logits; step.cpp: a whole
decode step of a Llama-family model or Gemma 3, for n tokens at once, which step.py's Step wraps and
runtime/native_step.py drives; team.h: their threads, sized from torch.get_num_threads()), and each
instruction set's kernels under arch/x86, arch/arm and arch/portable, which src/isa.h picks.

Variants (build.VARIANTS): avx512vnni, avxvnni, avx2 (x86-64), neon (aarch64 with dot products) and
portable. The best one this CPU's flags allow is used (cpu.py); LLMCLI_KERNEL=<name> picks another
(tests, benchmarks), LLMCLI_NO_KERNEL=1 none. `pip install` builds them (build_hook.py); otherwise
the first use builds the one needed into the user cache, in seconds (library.py). Without a compiler,
`available()` is False, one warning says so, and callers use the torch path.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

from .. import notices
from ..errors import LlmcliWarning
from . import cpu

if TYPE_CHECKING:
    import torch

_module = None  # the active variant's library.Kernels; False: none (no compiler, or LLMCLI_NO_KERNEL)
_loaded = {}  # variant -> Kernels, or the build.BuildError that kept it from loading


def variants() -> list[str]:
    """The variants this CPU runs, best first."""
    return cpu.runnable()


def why_not(name: str) -> str | None:
    """None where this CPU runs variant `name`; else why not, naming the missing flag or the machine."""
    return cpu.why_not(name)


def load(name: str):
    """Variant `name`'s library.Kernels, built if need be (tests and benchmarks compare variants).
    Raises build.BuildError if it cannot be built, ValueError if this CPU cannot run it."""
    from . import library

    reason = why_not(name)
    if reason is not None:
        raise ValueError(f"the {name} kernels cannot run here: {reason}")
    if name not in _loaded:
        try:
            _loaded[name] = library.find(name, on_build=lambda: notices.say(
                f"building the C++ kernels for this CPU ({name}, a few seconds, once)"))
        except library.build.BuildError as e:
            _loaded[name] = e
    if isinstance(_loaded[name], Exception):
        raise _loaded[name]
    return _loaded[name]


def available() -> bool:
    global _module
    if _module is None:
        _module = False if os.environ.get("LLMCLI_NO_KERNEL") else _select()
    return _module is not False


def module():
    """The active library.Kernels (its step() makes a decode step), or None without one."""
    return _module if available() else None


def variant() -> str | None:
    """The name of the variant in use, or None."""
    return _module.variant if available() else None


def describe() -> str:
    """The kernels in use, for `bench` and chat's /show info: the instruction set they run on."""
    return variant() or "no"


def int8_dot() -> bool:
    """Whether blocks multiply here with SIMD integer dot products: faster than torch's int4 kernel, so
    the loader keeps Q4_0/Q4_1/Q8_0/Q4_K as blocks too (gguf_import.as_stored_preset). The portable
    variant multiplies with int8 activations too, but in plain C++."""
    return available() and _module.variant != "portable"


def _select():
    from .build import BuildError

    order = variants()
    wanted = os.environ.get("LLMCLI_KERNEL")
    if wanted:
        reason = why_not(wanted)
        if reason is None:
            order = [wanted] + [v for v in order if v != wanted]
        else:
            warnings.warn(LlmcliWarning(f"LLMCLI_KERNEL={wanted} is not used: {reason}"), stacklevel=3)
    errors = []
    for name in order:
        try:
            k = load(name)
        except BuildError as e:
            errors.append(e)
            continue
        return k
    warnings.warn(LlmcliWarning(f"{errors[-1]}; the GGUF kernels take the slower torch path"), stacklevel=3)
    return False


def register_ops() -> None:
    """The kernels as torch operators (ops.py), for a graph torch.compile traces: called before compiling."""
    if available():
        from . import ops

        ops.register(lambda: _module)


def mm(x: torch.Tensor, blocks: torch.Tensor, type_id: int, K: int, refined: bool = False) -> torch.Tensor:
    """x (M, K) any float dtype, blocks (N, row bytes) -> (M, N) float32; `refined`: int8x2
    activations into the integer dot products (each row's 16-bit codes as two int8 rows), else int8."""
    import torch

    if torch.compiler.is_compiling():
        return torch.ops.llmcli_native.mm(x, blocks, type_id, K, refined)
    return _module.mm(x, blocks, type_id, K, refined)


def dequantize(blocks: torch.Tensor, type_id: int, K: int, dtype: torch.dtype) -> torch.Tensor:
    """(n, row bytes) -> (n, K) in `dtype`."""
    import torch

    if torch.compiler.is_compiling():
        return torch.ops.llmcli_native.dequantize(blocks, type_id, K).to(dtype)
    return _module.dequantize(blocks, type_id, K).to(dtype)


def top_k(x: torch.Tensor, k: int):
    """(values, indices) of the k largest of x (n,), largest first, as torch.topk; through the kernel
    for a float32 CPU vector: one pass of vector compares, many times faster than torch.topk on a
    vocabulary (docs/performance-choices.md)."""
    import torch

    if x.dim() == 1 and x.dtype == torch.float32 and x.is_cpu and 1 <= k <= x.numel() and available() \
            and not torch.compiler.is_compiling():
        return _module.top_k(x, k)
    return x.topk(k)


def attend_one(q, k, v, mask, scale: float) -> torch.Tensor | None:
    """One query per row against a float32 CPU cache (models/llama.py's attend_one), or None where
    this kernel does not serve: q (B, H, 1, D), k and v (B, KV, S, D), mask bool (B or 1, S) or None."""
    import torch

    if q.device.type != "cpu" or k.dtype != torch.float32 or v.dtype != torch.float32 or not available():
        return None
    if k.stride(-1) != 1 or v.stride(-1) != 1:  # rows of D contiguous, as every cache here keeps them
        return None
    if torch.compiler.is_compiling():
        y = torch.ops.llmcli_native.attend_one(q, k, v, mask, scale)
    else:
        y = _module.attend_one(q, k, v, mask, scale)
    return y.to(q.dtype)
