"""Sampling: frozen parameters and pure functions on logits (..., vocab).

The chain follows llama.cpp: penalties -> top-k -> top-p -> min-p -> temperature -> draw.
Temperature 0 (or top-k 1) is greedy (argmax after penalties). Draws use a seeded `torch.Generator`, so the same
seed and settings give the same tokens.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace

import torch

from .. import native
from ..errors import InvalidParameterError

MAX_SEED = 2 ** 64 - 1


@dataclass(frozen=True)
class SamplingParams:
    """Defaults as llama.cpp's. 0 / 1.0 / -1 mean "off" as users of those tools expect."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64  # -1: the whole context
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = -1  # -1: a random seed (reported in the stats)

    def __post_init__(self):
        for name in ("temp", "top-p", "min-p", "repeat-penalty", "presence-penalty", "frequency-penalty"):
            value = getattr(self, _FIELD_OF[name])
            if not _finite(value):  # inf passed every range below (nan failed them, less clearly)
                raise InvalidParameterError(f"--{name} must be a finite number, got {value}")
        checks = [
            (self.temperature >= 0, "temp", "must be >= 0 (0 = greedy)"),
            (self.top_k >= 0, "top-k", "must be >= 0 (0 = off)"),
            (0 < self.top_p <= 1, "top-p", "must be in (0, 1] (1 = off)"),
            (0 <= self.min_p < 1, "min-p", "must be in [0, 1) (0 = off)"),
            (self.repeat_penalty > 0, "repeat-penalty", "must be > 0 (1.0 = off)"),
            (self.repeat_last_n >= -1, "repeat-last-n", "must be >= -1 (-1 = whole context, 0 = off)"),
            (-2 <= self.presence_penalty <= 2, "presence-penalty", "must be in [-2, 2] (0 = off)"),
            (-2 <= self.frequency_penalty <= 2, "frequency-penalty", "must be in [-2, 2] (0 = off)"),
            # torch.Generator.manual_seed takes 64 bits; llama.cpp's 32-bit seeds fit
            (-1 <= self.seed <= MAX_SEED, "seed", f"must be -1 (random) or a whole number from 0 to {MAX_SEED}"),
        ]
        for ok, name, rule in checks:
            if not ok:
                raise InvalidParameterError(f"--{name} {rule}, got {getattr(self, _FIELD_OF[name])}")

    def with_(self, **changes) -> "SamplingParams":
        return replace(self, **changes)

    @property
    def greedy(self) -> bool:
        """The most likely token every time: temperature 0, or top-k 1 (the one token left is drawn
        whatever the temperature), so both rescore near ties (picker.py) and both may speculate."""
        return self.temperature == 0 or self.top_k == 1


def _finite(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int from JSON too large for a float (10**400)
        return False


# flag name (llama.cpp spelling) -> field
_FIELD_OF = {"temp": "temperature", "top-k": "top_k", "top-p": "top_p", "min-p": "min_p",
             "repeat-penalty": "repeat_penalty", "repeat-last-n": "repeat_last_n",
             "presence-penalty": "presence_penalty", "frequency-penalty": "frequency_penalty", "seed": "seed"}
PARAMETER_NAMES = tuple(_FIELD_OF)


def parse_parameter(params: SamplingParams, name: str, value: str) -> SamplingParams:
    """`/set parameter top_k 20` and friends: a new params object, validated."""
    key = name.strip().lstrip("-").replace("_", "-").lower()
    key = {"temperature": "temp"}.get(key, key)
    if key not in _FIELD_OF:
        raise InvalidParameterError(f"unknown parameter {name!r}; known: {', '.join(PARAMETER_NAMES)}")
    field = _FIELD_OF[key]
    kind = {f.name: f.type for f in fields(SamplingParams)}[field]
    try:
        parsed = int(value) if kind in (int, "int") else float(value)
    except ValueError:
        raise InvalidParameterError(f"{key} needs a {'whole ' if kind in (int, 'int') else ''}number, got {value!r}") from None
    return replace(params, **{field: parsed})


_NO_HISTORY = torch.empty(0, dtype=torch.long)


def penalizes(params: SamplingParams) -> bool:
    """Whether some penalty is on (not the usual case)."""
    return params.repeat_penalty != 1.0 or bool(params.presence_penalty) or bool(params.frequency_penalty)


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


def draw_from_top(values: list[float], noise: list[float], params: SamplingParams) -> int:
    """The position drawn among the top-k logits `values` (largest first, the first finite) with
    `noise` (draw's Exp(1) noise, one a value): top-p, min-p, temperature and draw's argmax of
    p / noise, in plain floats. Those are ~15 torch ops on k values, and right after a decode step
    (its caches cold) their dispatch cost a visible part of a small model's token. The same
    choice as the ops but where float32 and float64 rounding part them (an exact tie, a probability
    on a threshold)."""
    top = values[0]
    weights = [math.exp(v - top) for v in values]  # softmax's numerators: p_i = w_i / sum(w)
    kept = len(weights)
    if params.top_p < 1.0:  # keep while the mass of the strictly more likely is under top_p
        total, before = sum(weights), 0.0
        for i, w in enumerate(weights):
            if before / total >= params.top_p:
                kept = i
                break
            before += w
    if params.min_p > 0:  # p_i / p_max = w_i (w_0 = 1)
        kept = next((i for i in range(kept) if weights[i] < params.min_p), kept)
    p = [math.exp((v - top) / params.temperature) for v in values[:kept]]  # after temperature, unnormalized
    scores = [pi / e if e > 0 else (math.inf if pi > 0 else 0.0) for pi, e in zip(p, noise)]  # (torch's p / 0 = inf)
    return max(range(kept), key=scores.__getitem__)  # (the first of equals, as argmax)


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
