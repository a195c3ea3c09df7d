"""How precisely the native step (runtime/lean_step.py, native_step.py) multiplies a GGUF file's
blocks: which activations go into the integer dot products as int8x2 (each row 16-bit codes, their high
and low bytes two int8 rows: ~15 bits) rather than llama.cpp's int8 (native/step.py's REFINE mask), and the words
`run -v`, `bench` and `perplexity` say it in.

    mask = choose(file_bytes)          the default for a GGUF file of that size, as stored
    describe(mask) -> "int8x2 activations for q/k/v, gate/up, o, down; int8 for head"

Small models decode bound by per-token overhead and arithmetic, not by reading weights, and llmcli's
lead over llama.cpp is widest there. Of the four groups, the inputs of q/k/v and gate/up (the
normed hidden state) and of down (the gated MLP activations) carry most of int8's loss for the least
work: int8x2 on those takes the mean KLD against the file dequantized to float32 to a third of
llama.cpp's or less (SmolLM2 0.00090 against 0.00277, Gemma-3 0.00047 against 0.00426) at int8's
decode speed within about 1 % (the kernels add a pair's integer sums before scaling them), and the
default model answers the demo question as in float32. Every group would take it to ~0 for up to 3 %
more on one thread, the head most of it (docs/performance.md, "Quality of the default path"). Past REFINE_UP_TO bytes the lead is narrower (1.3-1.5x) and they keep int8, as llama.cpp
does.
LLMCLI_ACTIVATIONS=int8 | int8x2 | names of REFINE (comma-separated) sets it for any GGUF file as
stored (the torch path's step takes int8x2 for every matmul or none: quant/held.py's activations_of).
A preset's `activations` (q8's int8x2) is the preset's own choice.
"""

from __future__ import annotations

import os

from ..errors import InvalidParameterError
from ..native.step import REFINE, REFINE_ALL, refined_names

ENV = "LLMCLI_ACTIVATIONS"
REFINE_UP_TO = 600 << 20  # bytes of a file: up to here some activations are int8x2 (docs/performance.md)
SMALL_FILES = REFINE["normed"] | REFINE["mlp"]  # the groups int8x2 up to REFINE_UP_TO (module docstring)
_MATMULS = {"normed": ("q/k/v", "gate/up"), "attention": ("o",), "mlp": ("down",), "head": ("head",)}


def parse(value: str) -> int:
    """LLMCLI_ACTIVATIONS's value -> a REFINE mask."""
    v = value.strip().lower()
    if v == "int8":
        return 0
    if v == "int8x2":
        return REFINE_ALL
    names = [n.strip() for n in v.split(",") if n.strip()]
    bad = [n for n in names if n not in REFINE]
    if bad or not names:
        raise InvalidParameterError(f"{ENV} takes int8, int8x2 or some of {', '.join(REFINE)} "
                                    f"(comma-separated), got {value!r}")
    return sum(REFINE[n] for n in set(names))


def choose(file_bytes: int) -> int:
    """The REFINE mask for a GGUF file of this many bytes: LLMCLI_ACTIVATIONS where set; else
    SMALL_FILES up to REFINE_UP_TO bytes, int8 past them."""
    if os.environ.get(ENV):
        return parse(os.environ[ENV])
    return SMALL_FILES if file_bytes <= REFINE_UP_TO else 0


def describe(mask: int) -> str:
    """Which matmul takes which activations, in a few words."""
    fine = [m for name in refined_names(mask) for m in _MATMULS[name]]
    coarse = [m for name, ms in _MATMULS.items() if not mask & REFINE[name] for m in ms]
    if not fine:
        return "int8 activations (llama.cpp's)"
    if not coarse:
        return "int8x2 activations (every matmul)"
    return f"int8x2 activations for {', '.join(fine)}; int8 for {', '.join(coarse)}"
