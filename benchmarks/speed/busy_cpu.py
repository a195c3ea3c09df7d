"""Decoding beside another busy program: the C++ step's tokens a second with -t 1 and -t 2, each
without and with a CPU-bound process pinned to the last CPU (a browser or a build beside llmcli).
Rounds interleave the four cases; medians of the rounds.

    python -m benchmarks.speed.busy_cpu MODEL [--tokens 64] [--rounds 5]

The model loads with float32 activations and its blocks as stored, which the step needs, also on
CPUs where --dtype auto picks bfloat16. Uses only open_model and decode_step, so it runs against
older trees too (PYTHONPATH=...) for a before/after.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch


ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--tokens", type=int, default=64)
ap.add_argument("--rounds", type=int, default=5)
a = ap.parse_args()

from llmcli.decode.prefill import prefill  # noqa: E402
from llmcli.runtime.runtime import open_model  # noqa: E402

cpus = sorted(os.sched_getaffinity(0))
runtimes, steps = {}, {}
for t in (1, 2):  # each step right after its open_model, which set torch's thread count the step takes
    runtimes[t] = open_model(a.model, threads=t, ctx_size=512)
    steps[t] = runtimes[t].decode_step(False)
assert all(getattr(s, "native", False) for s in steps.values()), "no native step for this model here"


def tokens_a_second(t: int) -> float:
    torch.set_num_threads(t)
    rt, step = runtimes[t], steps[t]
    cache = rt.new_cache()
    with torch.inference_mode():
        tok = prefill(rt.loaded.model, list(range(100, 116)), cache, rt.placement.device).argmax().view(1, 1)
        start = time.perf_counter()
        for _ in range(a.tokens):
            tok = step(tok, cache, last_only=True)[0, -1].argmax().view(1, 1)
    return a.tokens / (time.perf_counter() - start)


results = {}
for _ in range(a.rounds):
    for busy in (False, True):
        hog = None
        if busy:  # a CPU-bound process on the last CPU
            hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpus[-1]}}})\nwhile 1: pass"])
            time.sleep(0.3)
        try:
            for t in (1, 2):
                results.setdefault((t, busy), []).append(tokens_a_second(t))
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
print(f"{a.model}: {a.tokens} tokens, {a.rounds} rounds, tokens/s (median, min-max)")
for (t, busy), v in sorted(results.items()):
    print(f"  -t {t} {'with a busy CPU' if busy else 'alone          '}: {statistics.median(v):6.1f} ({min(v):.1f}-{max(v):.1f})")
