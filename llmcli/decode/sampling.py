"""Sampling: frozen parameters and pure functions on logits (..., vocab).

The chain follows llama.cpp: penalties -> top-k -> top-p -> min-p -> temperature -> draw.
Temperature 0 (or top-k 1) is greedy (argmax after penalties). Draws use a seeded `torch.Generator`, so the same
seed and settings give the same tokens.
"""

from __future__ import annotations

import math
import os

import torch

from .. import native
from .sampling_plain import (MAX_SEED, PARAMETER_NAMES, SamplingParams, draw_from_top,  # noqa: F401 (re-exported)
                             parse_parameter, penalizes)

_NO_HISTORY = torch.empty(0, dtype=torch.long)


def penalty_history(history: list[int], params: SamplingParams, device: torch.device) -> torch.Tensor:
    """The ids the penalties look back over (the last repeat_last_n, or all for -1) as a tensor;
    empty, and not built, when no penalty is on (the usual case, on every decode step)."""
    if not penalizes(params):
        return _NO_HISTORY
    window = history[-params.repeat_last_n:] if params.repeat_last_n > 0 else history
    return torch.tensor(window, dtype=torch.long, device=device)


def make_generator(seed: int, device: torch.device) -> tuple[torch.Generator, int]:
    """A generator seeded with `seed`, or with a fresh random seed when seed is -1."""
    if seed is None or seed < 0:
        seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen, seed


def apply_penalties(logits: torch.Tensor, history: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits (V,); history (N,) previous token ids. Repetition penalty divides positive logits and
    multiplies negative ones of seen tokens; presence subtracts once, frequency per occurrence."""
    n = params.repeat_last_n
    if n == 0 or history.numel() == 0 or (params.repeat_penalty == 1.0 and params.presence_penalty == 0
                                          and params.frequency_penalty == 0):
        return logits
    window = history if n < 0 else history[-n:]
    counts = torch.bincount(window, minlength=logits.shape[-1])[: logits.shape[-1]].to(logits.dtype)
    seen = counts > 0
    out = logits
    if params.repeat_penalty != 1.0:
        penalized = torch.where(out > 0, out / params.repeat_penalty, out * params.repeat_penalty)
        out = torch.where(seen, penalized, out)
    if params.presence_penalty or params.frequency_penalty:
        out = out - params.presence_penalty * seen.to(out.dtype) - params.frequency_penalty * counts
    return out


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep exactly the k largest logits (0 or >= vocab: keep all)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    idx = top_k(logits, k)[1]
    return torch.full_like(logits, float("-inf")).scatter(-1, idx, logits.gather(-1, idx))


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest logits, largest first; for logits (V,) on the CPU through the
    native kernel (torch.topk took a few percent of a small model's step, more for a large vocabulary)."""
    return native.top_k(logits, k) if logits.dim() == 1 else logits.topk(k, dim=-1)


def argmax(logits: torch.Tensor) -> int:
    """The index of the largest of logits (V,), the first of equals (torch.argmax's; numpy's, which
    starts no threads, where torch's split the vocabulary over its OpenMP threads on the CPU)."""
    if logits.dtype == torch.float32 and logits.is_cpu and logits.dim() == 1 and not torch.compiler.is_compiling():
        return int(logits.detach().numpy().argmax())
    return int(logits.argmax(dim=-1))


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches p (at least one)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
    drop_sorted = before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def apply_min_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least p times the top token's."""
    if p <= 0:
        return logits
    probs = logits.softmax(dim=-1)
    return logits.masked_fill(probs < p * probs.max(dim=-1, keepdim=True).values, float("-inf"))


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature


def draw(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One index from softmax(logits): argmax of p / Exp(1) noise (no host sync, seeded)."""
    probs = logits.float().softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / noise).argmax(dim=-1)


def sample(logits: torch.Tensor, history: torch.Tensor, params: SamplingParams,
           generator: torch.Generator, top: tuple[list[float], list[int]] | None = None) -> int:
    """The next token id for logits (V,), given the history of ids for the penalties. `top`: the
    values and indices of the largest logits, largest first (top_k's), where the caller has them."""
    penalized = apply_penalties(logits, history, params)
    if penalized is not logits:
        logits, top = penalized, None
    if params.greedy:
        if top is not None and top[1] and math.isfinite(top[0][0]):
            return top[1][0]  # argmax's: the first of the largest (no NaN or inf above it)
        return argmax(logits)
    idx = None
    k = params.top_k
    if 0 < k < logits.shape[-1]:
        # the same result as apply_top_k on the full vocab, but the rest only touches k values
        if top is not None and len(top[1]) >= k and logits.is_cpu:
            (values, idx), found = (top[0][:k], top[1][:k]), None
        else:
            found, idx = top_k(logits, k)
            values = found.tolist() if found.is_cpu else None
        if values and math.isfinite(values[0]) and not any(math.isnan(v) for v in values):
            noise = torch.empty(len(values)).exponential_(1, generator=generator).tolist()  # draw's own noise
            return int(idx[draw_from_top(values, noise, params)])
        logits = found if found is not None else torch.tensor(values)
    logits = apply_min_p(apply_top_p(logits, params.top_p), params.min_p)
    choice = draw(apply_temperature(logits, params.temperature), generator)
    return int(idx[choice] if idx is not None else choice)


def token_logprobs(logits: torch.Tensor, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of `token` under softmax(logits) (V,), and the n most likely tokens with
    theirs, most likely first: the model's own distribution, as OpenAI's `logprobs` reports it."""
    logprobs = logits.float().log_softmax(dim=-1)
    top = logprobs.topk(min(n, logprobs.shape[-1])) if n > 0 else None
    alternatives = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
    return float(logprobs[token]), alternatives
