"""Think, then constrain: a reasoning model's thinking is free text and only its answer follows the
grammar (a JSON schema, a regex, a grammar, the tools' calls), which starts after the thinking
closes. The same object carries the reasoning budget on the paths that pick through a constraint
(generate.py, batched.py): at the budget, the one token it forces is all the mask allows.

    constraint = think_first(reasoning, inner)   # inner: constrained.TokenConstraint or None
    logits = constraint.mask(logits)             # while thinking: free (no end token where a grammar
    constraint.advance(token)                    #   waits); then the grammar's mask and moves
    constraint.is_done()                         # the grammar is complete

A grammar that covers the whole reply (harmony's tool calls: Grammar.whole_reply) sees every token,
the thinking's included; a budget's forced token then goes only where the grammar allows it.

It answers what TokenConstraint answers (mask, advance, is_done, is_accepting, end_token, the
timings), so every decode path takes it unchanged. The reasoning's parser reads each token after
it is picked (text_stream), so at a pick `reasoning.state` is where the tokens so far left it.
"""

from __future__ import annotations

import numpy as np


def think_first(reasoning, inner, end_ids=()):
    """`inner` alone where nothing needs the wrapper (no reasoning, or neither a grammar nor a
    budget); else a ThinkFirst."""
    if reasoning is None or (inner is None and reasoning.budget is None):
        return inner
    return ThinkFirst(reasoning, inner, tuple(end_ids))


class ThinkFirst:
    def __init__(self, reasoning, inner, end_ids: tuple[int, ...] = ()):
        self.reasoning, self.inner = reasoning, inner
        self.end_ids = end_ids  # never while a grammar waits for the answer: the thinking must close
        self.whole = getattr(inner, "whole_reply", False)

    @property
    def end_token(self) -> int | None:
        return self.inner.end_token if self.inner is not None else None

    def _answering(self) -> bool:
        if self.whole:
            return True
        r = self.reasoning
        return not r.thinking and not r.forcing and r.state not in ("header",)

    def mask(self, logits):
        forced = self.reasoning.forced()
        if forced is not None and self.whole:
            out = self.inner.mask(logits)
            return _only(logits, forced) if out[forced] > -np.inf else out  # (a call is required: no final)
        if forced is not None:
            return _only(logits, forced)
        if self.inner is None:
            return logits
        if not self._answering():  # thinking: anything but an end token
            return _without(logits, self.end_ids) if self.end_ids else logits
        out = self.inner.mask(logits)
        opener = self.reasoning.opener_id()  # the model may still open its thinking first
        if opener is not None and opener < logits.shape[-1]:
            out[opener] = logits[opener]
        return out

    def advance(self, token: int) -> None:
        if self.inner is None or not self._answering():
            return
        if token == self.reasoning.opener_id():
            return  # the thinking opens: the grammar waits for its end
        self.inner.advance(token)

    def is_done(self) -> bool:
        return self.inner is not None and self._answering() and self.inner.is_done()

    def is_accepting(self) -> bool:
        return self.inner is None or self.inner.is_accepting()

    @property
    def mean_s(self) -> float:
        return self.inner.mean_s if self.inner is not None else 0.0

    @property
    def first_s(self) -> float:
        return self.inner.first_s if self.inner is not None else 0.0


def _copy(logits):
    return logits.copy() if isinstance(logits, np.ndarray) else logits.clone()


def _only(logits, token: int):
    """Every logit -inf but `token`'s (0): the pick is that token whatever the sampling."""
    out = _copy(logits)
    out[...] = -np.inf
    out[token] = 0.0
    return out


def _without(logits, ids):
    out = _copy(logits)
    for i in ids:
        if i < out.shape[-1]:
            out[i] = -np.inf
    return out
