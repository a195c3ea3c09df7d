"""Sampling without tensors: the frozen parameters, the draw among the top-k logits in plain floats,
and the whole chain in numpy for a vocabulary of logits (the torch-free CPU path; sampling.py has the
same chain in torch for the torch paths, and takes SamplingParams and draw_from_top from here).

The chain follows llama.cpp: penalties -> top-k -> top-p -> min-p -> temperature -> draw. A draw is
the argmax of p / Exp(1) noise; the noise comes from a generator seeded once per sequence (numpy's
PCG64 here, torch's Generator there: the same seed gives the same tokens on one path, run after run).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace

import numpy as np

from ..errors import InvalidParameterError

MAX_SEED = 2 ** 64 - 1
NEAR_TIE = 2.0 ** -6  # relative gap under which half-precision rounding may have decided the top token
RESCORED = 8  # candidates rescored in float32
MOST_TOP = 128  # the largest k a pick takes from the decode step's top k (the native step's top=k)


def near_tie(best: float, second: float) -> bool:
    """Whether the best two logits are close enough for rounding to have ordered them."""
    return not best - second > NEAR_TIE * abs(best)




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


def penalizes(params: SamplingParams) -> bool:
    """Whether some penalty is on (not the usual case)."""
    return params.repeat_penalty != 1.0 or bool(params.presence_penalty) or bool(params.frequency_penalty)


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


def wanted_top(params: SamplingParams, constrained: bool = False) -> int:
    """The k largest logits a pick can take from the decode step instead of looking at all of them
    (the step's top=k): 0 where it looks at all (a grammar, penalties, top-k off)."""
    if constrained or penalizes(params):
        return 0
    if params.greedy:
        return RESCORED
    return params.top_k if 0 < params.top_k <= MOST_TOP else 0


def largest(logits: np.ndarray, k: int) -> tuple[list[float], list[int]]:
    """(values, indices) of the k largest of logits (V,), largest first, of equals the earlier."""
    idx = np.argpartition(-logits, k - 1)[:k]
    idx = idx[np.argsort(-logits[idx], kind="stable")]
    return logits[idx].tolist(), idx.tolist()


def make_rng(seed: int) -> tuple[np.random.Generator, int]:
    """numpy's generator seeded with `seed`, or with a fresh random seed when seed is -1."""
    if seed is None or seed < 0:
        seed = int.from_bytes(os.urandom(4), "little")
    return np.random.Generator(np.random.PCG64(seed)), seed


def sample_array(logits: np.ndarray, history: list[int], params: SamplingParams, rng: np.random.Generator,
                 top: tuple[list[float], list[int]] | None = None) -> int:
    """The next token id for float32 logits (V,) and the sequence's ids so far (the penalties look
    back over them): sampling.sample's choice in numpy. `top`: the values and indices of the largest
    logits, largest first, where the decode step found them."""
    penalized = apply_penalties(logits, history, params)
    if penalized is not logits:
        logits, top = penalized, None
    if params.greedy:
        if top is not None and top[1] and math.isfinite(top[0][0]):
            return top[1][0]
        return int(np.argmax(logits))
    V, k = logits.shape[-1], params.top_k
    if 0 < k < V:
        if top is None or len(top[1]) < k:
            top = largest(logits, k)
        values, idx = top[0][:k], top[1][:k]
        if math.isfinite(values[0]) and not any(math.isnan(v) for v in values):
            return int(idx[draw_from_top(values, rng.exponential(1.0, len(values)).tolist(), params)])
        logits, ids = np.asarray(values, dtype=np.float32), np.asarray(idx)
    else:
        ids = None
    x = logits.astype(np.float64)
    x = _min_p(_top_p(x, params.top_p), params.min_p) / params.temperature
    p = np.exp(x - np.max(x))
    choice = int(np.argmax(p / rng.exponential(1.0, p.shape[0])))
    return int(ids[choice]) if ids is not None else choice


def apply_penalties(logits: np.ndarray, history: list[int], params: SamplingParams) -> np.ndarray:
    """sampling.apply_penalties in numpy: logits as they are when no penalty is on."""
    n = params.repeat_last_n
    if n == 0 or not history or not penalizes(params):
        return logits
    window = np.asarray(history if n < 0 else history[-n:], dtype=np.int64)
    counts = np.bincount(window, minlength=logits.shape[-1])[: logits.shape[-1]].astype(logits.dtype)
    seen = counts > 0
    out = logits
    if params.repeat_penalty != 1.0:
        out = np.where(seen, np.where(out > 0, out / params.repeat_penalty, out * params.repeat_penalty), out)
    if params.presence_penalty or params.frequency_penalty:
        out = out - params.presence_penalty * seen.astype(out.dtype) - params.frequency_penalty * counts
    return out.astype(logits.dtype, copy=False)


def _top_p(x: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose probability reaches p (at least one)."""
    if p >= 1.0:
        return x
    order = np.argsort(-x, kind="stable")
    probs = np.exp(x[order] - x[order[0]])
    probs /= probs.sum()
    drop = np.empty_like(order, dtype=bool)
    drop[order] = (np.cumsum(probs) - probs) >= p
    return np.where(drop, -np.inf, x)


def _min_p(x: np.ndarray, p: float) -> np.ndarray:
    """Keep tokens whose probability is at least p times the top token's."""
    if p <= 0:
        return x
    return np.where(np.exp(x - np.max(x)) < p, -np.inf, x)


def token_logprobs_array(logits: np.ndarray, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """sampling.token_logprobs in numpy: the log-probability of `token` under softmax(logits) (V,)
    and the n most likely tokens with theirs, most likely first."""
    x = logits.astype(np.float64)
    top = np.max(x)
    logprobs = x - (top + np.log(np.sum(np.exp(x - top))))
    alternatives = []
    if n > 0:
        values, ids = largest(logprobs, min(n, logprobs.shape[-1]))
        alternatives = list(zip(ids, values))
    return float(logprobs[token]), alternatives
