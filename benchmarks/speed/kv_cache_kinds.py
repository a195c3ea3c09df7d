"""KV cache kinds side by side: bytes at a context size, and decode tokens/s at several depths.

    python -m benchmarks.speed.kv_cache_kinds MODEL.gguf [--depths 0,2048,8192] [-n 32] [-r 3] [--threads 1]
        [--kinds static,int8,int4,offload] [--dtype auto]

Every kind gets its own cache, prefilled once per depth with the same tokens; then repetitions of
n decode steps run interleaved across kinds (each starts from the same depth: truncate, then step),
so machine noise hits them alike. Prints a markdown table: kind, cache bytes at the largest
depth's context, and median tokens/s per depth.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from llmcli.cache import new_cache
from llmcli.decode.prefill import prefill
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model

KINDS = {"static": (None, None), "bf16": ("bf16", None), "f16": ("f16", None), "int8": ("int8", None),
         "int4": ("int4", None), "offload": (None, 0), "offload-half": (None, "half")}


def make(kind: str, args, ctx: int, placement):
    kv_type, layers = KINDS[kind]
    if layers == "half":
        layers = args.num_hidden_layers // 2
    return new_cache(args, ctx, placement.device, placement.dtype, kv_type, layers)


@torch.inference_mode()
def decode(model, cache, depth: int, first: int, n: int) -> float:
    cache.truncate(depth)
    token = torch.tensor([[first]])
    t0 = time.perf_counter()
    for _ in range(n):
        token = model(token, cache, last_only=True)[0, -1].argmax().view(1, 1)
    int(token)
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--depths", default="0,2048,8192")
    p.add_argument("-n", type=int, default=32)
    p.add_argument("-r", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kinds", default="static,int8,int4,offload")
    a = p.parse_args()
    placement = place("cpu", a.dtype, a.threads)
    loaded = load_model(a.model, placement)
    model = loaded.model.fuse()
    depths = [int(d) for d in a.depths.split(",")]
    kinds = a.kinds.split(",")
    ctx = max(depths) + a.n + 1
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, loaded.args.vocab_size - 100, (max(depths) + 1,), generator=gen).tolist()
    caches = {k: make(k, loaded.args, ctx, placement) for k in kinds}
    speeds = {k: {} for k in kinds}
    for depth in depths:
        for k in kinds:
            caches[k].reset()
            if depth:
                prefill(model, tokens[:depth], caches[k], placement.device)
        samples = {k: [] for k in kinds}
        for _ in range(a.r):
            for k in kinds:
                samples[k].append(decode(model, caches[k], depth, tokens[depth], a.n))
        for k in kinds:
            speeds[k][depth] = statistics.median(samples[k])
            print(f"{k} depth {depth}: {', '.join(f'{s:.1f}' for s in samples[k])} t/s", flush=True)
    print(f"\n{placement.reason}; context {ctx}; {a.n} tokens per sample, median of {a.r}\n")
    print("| kind | cache MiB | " + " | ".join(f"t/s @ d{d}" for d in depths) + " |")
    print("|---|---:|" + "---:|" * len(depths))
    for k in kinds:
        print(f"| {k} | {caches[k].nbytes / 2**20:.1f} | " + " | ".join(f"{speeds[k][d]:.1f}" for d in depths) + " |")


if __name__ == "__main__":
    main()
