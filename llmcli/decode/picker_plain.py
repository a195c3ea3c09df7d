"""picker.py's Picker on numpy logits, for the torch-free CPU path (decode/lean.py, batched.py's lean
rows): the same choice for the same logits, in the same order of steps: near-tied greedy candidates
rescored exactly, the grammar's mask, penalties over the sequence's history, the seeded draw, the
token's log-probabilities, the timing stats. Its generator is numpy's (sampling_plain.make_rng)."""

from __future__ import annotations

import time

import numpy as np

from .sampling_plain import RESCORED, SamplingParams, largest, make_rng, near_tie, sample_array, token_logprobs_array, \
    wanted_top
from .stream import Logprobs, Stats


class PlainPicker:
    """Chooses the tokens of one sequence. `rescore(logits, h, ids)` recomputes logits[ids] exactly in
    place from the final hidden state `h` (LeanModel.rescore); `constraint` (constrained.TokenConstraint)
    masks the logits; `logprobs` records each pick."""

    def __init__(self, params: SamplingParams, prompt: list[int], *, rescore=None, constraint=None,
                 logprobs: Logprobs | None = None, stats: Stats | None = None):
        self.params, self.rescore = params, rescore
        self.constraint, self.logprobs = constraint, logprobs
        self.stats = stats if stats is not None else Stats(prompt_tokens=len(prompt))
        self.rng, self.stats.seed = make_rng(params.seed)
        self.history = list(prompt)  # what the penalties look back over
        self.t0 = time.perf_counter()  # the first pick ends the prefill; later ones are decode

    @property
    def wants_hidden(self) -> bool:
        return self.params.greedy and self.rescore is not None

    @property
    def wants_top(self) -> int:
        """The k largest logits a pick can take from the step instead of looking at all of them."""
        return wanted_top(self.params, self.constraint is not None)

    def pick(self, logits: np.ndarray, h: np.ndarray | None = None, top=None) -> int:
        """The next token for float32 logits (V,); `h` (H,) the hidden state they came from; `top`:
        the values and indices (lists) of the largest logits, largest first, where the step found them."""
        if self.params.greedy and h is not None and self.rescore is not None:
            k = min(RESCORED, logits.shape[-1])
            if top is None or len(top[1]) < k:
                top = largest(logits, k)
            if len(top[1]) < 2 or near_tie(top[0][0], top[0][1]):
                self.rescore(logits, h, top[1][:k])  # (in place: argmax the rescored)
                top = None
        allowed = logits
        if self.constraint is not None:
            allowed, top = self.constraint.mask(logits), None
        token = sample_array(allowed, self.history, self.params, self.rng, top)
        if self.logprobs is not None:
            self.logprobs.add(token, *token_logprobs_array(logits, token, self.logprobs.top))
        if self.constraint is not None:
            self.constraint.advance(token)
        self.history.append(token)
        self.stats.count_token(self.t0)
        return token

    @property
    def grammar_done(self) -> bool:
        """The grammar is complete: its end token is the only continuation (not counted as generated)."""
        return self.constraint is not None and self.constraint.is_done()
