"""The choice of each token of one sequence, in one place for every way of decoding.

A Picker belongs to one sequence. Given the logits (V,) of its next position (and, for greedy
decoding, the final hidden state (H,)), it rescores near ties in float32, applies the penalties over
the sequence's own history, masks what a grammar forbids, samples with the sequence's seeded
generator, records the token's log-probabilities and keeps the timing stats. generate.py,
batched.py and speculative.py all pick through it, so their tokens are the same for the same logits.
Beam search is the exception: it ranks every beam's continuations together (beam.py).
"""

from __future__ import annotations

import time
import torch

from .sampling_plain import RESCORED, near_tie, wanted_top
from .stream import Logprobs, Stats  # noqa: F401 (re-exported)
from .sampling import SamplingParams, make_generator, penalty_history, sample, token_logprobs, top_k


def rescore_near_ties(head, logits: torch.Tensor, h: torch.Tensor, top=None) -> torch.Tensor:
    """Logits (V,) with the best candidates recomputed in float32 when the top two are nearly tied.

    Half-precision kernels give logits 8 significant bits: near 20 they are 0.125 apart, so near-ties
    become ties and greedy decoding would turn on rounding (on SmolLM2 q4, one step in ~50), and on
    which kernels ran (eager or compiled). Rescoring from the head's weight rows and the hidden state
    `h` (H,) costs a few dot products, only then (GGUF blocks: one C call, float64 sums). A quantized head rounds too, whatever the compute
    dtype: its kernels take bfloat16 activations (a float32 model on a CPU without native bf16).
    The candidates are written into `logits` in place: a copy of a vocabulary's logits started
    torch's OpenMP threads, which then spun beside a batch's decode step (native_step.py's _rope).
    `top`: the values and indices (lists) of the largest logits, where the step found them."""
    if not rescores(head, h) or logits.shape[-1] < 2:
        return logits
    k = min(RESCORED, logits.shape[-1])
    if top is not None and len(top[1]) >= k:  # (another pass over the logits was a third of the rescoring)
        values, indices = top[0][:2], torch.tensor(top[1][:k])
    else:
        values, indices = top_k(logits, k)
        values = values[:2].tolist()
    if not near_tie(*values):
        return logits
    into = getattr(head, "weight_dot_into", None)  # (GGUF blocks: one C call, in place)
    if into is not None and logits.is_contiguous() and into(indices, h, logits):
        return logits
    rows = head.weight_rows(indices, torch.float32)
    if rows is None:
        return logits
    return logits.index_put_((indices,), (rows @ h.float()).to(logits.dtype))


def rescores(head, h) -> bool:
    """Whether rescore_near_ties can recompute candidates: the head's logits round (half-precision
    or quantized weights) and it has weight rows to recompute them from."""
    exact = h.dtype == torch.float32 and getattr(getattr(head, "weight", None), "dtype", None) == torch.float32
    return not exact and getattr(head, "bias", None) is None and hasattr(head, "weight_rows")


class Picker:
    """Chooses the tokens of one sequence. `head`: the model's output layer (for rescoring near
    ties); `constraint` (constrained.TokenConstraint) masks the logits; `logprobs` records each pick."""

    def __init__(self, params: SamplingParams, prompt: list[int], device: torch.device, *, head=None,
                 constraint=None, logprobs: Logprobs | None = None, stats: Stats | None = None):
        self.params, self.device, self.head = params, device, head
        self.constraint, self.logprobs = constraint, logprobs
        self.stats = stats if stats is not None else Stats(prompt_tokens=len(prompt))
        self.generator, self.stats.seed = make_generator(params.seed, device)
        self.history = list(prompt)  # what the penalties look back over
        self.t0 = time.perf_counter()  # the first pick ends the prefill; later ones are decode
        self.rescores: bool | None = None  # rescores(head, h), known at the first greedy pick

    @property
    def wants_hidden(self) -> bool:
        """Greedy picks rescore near ties from the final hidden state: the model must return it."""
        return self.params.greedy

    @property
    def wants_top(self) -> int:
        """The k largest logits a pick can take from the decode step instead of looking at all of
        them (NativeStep's top=k): 0 where it looks at all (a grammar, penalties, top-k off)."""
        return wanted_top(self.params, self.constraint is not None)

    def pick(self, logits: torch.Tensor, h: torch.Tensor | None = None, top=None) -> int:
        """The next token for logits (V,); `h` (H,) the hidden state they came from (greedy); `top`:
        the values and indices (lists) of the k largest logits, largest first, where the step found
        them (the same token as without)."""
        if self.params.greedy and h is not None:
            if self.rescores is None:
                self.rescores = rescores(self.head, h)
            if self.rescores and (top is None or len(top[1]) < 2 or near_tie(top[0][0], top[0][1])):
                logits, top = rescore_near_ties(self.head, logits, h, top), None  # (a near tie: argmax the rescored)
        if self.constraint is not None:
            top = None
        allowed = self.constraint.mask(logits) if self.constraint is not None else logits
        token = sample(allowed, penalty_history(self.history, self.params, self.device), self.params, self.generator,
                       top)
        if self.logprobs is not None:
            self.logprobs.add(token, *token_logprobs(logits, token, self.logprobs.top))
        if self.constraint is not None:
            self.constraint.advance(token)
        self.history.append(token)
        self.stats.count_token(self.t0)
        return token

    @property
    def grammar_done(self) -> bool:
        """The grammar is complete: its end token is the only continuation (not counted as generated)."""
        return self.constraint is not None and self.constraint.is_done()
