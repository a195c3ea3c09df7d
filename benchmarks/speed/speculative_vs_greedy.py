"""Speculative decoding and beam search against plain greedy decoding, interleaved.

    python -m benchmarks.speed.speculative_vs_greedy MODEL [--draft MODEL] [--quant bf16] [--dtype auto] [--draft-quant PRESET]
        [-n 128] [-r 3] [--threads 2] [--ks 4,8] [--lookup-ks 10] [--prompts story,code] [--beams 0]

Loads MODEL (with --quant) as the target and --draft (default: MODEL as stored, e.g. its q4
blocks) as the draft, then for each prompt runs, in turn and -r times: plain greedy, the draft with
each K of --ks, and prompt lookup. Each run generates -n tokens (or until an end token) through
generate(), the path `llmcli run` takes. Prints a markdown table of median tokens/s over the whole
answer (prefill excluded), the speedup over greedy, the acceptance rate, and whether the tokens
equal greedy's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from llmcli.decode import speculative
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.runtime.runtime import open_model

CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def describe(items):
    lines = []
    for item in items:
        lines.append(f"{item.name}: {item.quantity} x {item.price}")
    return "\\n".join(lines)
'''
PROMPTS = {
    "story": "Tell me a short story about a robot who learns to paint.",
    "code": f"Rewrite this code with `items` renamed to `products`. Reply with the code only.\n\n{CODE}",
}


def run_once(rt, ids, request, step, draft=None):
    t0 = time.perf_counter()
    chunks = list(rt.generate(ids, request, rt.new_cache(), step, draft=draft))
    total = time.perf_counter() - t0
    stats = chunks[-1].stats
    tokens = [t for c in chunks for t in c.tokens]
    return tokens, stats.completion_tokens / (total - stats.prefill_s), stats.extra


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--draft")
    ap.add_argument("--quant", default=None, help="the target's preset (default: as stored, as `run` loads it)")
    ap.add_argument("--draft-quant")
    ap.add_argument("--dtype", default="auto", help="the target's compute dtype (float32: the same tokens as greedy)")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ks", default="4,8")
    ap.add_argument("--lookup-ks", default=str(speculative.LOOKUP_TOKENS), help="guesses a lookup pass, e.g. 3,10")
    ap.add_argument("--prompts", default=",".join(PROMPTS))
    ap.add_argument("--beams", type=int, default=0, help="also time beam search with this many beams")
    a = ap.parse_args()
    rt = open_model(a.model, device="cpu", threads=a.threads, ctx_size=1024, quant=a.quant, dtype=a.dtype)
    draft = open_model(a.draft or a.model, device="cpu", threads=a.threads, ctx_size=1024, quant=a.draft_quant)
    step, draft_step = rt.decode_step(False), draft.decode_step(False)  # the steps `run` takes (Runtime.draft's)
    torch.set_num_threads(a.threads)
    print(f"target {rt.loaded.name} --quant {a.quant}; draft {draft.loaded.name} ({draft.loaded.weights_type}, "
          f"--draft-quant {a.draft_quant}); {a.threads} threads, -n {a.n}, {a.r} repetitions; "
          f"steps: {rt.describe_step(step)}, draft {draft.describe_step(draft_step)}\n")
    print("| prompt | decoding | tokens | t/s (median) | speedup | acceptance | = greedy |")
    print("|---|---|---:|---:|---:|---:|---|")
    for name in a.prompts.split(","):
        text = PROMPTS[name]
        ids = rt.prompt_ids([{"role": "user", "content": text}])
        greedy = Request(SamplingParams(temperature=0), a.n)
        ways = {"greedy": greedy}  # the request of each way of decoding, as `run`'s flags make it
        for k in map(int, a.ks.split(",")):
            ways[f"--draft, K={k}"] = greedy.with_(guesses="draft", draft_tokens=k)
        for k in map(int, a.lookup_ks.split(",")):
            ways[f"--lookup, K={k}"] = greedy.with_(guesses="lookup", draft_tokens=k)
        if a.beams:
            ways[f"--beams {a.beams}"] = greedy.with_(beams=a.beams)
        speeds = {w: [] for w in ways}
        out, extra = {}, {}
        run_once(rt, ids, greedy.with_(max_tokens=8), step)  # warm up
        for _ in range(a.r):
            for w, request in ways.items():
                drafter = draft.draft(1024) if request.guesses == "draft" else None  # a fresh draft cache each run
                out[w], tps, extra[w] = run_once(rt, ids, request, step, drafter)
                speeds[w].append(tps)
        base = statistics.median(speeds["greedy"])
        for w in ways:
            med = statistics.median(speeds[w])
            acc = extra[w].get("acceptance_rate")
            same = "yes" if out[w] == out["greedy"] else f"no (first {_agree(out[w], out['greedy'])} same)"
            print(f"| {name} | {w} | {len(out[w])} | {med:.1f} | {med / base:.2f}x | "
                  f"{'' if acc is None else f'{acc:.0%}'} | {same if not w.startswith('--beams') else '-'} |")


def _agree(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


if __name__ == "__main__":
    main()
