"""Context shift two ways: re-rotating the cached keys vs re-prefilling the kept tokens.

    python -m benchmarks.speed.shift_rotate_vs_prefill MODEL.gguf TEXT_FILE [--ctx 2048,8192] [--keep 64] [--threads 1]

For each context size: fill a cache with the text's first ctx tokens, then make room as
context_shift.ContextShift does (keep the first `keep`, drop half of the rest) in both ways:

    rotate      cache.shift(): move the newer half down, keys re-rotated by -drop positions
    re-prefill  truncate to `keep` and prefill the newer half again at its new positions, which
                is exactly a fresh prefill of the shortened text

Prints the time of each, and how far the rotated cache's next 32 teacher-forced logits are from the
re-prefilled one's (max |Δlogit|, mean KL, argmax agreement): the rotated cache keeps what the moved
tokens saw of the dropped ones, a fresh prefill does not.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from llmcli.cache.context_shift import rerotation
from llmcli.cache import new_cache
from llmcli.decode.prefill import prefill
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model

CPU = torch.device("cpu")


@torch.inference_mode()
def next_logits(model, cache, tokens) -> torch.Tensor:
    out = []
    for t in tokens:
        out.append(model(torch.tensor([[t]]), cache, last_only=True)[0, -1])
    return torch.stack(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("text")
    p.add_argument("--ctx", default="2048,8192")
    p.add_argument("--keep", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kv-type", default=None)
    a = p.parse_args()
    placement = place("cpu", "auto", a.threads)
    loaded = load_model(a.model, placement)
    model = loaded.model.fuse()
    ids = loaded.tokenizer.encode(Path(a.text).read_text(encoding="utf-8")[:400_000])
    rerotate = rerotation(model.inv_freq)
    print(f"{placement.reason}; kv-type {a.kv_type or 'compute dtype'}; keep {a.keep}\n")
    print("| context | dropped | rotate ms | re-prefill ms | max abs Δlogit | mean KL | argmax agree |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for ctx in (int(c) for c in a.ctx.split(",")):
        drop = (ctx - a.keep) // 2
        after = ids[ctx:ctx + 32]
        rotated = new_cache(loaded.args, ctx, CPU, placement.dtype, a.kv_type)
        prefilled = new_cache(loaded.args, ctx, CPU, placement.dtype, a.kv_type)
        with torch.inference_mode():
            for cache in (rotated, prefilled):
                prefill(model, ids[:ctx], cache, CPU)
            t0 = time.perf_counter()
            rotated.shift(a.keep, drop, rerotate)
            t_rotate = time.perf_counter() - t0
            t0 = time.perf_counter()
            prefilled.truncate(a.keep)
            prefill(model, ids[a.keep + drop:ctx], prefilled, CPU)
            t_prefill = time.perf_counter() - t0
        x, y = next_logits(model, rotated, after), next_logits(model, prefilled, after)
        lp, lq = torch.log_softmax(y.float(), -1), torch.log_softmax(x.float(), -1)
        kl = (lp.exp() * (lp - lq)).sum(-1).mean().item()
        agree = (x.argmax(-1) == y.argmax(-1)).float().mean().item()
        print(f"| {ctx} | {drop} | {t_rotate * 1000:.1f} | {t_prefill * 1000:.0f} | {(x - y).abs().max().item():.3f} "
              f"| {kl:.4f} | {agree:.2f} |", flush=True)


if __name__ == "__main__":
    main()
