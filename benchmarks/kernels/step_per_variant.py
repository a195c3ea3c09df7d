"""The C++ decode step on each kernel variant this CPU runs, interleaved in one process (this
machine is too noisy to compare separate runs): ms per token of the step's C call, after a 64-token
prefill, greedy tokens fed back.

    python -m benchmarks.kernels.step_per_variant MODEL [--threads 2] [--tokens 32] [--reps 7] [--variants avx512vnni,avx2]

The model loads with float32 activations and its blocks as stored, which the step needs, also on
CPUs where --dtype auto picks bfloat16. Prints each variant's median and range, and the ratios of
medians to the last variant named.
"""
import argparse
import statistics
import time

import torch

from llmcli import native

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--tokens", type=int, default=32)
ap.add_argument("--reps", type=int, default=7)
ap.add_argument("--variants", help="comma-separated (default: every variant this CPU runs)")
a = ap.parse_args()

from llmcli.decode.prefill import prefill  # noqa: E402
from llmcli.runtime.native_step import NativeStep  # noqa: E402
from llmcli.runtime.runtime import open_model  # noqa: E402

names = a.variants.split(",") if a.variants else native.variants()
rt = open_model(a.model, threads=a.threads, ctx_size=512)
model = rt.loaded.model
cache = rt.new_cache()
steps = {}
for name in names:  # each step's C side is built while its variant is the active one
    native._module = native.load(name)
    steps[name] = step = NativeStep(model, threads=a.threads)
    step._native, step._cache = step._build(cache), cache
with torch.inference_mode():
    first = prefill(model, list(range(100, 164)), cache, rt.placement.device).argmax().view(1, 1)
    times = {name: [] for name in names}
    for rep in range(a.reps + 1):  # the first round warms up
        for name, step in steps.items():
            cache.length, tok = 64, first
            t = time.perf_counter()
            for _ in range(a.tokens):
                tok = step(tok, cache, last_only=True)[0, -1].argmax().view(1, 1)
            if rep:
                times[name].append((time.perf_counter() - t) / a.tokens * 1e3)
print(f"{a.model}: {a.threads} threads, {a.tokens} tokens x {a.reps} interleaved; ms/token (median, min-max)")
base = statistics.median(times[names[-1]])
for name in names:
    m = statistics.median(times[name])
    print(f"{name:>11}: {m:6.2f} ({min(times[name]):.2f}-{max(times[name]):.2f})  {1000 / m:6.1f} t/s  "
          f"{base / m:.2f}x {names[-1]}")
