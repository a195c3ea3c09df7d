"""Small C++ CPU kernels, over torch's thread pool (the .cpp files beside this one):

- matmul.cpp: for GGUF blocks (quant/gguf_blocks.py), y = x @ W.T reading the blocks, and
  dequantization of rows. It dequantizes one block (32 or 256 weights) into register-sized float
  buffers and takes its dot products with every activation row: the weights are read once, as
  stored. With AVX2, every type but Q5_K (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K) takes
  llama.cpp's route instead: the activations are quantized to int8 per block of 32 (scale
  max|x|/127), and each block's dot product is integer multiply-adds (maddubs), 32 weights an
  instruction, scaled once per block.
- attention.cpp: decoding's one-query attention over a float32 KV cache (attend_one): each head's
  scores, softmax (a vectorized exp) and weighted sum of values in one pass. SDPA's setup for a
  single query cost 37 us a layer, this 15 (SmolLM2 at ~100 tokens, 2 threads).
- decode.cpp: a whole one-token step of a Llama-family model over GGUF blocks (native_step.py).
- ops.cpp: the torch operators (TORCH_LIBRARY: a few microseconds a call from C++ dispatch, and
  torch.compile keeps them in its graph) and the Python module.

They compile as one translation unit, in _SOURCES' order, on first use with
torch.utils.cpp_extension.load_inline (a minute or two on two cores), cached under torch's
extensions folder (TORCH_EXTENSIONS_DIR) keyed by the source, torch's version and the CPU. Without a
compiler, or with LLMCLI_NO_KERNEL=1, `available()` is False and callers use the torch path.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from .. import notices

_SOURCES = ("matmul.cpp", "attention.cpp", "decode.cpp", "ops.cpp")


def _source() -> str:
    folder = Path(__file__).parent
    return "\n".join((folder / name).read_text() for name in _SOURCES)


_module = None  # the built extension, False when it cannot be built


def available() -> bool:
    global _module
    if _module is None:
        _module = False if os.environ.get("LLMCLI_NO_KERNEL") else _build()
    return _module is not False


def module():
    """The built extension (has DecodeSteps), or None without one."""
    return _module if available() else None


def describe() -> str:
    """The kernels in use, for `bench` and chat's /show info: which instruction set they run on."""
    if not available():
        return "no"
    return "avx2 int8-dot" if int8_dot() else "float"


def int8_dot() -> bool:
    """Whether Q4_0/Q4_1/Q8_0/Q4_K blocks multiply here with integer dot products (AVX2), faster than
    torch's int4 kernel: then the loader keeps them as blocks too (gguf_import.as_stored_preset)."""
    return available() and _module.has_int8_dot()


def _build():
    import contextlib
    import io
    import warnings

    from torch.utils.cpp_extension import load_inline

    # -march=native: a cache shared by machines (a home folder on NFS) must not hand one CPU's build to another
    source = _source()
    digest = hashlib.sha256((source + torch.__version__ + _cpu_signature()).encode()).hexdigest()[:12]
    name = f"llmcli_native_{digest}"
    if notices.notify is not None and not _cached(name):
        notices.say("building the C++ kernels for this CPU (once, about two minutes)")
    try:  # the library never prints: the build's output is swallowed, a failure means "use torch"
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            module = load_inline(name, cpp_sources=source,
                                 extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                                 verbose=False)
        _register_fakes()
        return module
    except Exception:  # no compiler, no headers, a failed build: the torch path still works
        return False


def _cpu_signature() -> str:
    """The machine and its instruction-set flags (what -march=native compiles for)."""
    import platform

    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return platform.machine() + platform.processor() + flags


def _cached(name: str) -> bool:
    try:
        from torch.utils.cpp_extension import _get_build_directory

        folder = _get_build_directory(name, verbose=False)
        return any(f.endswith((".so", ".pyd", ".dylib")) for f in os.listdir(folder))
    except Exception:
        return False


def mm(x: torch.Tensor, blocks: torch.Tensor, type_id: int, K: int) -> torch.Tensor:
    """x (M, K) any float dtype, blocks (N, row bytes) -> (M, N) float32."""
    return torch.ops.llmcli_gguf.mm(x, blocks, type_id, K)


def dequantize(blocks: torch.Tensor, type_id: int, K: int, dtype: torch.dtype) -> torch.Tensor:
    """(n, row bytes) -> (n, K) in `dtype`."""
    return torch.ops.llmcli_gguf.dequantize(blocks, type_id, K).to(dtype)


def attend_one(q, k, v, mask, scale: float) -> torch.Tensor | None:
    """One query per row against a float32 CPU cache (models/llama.py's attend_one), or None where
    this kernel does not serve: q (B, H, 1, D), k and v (B, KV, S, D), mask bool (B or 1, S) or None."""
    if q.device.type != "cpu" or k.dtype != torch.float32 or v.dtype != torch.float32 or not available():
        return None
    if k.stride(-1) != 1 or v.stride(-1) != 1:  # rows of D contiguous, as every cache here keeps them
        return None
    y = torch.ops.llmcli_gguf.attend_one(q, k, v, _NO_MASK if mask is None else mask, scale)
    return y.to(q.dtype)


_NO_MASK = torch.empty(0, dtype=torch.bool)  # the op's "attend to every key"


def _register_fakes() -> None:
    """Shapes for torch.compile's tracing, once the operators exist (after the build)."""
    if getattr(_register_fakes, "done", False):
        return

    @torch.library.register_fake("llmcli_gguf::mm")
    def _(x, blocks, type_id, K):
        return x.new_empty(x.shape[0], blocks.shape[0], dtype=torch.float32)

    @torch.library.register_fake("llmcli_gguf::dequantize")
    def _(blocks, type_id, K):
        return blocks.new_empty(blocks.shape[0], K, dtype=torch.float32)

    @torch.library.register_fake("llmcli_gguf::attend_one")
    def _(q, k, v, mask, scale):
        return q.new_empty(q.shape, dtype=torch.float32)

    _register_fakes.done = True
