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

from ..cache import new_cache
from ..errors import InvalidParameterError


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
        # 6 significant digits: a fine path's KL divergence is 1e-7, which 6 decimals would call 0
        return {k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in asdict(self).items()}


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
    cache = new_cache(args, len(window), device, dtype)
    logits = model(torch.tensor([window], device=device), cache)[0]
    first = len(window) // 2
    return torch.log_softmax(logits[first:-1].float(), dim=-1)


class Scores:
    """Running totals for one model over scored positions, and against a reference when given."""

    def __init__(self):
        self.nll, self.nll_ref, self.klds, self.same, self.count = 0.0, 0.0, [], 0, 0

    def add(self, logp: torch.Tensor, targets: torch.Tensor, ref: torch.Tensor | None = None) -> None:
        """logp, ref: (positions, vocab) log-probabilities; targets: (positions,) the next tokens."""
        self.nll -= float(logp.gather(1, targets[:, None]).sum())
        self.count += len(targets)
        if ref is not None:
            self.nll_ref -= float(ref.gather(1, targets[:, None]).sum())
            self.klds.append((ref.exp() * (ref - logp)).sum(-1).clamp_min(0))  # KL(reference || model)
            self.same += int((ref.argmax(-1) == logp.argmax(-1)).sum())

    def result(self, windows: int, ctx: int, seconds: float) -> PerplexityResult:
        result = PerplexityResult(math.exp(self.nll / self.count), windows, ctx, self.count, seconds)
        if self.klds:
            kld = torch.cat(self.klds).double()
            result.ppl_reference = math.exp(self.nll_ref / self.count)
            result.ppl_ratio = result.ppl / result.ppl_reference
            result.kld_mean = float(kld.mean())
            result.kld_p99 = float(torch.quantile(kld, 0.99))
            result.kld_max = float(kld.max())
            result.same_top = self.same / self.count
        return result


def text_windows(loaded, text: str, ctx: int, chunks: int | None) -> list[list[int]]:
    """The text tokenized as llama.cpp does (BOS first where the model wants one), in windows."""
    if ctx < 4:
        raise InvalidParameterError(f"--ctx-size must be at least 4 for perplexity, got {ctx}")
    if chunks is not None and chunks < 1:
        raise InvalidParameterError(f"--chunks must be at least 1, got {chunks}")
    tok = loaded.tokenizer
    return windows(tok.encode(text), ctx, chunks, tok.bos_id if tok.add_bos else None)


def logprobs(loaded, window: list[int]) -> torch.Tensor:
    """The scored positions' log-probabilities, from the step `run` takes with the same flags: the
    torch-free native step's prefill (runtime/lean.py: int8 activations as it chooses them), else the
    torch model's forward."""
    if getattr(loaded.model, "torch_free", False):  # (the last token is only a target: not run)
        logits = loaded.model.window_logits(window[:-1], len(window) // 2)
        return torch.log_softmax(torch.from_numpy(logits), dim=-1)
    p = loaded.placement
    return scored_logprobs(loaded.model, loaded.args, window, p.device, p.dtype).cpu()


def evaluate(loaded, text: str, ctx: int, chunks: int | None = None, reference=None,
             progress: Callable[[int, int], None] | None = None) -> PerplexityResult:
    """`loaded` and `reference` are LoadedModels (the reference shares the tokenizer's vocabulary)."""
    if reference is not None and reference.args.vocab_size != loaded.args.vocab_size:
        raise InvalidParameterError(f"the reference has a vocabulary of {reference.args.vocab_size} tokens and the "
                                    f"model {loaded.args.vocab_size}; compare two versions of the same model")
    todo = text_windows(loaded, text, ctx, chunks)
    t0 = time.perf_counter()
    scores = Scores()
    for i, w in enumerate(todo):
        ref = None if reference is None else logprobs(reference, w)
        scores.add(logprobs(loaded, w), torch.tensor(w[ctx // 2 + 1:]), ref)
        if progress:
            progress(i + 1, len(todo))
    return scores.result(len(todo), ctx, time.perf_counter() - t0)
