"""Perplexity over a text, and KL divergence to a reference model, scored as llama.cpp's
`llama-perplexity --kl-divergence` does.

The text is tokenized once and cut into windows of `ctx` tokens (the first token of each is BOS
when the tokenizer adds one); every window is evaluated from an empty cache and scored on its
second half only, so each scored token sees at least ctx/2 tokens of context. With a reference,
each scored position also gives KL(reference || model) and whether both rank the same token first.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from .errors import InvalidParameterError
from .kv_cache import StaticKVCache


@dataclass
class PerplexityResult:
    ppl: float
    windows: int
    ctx_size: int
    scored_tokens: int
    seconds: float
    ppl_reference: float | None = None
    ppl_ratio: float | None = None
    kld_mean: float | None = None
    kld_p99: float | None = None
    kld_max: float | None = None
    same_top: float | None = None  # share of scored positions where both pick the same top token

    def as_dict(self) -> dict:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def windows(ids: list[int], ctx: int, chunks: int | None, bos_id: int | None) -> list[list[int]]:
    """The first `chunks` whole windows of `ctx` tokens (all of them when chunks is None)."""
    n = len(ids) // ctx
    if n == 0:
        raise InvalidParameterError(f"the text is {len(ids)} tokens, fewer than one window of --ctx-size {ctx}; "
                                    "use a longer file or a smaller --ctx-size")
    n = n if chunks is None else min(n, chunks)
    out = []
    for i in range(n):
        w = ids[i * ctx:(i + 1) * ctx]
        if bos_id is not None:
            w = [bos_id] + w[1:]
        out.append(w)
    return out


@torch.inference_mode()
def scored_logprobs(model, args, window: list[int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Log-probabilities (ctx - 1 - ctx//2, vocab) float32 at positions ctx//2 .. ctx-2."""
    cache = StaticKVCache.for_model(args, len(window), device, dtype)
    logits = model(torch.tensor([window], device=device), cache)[0]
    first = len(window) // 2
    return torch.log_softmax(logits[first:-1].float(), dim=-1)


def evaluate(loaded, text: str, ctx: int, chunks: int | None = None, reference=None,
             progress: Callable[[int, int], None] | None = None) -> PerplexityResult:
    """`loaded` and `reference` are LoadedModels (the reference shares the tokenizer's vocabulary)."""
    if ctx < 4:
        raise InvalidParameterError(f"--ctx-size must be at least 4 for perplexity, got {ctx}")
    if chunks is not None and chunks < 1:
        raise InvalidParameterError(f"--chunks must be at least 1, got {chunks}")
    tok = loaded.tokenizer
    if reference is not None and reference.args.vocab_size != loaded.args.vocab_size:
        raise InvalidParameterError(f"the reference has a vocabulary of {reference.args.vocab_size} tokens and the "
                                    f"model {loaded.args.vocab_size}; compare two versions of the same model")
    ids = tok.encode(text)  # with BOS where the model wants one, as llama.cpp tokenizes
    bos = tok.bos_id if tok.add_bos else None
    todo = windows(ids, ctx, chunks, bos)
    t0 = time.perf_counter()
    nll, nll_ref, klds, same, scored = 0.0, 0.0, [], 0, 0
    for i, w in enumerate(todo):
        targets = torch.tensor(w[ctx // 2 + 1:])
        logp = scored_logprobs(loaded.model, loaded.args, w, loaded.placement.device, loaded.placement.dtype).cpu()
        nll -= float(logp.gather(1, targets[:, None]).sum())
        scored += len(targets)
        if reference is not None:
            ref = scored_logprobs(reference.model, reference.args, w, reference.placement.device,
                                  reference.placement.dtype).cpu()
            nll_ref -= float(ref.gather(1, targets[:, None]).sum())
            klds.append((ref.exp() * (ref - logp)).sum(-1).clamp_min(0))
            same += int((ref.argmax(-1) == logp.argmax(-1)).sum())
        if progress:
            progress(i + 1, len(todo))
    result = PerplexityResult(math.exp(nll / scored), len(todo), ctx, scored, time.perf_counter() - t0)
    if reference is not None:
        kld = torch.cat(klds).double()
        result.ppl_reference = math.exp(nll_ref / scored)
        result.ppl_ratio = result.ppl / result.ppl_reference
        result.kld_mean = float(kld.mean())
        result.kld_p99 = float(torch.quantile(kld, 0.99))
        result.kld_max = float(kld.max())
        result.same_top = same / scored
    return result
