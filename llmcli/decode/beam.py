"""Beam search: the most likely continuation among `beams` hypotheses kept at every step.

The semantics are transformers' `generate(num_beams=N, do_sample=False)` with its default
`early_stopping=False`, so that results can be checked against it:

- scores are summed log-probabilities; each step takes the best (1 + number of end ids) x N
  continuations over all beams x vocabulary;
- a continuation ending in an end id, or reaching the token limit, finishes a hypothesis if it is
  among the best N of that step; its score is sum / length ** length_penalty (length: generated
  tokens, the end id included); the best N finished hypotheses are kept;
- the N best unfinished continuations go on, the KV cache rows reordered to follow them;
- the search stops once N hypotheses are finished and the best running one, divided by its current
  length ** length_penalty, cannot beat the worst of them (transformers' heuristic), or at the limit.

The N beams run as one batch of N rows. Nothing can be shown before the search ends (the best
hypothesis is only known then), so `beam_stream` yields the winner's ids all at once at the end;
stop strings apply to its text as usual, but do not steer the search.
"""

from __future__ import annotations

import time
from typing import Iterator

import torch

from ..cache import new_cache
from ..cache.static import StaticKVCache
from ..errors import InvalidParameterError
from .picker import Stats
from .prefill import prefill
from .sampling import SamplingParams


@torch.inference_mode()
def beam_search(model, prompt: list[int], beams: int, max_new: int, eos_ids, device: torch.device,
                length_penalty: float = 1.0, cache: StaticKVCache | None = None) -> tuple[list[int], float, int, float]:
    """(best generated ids, its score, steps run, seconds spent prefilling). `cache`: a (beams, ...) static cache holding at
    least len(prompt) + max_new slots (default: one made here in the model's dtype)."""
    eos = set(int(e) for e in eos_ids)
    keep = max(2, 1 + len(eos)) * beams  # enough candidates that N of them are always unfinished
    if cache is None:
        dtype = model.model.norm.weight.dtype
        cache = new_cache(model.args, len(prompt) + max_new, device, dtype, batch=beams)
    t0 = time.perf_counter()
    cache.reset()
    first = cache.row(0)  # the prompt once, into row 0, then copied to every row
    logits = prefill(model, prompt, first, device)[None]  # (1, V)
    cache.length = first.length
    cache.reorder(torch.zeros(beams, dtype=torch.long, device=device))
    prefill_s = time.perf_counter() - t0
    vocab = logits.shape[-1]
    scores = torch.full((beams,), -1e9, device=device)  # only beam 0 is live at first: no duplicates
    scores[0] = 0.0
    running: list[list[int]] = [[] for _ in range(beams)]
    finished: list[tuple[float, list[int]]] = []  # (score, ids), best first, at most `beams`
    improvable = True
    steps = 0
    for step in range(max_new):
        steps = step + 1
        logp = torch.log_softmax(logits.float(), dim=-1) + scores[:logits.shape[0], None]  # (rows, V)
        top, idx = logp.reshape(-1).topk(min(keep, logp.numel()))
        src, tok = (idx // vocab).tolist(), (idx % vocab).tolist()
        top = top.tolist()
        n = step + 1  # generated tokens in each candidate
        done = [t in eos or n >= max_new for t in tok]
        if improvable:  # only the best `beams` candidates may finish a hypothesis
            for j in range(min(beams, len(tok))):
                if done[j]:
                    finished.append((top[j] / n ** length_penalty, running[src[j]] + [tok[j]]))
            finished = sorted(finished, key=lambda f: -f[0])[:beams]
        live = [j for j in range(len(tok)) if not done[j]][:beams]
        if not live:
            break
        running = [running[src[j]] + [tok[j]] for j in live]
        scores = torch.tensor([top[j] for j in live], device=device)
        if len(finished) == beams:  # can the best running beam still beat the worst finished one?
            improvable = improvable and top[live[0]] / n ** length_penalty > finished[-1][0]
        if not improvable:
            break
        cache.reorder(torch.tensor([src[j] for j in live], dtype=torch.long, device=device))
        out = model(torch.tensor([[tok[j]] for j in live], dtype=torch.long, device=device), cache, last_only=True)
        logits = out[:, -1]  # (beams, V)
    score, ids = finished[0]
    return ids, score, steps, prefill_s


def beam_stream(model, prompt: list[int], cache, params: SamplingParams, max_new: int, device: torch.device,
                stats: Stats, step=None, shift=None, *, beams: int, length_penalty: float = 1.0,
                eos_ids=()) -> Iterator[int]:
    """generate()'s token stream for a request with beams > 1: the beam search's best ids, yielded at the end.

    The sampling parameters do not apply (the search is deterministic); `cache` (batch 1) is left
    empty: the search needs its own cache of `beams` rows."""
    if shift is not None:
        raise InvalidParameterError("--context-shift does not work with --beams")
    t0 = time.perf_counter()
    ids, score, steps, stats.prefill_s = beam_search(model, prompt, beams, max_new, eos_ids, device, length_penalty)
    cache.reset()
    cache.token_ids = []
    stats.ttft_s = time.perf_counter() - t0  # nothing can be shown before the search ends
    stats.decode_s = stats.ttft_s - stats.prefill_s  # the search's steps: `beams` tokens each
    stats.extra.update({"beams": beams, "beam_steps": steps, "beam_score": round(score, 4)})
    for i, token in enumerate(ids):
        stats.completion_tokens = i + 1
        yield token

