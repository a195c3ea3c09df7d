"""How precisely the native step (runtime/lean_step.py, native_step.py) multiplies a GGUF file's
blocks: which activations go into the integer dot products as int8x2 (each row its int8 codes and its
residual's: ~14 bits) rather than llama.cpp's int8 (native/step.py's REFINE mask), and the words
`run -v`, `bench` and `perplexity` say it in.

    mask = choose(file_bytes, args)    the default for a GGUF file (its size, its ModelArgs), as stored
    describe(mask) -> "int8x2 activations for q/k/v, gate/up, o, down; int8 for head"

Small models decode bound by per-token overhead and arithmetic, not by reading weights, and llmcli's
lead over llama.cpp is widest there: int8x2 on every layer's matmuls costs ~10 % of decode and takes
the loss of int8 activations (mean KLD against the file dequantized to float32) to a third or less of
llama.cpp's (docs/performance.md, "Quality of the default path"). The head's input is int8x2 too
unless the head is most of a token's work (a 262k vocabulary: Gemma 3), where it would double the
cost. Past REFINE_UP_TO bytes the lead is narrower (1.3-1.5x) and they keep int8, as llama.cpp does.
LLMCLI_ACTIVATIONS=int8 | int8x2 | names of REFINE (comma-separated) sets it for any GGUF file as
stored (the torch path's step takes int8x2 for every matmul or none: quant/held.py's activations_of).
A preset's `activations` (q8's int8x2) is the preset's own choice.
"""

from __future__ import annotations

import os

from ..errors import InvalidParameterError
from ..native.step import REFINE, REFINE_ALL, refined_names

ENV = "LLMCLI_ACTIVATIONS"
REFINE_UP_TO = 600 << 20  # bytes of a file: up to here the layers' activations are int8x2 (docs/performance.md)
HEAD_UP_TO = 1 / 3  # the head's share of a token's multiply-adds up to which its input is int8x2 too
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


def head_share(args) -> float:
    """The output head's share of a token's multiply-adds (a mixture of experts: the experts a token
    runs): 0.21 for SmolLM2-135M, 0.63 for Gemma-3-270M's 262k-token vocabulary."""
    h = args.hidden_size
    attn = h * args.head_dim * (2 * args.num_attention_heads + 2 * args.num_key_value_heads)
    experts = getattr(args, "num_experts", None)
    inter = args.moe_intermediate_size * args.num_experts_per_tok if experts else args.intermediate_size
    head = args.vocab_size * h
    return head / (head + args.num_hidden_layers * (attn + 3 * h * inter))


def choose(file_bytes: int, args) -> int:
    """The REFINE mask for a GGUF file of this many bytes and these ModelArgs: LLMCLI_ACTIVATIONS
    where set; else int8x2 for every layer's matmuls up to REFINE_UP_TO bytes, and for the head too
    where it is at most HEAD_UP_TO of the work (a large vocabulary's head would double most of it)."""
    if os.environ.get(ENV):
        return parse(os.environ[ENV])
    if file_bytes > REFINE_UP_TO:
        return 0
    layers = REFINE["normed"] | REFINE["attention"] | REFINE["mlp"]
    return layers | REFINE["head"] if head_share(args) <= HEAD_UP_TO else layers


def describe(mask: int) -> str:
    """Which matmul takes which activations, in a few words."""
    fine = [m for name in refined_names(mask) for m in _MATMULS[name]]
    coarse = [m for name, ms in _MATMULS.items() if not mask & REFINE[name] for m in ms]
    if not fine:
        return "int8 activations (llama.cpp's)"
    if not coarse:
        return "int8x2 activations (every matmul)"
    return f"int8x2 activations for {', '.join(fine)}; int8 for {', '.join(coarse)}"
