"""Which activations of the native step to make int8x2 (16-bit codes as two int8 rows: ~15 bits) rather than
llama.cpp's int8: what each choice gains in quality against full precision, and what it costs decode.

    python -m benchmarks.quality.activation_sites FILE.gguf --file TEXT [--ctx 512] [--chunks 8]
        [--masks 0,1,2,4,8,7,15] [--tokens 64] [--rounds 3]

The mask is native/step.py's REFINE: 1 the layers' norms' outputs (q/k/v, gate/up), 2 the
attention's (o), 4 the MLP's (down), 8 the final norm's (the head); 0 is llama.cpp's int8 everywhere.
Per mask: mean KL divergence, p99 and same top token of the torch-free step's prefill (what `perplexity` and `run` take) against the
file dequantized to float32 (`--reference f32`), over windows of --ctx scored on their second half;
then decode tokens a second of the same step, the masks interleaved over --rounds, medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from llmcli.bench.perplexity import Scores, logprobs, text_windows
from llmcli.runtime.flags import ModelFlags
from llmcli.runtime.lean import open_lean
from llmcli.runtime.runtime import open_model


def decode_tps(model, mask: int, tokens: int) -> float:
    model.refined = mask
    cache = model.new_cache(tokens + 8)
    model([1, 2, 3], cache)
    t0 = time.perf_counter()
    tok = 4
    for _ in range(tokens):
        logits, _, _ = model([tok], cache)
        tok = int(np.argmax(logits[0]))
    return tokens / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--file", required=True)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--masks", default="0,1,2,4,8,7,15")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    masks = [int(m) for m in a.masks.split(",")]
    flags = ModelFlags(a.model, threads=a.threads, ctx_size=a.ctx)
    rt = open_lean(flags)
    ref = open_model(ModelFlags(a.model, threads=a.threads, ctx_size=a.ctx, quant="f32", dtype="float32"))
    text = Path(a.file).read_text(encoding="utf-8")
    todo = text_windows(rt.loaded, text, a.ctx, a.chunks)
    scores = {m: Scores() for m in masks}
    for w in todo:
        r = logprobs(ref.loaded, w)
        for m in masks:
            rt.loaded.model.refined = m
            scores[m].add(logprobs(rt.loaded, w), torch.tensor(w[a.ctx // 2 + 1:]), r)
    speeds = {m: [] for m in masks}
    for _ in range(a.rounds):
        for m in masks:
            speeds[m].append(decode_tps(rt.loaded.model, m, a.tokens))
    print(f"{Path(a.model).name}: {len(todo)} windows of {a.ctx}, {a.threads} threads")
    print("| mask | KLD mean | KLD p99 | same top | PPL ratio | decode t/s (median) |")
    print("|---|---|---|---|---|---|")
    for m in masks:
        r = scores[m].result(len(todo), a.ctx, 0.0)
        print(f"| {m} | {r.kld_mean:.5f} | {r.kld_p99:.5f} | {100 * r.same_top:.2f} % | {r.ppl_ratio:.4f} | "
              f"{statistics.median(speeds[m]):.1f} |")


if __name__ == "__main__":
    main()
