"""Throughput of `llmcli batch`'s engine: the same requests one at a time (rows 1) and decoded
together (rows N), interleaved over repetitions; greedy, at most a fixed token count per request.

    python -m benchmarks.serving.batch_throughput [MODEL] [--rows 1,4,8] [--requests 32] [--tokens 64] [-r 3]

Requests end at their end-of-sequence token or the token count, so a batch of N rows stays full only
while requests wait: with as many requests as rows (8 for 8, the default until 2026-11-25) it drains
as answers end, and the figure is the tail's as much as N rows'. Four times as many requests as rows
keep them full but for the last answers; the table's "mean batch" says how full it was (measured
means: docs/performance-choices.md).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from llmcli.decode.batched import Sequence
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.runtime.runtime import open_model

PROMPTS = ["Name a colour.", "What is the capital of France?", "Write a haiku about the sea.",
           "Explain what a CPU does.", "Give three fruits.", "Why is the sky blue?", "Say hello in French.",
           "What is 12 times 7?", "Describe a cat.", "List two planets.", "What does DNA stand for?",
           "Tell me a fun fact.", "What is rain?", "Name a famous painter.", "How do birds fly?", "What is tea?"]


def one_pass(rt, rows: int, prompts: list[list[int]], tokens: int) -> tuple[float, int, float]:
    """(seconds, tokens generated, mean rows per step) for all prompts through an engine of `rows`."""
    engine = rt.batch_engine(rows, max(len(p) for p in prompts) + tokens + 1)  # as `batch` and `serve` make it
    reqs = [Sequence(p, Request(SamplingParams(temperature=0), tokens)) for p in prompts]
    made = 0
    t0 = time.perf_counter()
    for _, chunk in engine.run(reqs):
        made += len([t for t in chunk.tokens if t not in rt.loaded.tokenizer.eos_ids])
    return time.perf_counter() - t0, made, engine.row_steps / max(1, engine.steps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2:135m")
    ap.add_argument("--rows", default="1,4,8")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("-t", "--threads", type=int, default=None)
    a = ap.parse_args()
    rt = open_model(a.model, dtype=a.dtype, threads=a.threads, ctx_size=2048)
    gc.freeze()  # as `llmcli batch` and `serve` do once their model is open (cli/startup.py)
    prompts = [rt.prompt_ids([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]) for i in range(a.requests)]
    rows = [int(r) for r in a.rows.split(",")]
    one_pass(rt, max(rows), prompts[:2], 4)  # warm-up
    rates: dict[int, list[float]] = {r: [] for r in rows}
    batch: dict[int, float] = {}
    for _ in range(a.repetitions):
        for r in rows:  # interleaved: the machine's noise falls on every setting alike
            s, n, batch[r] = one_pass(rt, r, prompts, a.tokens)
            rates[r].append(n / s)
    print(f"{rt.loaded.name} {rt.placement.dtype} threads={torch.get_num_threads()} requests={a.requests} "
          f"tokens={a.tokens} repetitions={a.repetitions}")
    print("| rows | mean batch | tokens/s (median) | vs rows 1 |")
    print("|---:|---:|---:|---:|")
    base = statistics.median(rates[rows[0]])
    for r in rows:
        m = statistics.median(rates[r])
        print(f"| {r} | {batch[r]:.1f} | {m:.1f} | {m / base:.2f}x |")


if __name__ == "__main__":
    main()
