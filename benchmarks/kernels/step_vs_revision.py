"""The whole decode step of a git revision's kernels against the working tree's, one variant, on one
GGUF model, interleaved in one process (this machine is too noisy to compare separate runs): what a
kernel change gives a decode token, memory traffic and all, where blocks_vs_revision.py times the
products alone.

    python -m benchmarks.kernels.step_vs_revision MODEL [--rev HEAD] [--variant avx2] [--threads 1] [--tokens 16] [--reps 5]
        [--refined REV,TREE]   (activation precision masks, native/step.py's REFINE_*: e.g. 0,15 for the
                               revision's int8 against the tree's int8x2; default: each the file's default)

Both sides are the torch-free path's LeanModel (runtime/lean_step.py) on the same interleaved
weights (the layout must not differ between the two revisions). Times are CPU seconds of the process
with one thread (a busy machine's descheduling left out), wall seconds with more. Prints each side's
median and best tokens a second and the ratio of medians.
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # (as the CLI sets it: numpy's BLAS threads spun beside the step's)
from pathlib import Path

from llmcli import native
from llmcli.formats.open import open_model_file
from llmcli.runtime.lean_step import LeanModel

from .revision import kernels_at

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--rev", default="HEAD")
ap.add_argument("--variant", help="default: the one this CPU picks")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--tokens", type=int, default=16)
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--refined", help="REV,TREE activation masks (default: the file's)")
a = ap.parse_args()

variant = a.variant or native.variants()[0]
kernels = {a.rev: kernels_at(a.rev, variant)}
kernels["tree"] = native.load(variant)
clock = time.process_time if a.threads == 1 else time.perf_counter
model_file = open_model_file(Path(a.model).expanduser())
models = {name: LeanModel.open(model_file, a.threads, k) for name, k in kernels.items()}
if a.refined:
    for m, mask in zip(models.values(), a.refined.split(",")):
        if mask:  # (empty: the file's default)
            m.refined = int(mask)
caches = {name: m.new_cache(512) for name, m in models.items()}
for name, m in models.items():
    m(list(range(100, 116)), caches[name])
rates = {name: [] for name in models}
for rep in range(a.reps + 1):  # the first round warms up
    for name, m in models.items():
        cache = caches[name]
        cache.length = 16
        t = clock()
        for i in range(a.tokens):
            m([200 + i], cache)
        if rep:
            rates[name].append(a.tokens / (clock() - t))
print(f"{a.model}: {variant}, {a.threads} threads, {a.tokens} tokens x {a.reps} interleaved ({clock.__name__}), "
      f"refined masks {a.rev} {models[a.rev].refined}, tree {models['tree'].refined}")
for name, r in rates.items():
    print(f"{name:>8}: {statistics.median(r):8.2f} t/s median, {max(r):8.2f} best")
print(f"tree / {a.rev}: {statistics.median(rates['tree']) / statistics.median(rates[a.rev]):.3f}x")
