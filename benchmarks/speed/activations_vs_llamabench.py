"""What int8x2 activations cost decode, as a ratio to llama.cpp's: llmcli's torch-free step under
each REFINE mask (native/step.py) and `llama-bench -n N` on the same file, interleaved round by round.

    python -m benchmarks.speed.activations_vs_llamabench FILE.gguf --llama-bench $LLAMA_CPP/build/bin/llama-bench
        [--masks 0,7,15] [-n 64] [--rounds 5] [-t 2]

Each round: one `llama-bench -p 0 -n N -r 1` (a process of its own), then N greedy one-token steps of
llmcli's step for each mask, in-process (the model loaded once; a step's time as `run` decodes,
less the sampler's microseconds). Printed per mask: median t/s, and the median of the rounds' ratios
llmcli / llama-bench (a round's two figures saw the same load: on a shared machine the ratio of a
round is steadier than either figure).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import numpy as np

from llmcli.runtime.flags import ModelFlags
from llmcli.runtime.lean import open_lean


def llmcli_tps(model, mask: int, n: int) -> float:
    model.refined = mask
    cache = model.new_cache(n + 16)
    logits, _, _ = model([1, 2, 3, 4], cache)  # (a prompt: the step for this cache built, then timed steps)
    tok = int(np.argmax(logits[0]))
    t0 = time.perf_counter()
    for _ in range(n):
        logits, _, _ = model([tok], cache)
        tok = int(np.argmax(logits[0]))
    return n / (time.perf_counter() - t0)


def llama_bench_tps(binary: str, path: str, n: int, threads: int) -> float:
    r = subprocess.run([binary, "-m", path, "-p", "0", "-n", str(n), "-r", "1", "-t", str(threads), "-o", "json"],
                       capture_output=True, text=True, check=True)
    return float(json.loads(r.stdout)[0]["avg_ts"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--llama-bench", required=True)
    p.add_argument("--masks", default="0,7,15")
    p.add_argument("-n", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("-t", "--threads", type=int, default=2)
    a = p.parse_args()
    masks = [int(m) for m in a.masks.split(",")]
    rt = open_lean(ModelFlags(a.model, threads=a.threads, ctx_size=a.n + 64))
    model = rt.loaded.model
    ours, theirs = {m: [] for m in masks}, []
    for _ in range(a.rounds):
        theirs.append(llama_bench_tps(a.llama_bench, a.model, a.n, a.threads))
        for m in masks:
            ours[m].append(llmcli_tps(model, m, a.n))
    print(f"{a.model}: tg{a.n}, {a.threads} threads, {a.rounds} rounds; llama-bench median "
          f"{statistics.median(theirs):.1f} t/s")
    print("| mask | llmcli t/s (median) | ratio to llama-bench (median of rounds) |")
    print("|---|---|---|")
    for m in masks:
        ratio = statistics.median(o / t for o, t in zip(ours[m], theirs))
        print(f"| {m} | {statistics.median(ours[m]):.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
