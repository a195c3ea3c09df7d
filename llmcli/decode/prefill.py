"""Running a prompt into a cache: what every way of decoding does first (generate.py, batched.py,
speculative.py, beam.py), so that a prompt's first logits do not depend on which of them decodes it."""

from __future__ import annotations

import torch

PREFILL_CHUNK = 512  # tokens per forward pass when prefilling long prompts (bounds activation memory)


def prefill_runner(model, step):
    """What prefills a prompt: the native decode step where `step` is one (several hundred tokens a
    call, each weight read once for all of them: faster than the model's own prefill on the CPU), else
    the model."""
    return step if getattr(step, "native", False) else model


@torch.inference_mode()
def prefill(model, ids: list[int], cache, device: torch.device, chunk: int | None = None, hidden: bool = False):
    """Run `ids` into the cache (after what it holds); logits (V,) of the last one (and with
    `hidden`, its final hidden state (H,))."""
    chunk = chunk or PREFILL_CHUNK
    out = None
    for i in range(0, len(ids), chunk):
        piece = torch.tensor([ids[i:i + chunk]], dtype=torch.long, device=device)
        out = model(piece, cache, last_only=True, hidden=hidden)
    return (out[0][0, -1], out[1][0, -1]) if hidden else out[0, -1]
