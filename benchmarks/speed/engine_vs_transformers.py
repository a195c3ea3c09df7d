"""Prefill and decode tokens/s of llmcli and of transformers' `generate` on the same GGUF weights.

Same process, same threads, same dtype, interleaved repetitions (the machine is noisy), medians.
Not a test: it prints figures. Example:

    python -m benchmarks.speed.engine_vs_transformers MODEL.gguf --threads 2 --dtype bfloat16 -p 128 -n 64 -r 5 [--compile]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from llmcli.decode.generate import generate
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model


def llmcli_once(loaded, prompt: list[int], n: int, ctx: int, step=None) -> tuple[float, float]:
    from llmcli.cache.static import StaticKVCache

    tok = replace(loaded.tokenizer, eos_ids=frozenset())  # always generate n tokens
    cache = StaticKVCache.for_model(loaded.args, ctx, loaded.placement.device, loaded.placement.dtype)
    last = None
    for chunk in generate(loaded.model, tok, prompt, Request(SamplingParams(temperature=0), n), cache, step):
        last = chunk
    s = last.stats
    assert s.completion_tokens == n
    return s.prefill_tps, s.decode_tps


def transformers_once(model, prompt: list[int], n: int) -> tuple[float, float]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        t0 = time.perf_counter()
        model(ids)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        total = time.perf_counter() - t0
    assert out.shape[1] == len(prompt) + n
    # generate's first token costs one prefill; the rest are decode steps
    return len(prompt) / prefill, (n - 1) / max(total - prefill, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("-p", "--prompt-tokens", type=int, default=128)
    ap.add_argument("-n", "--gen-tokens", type=int, default=64)
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="also llmcli with the compiled decode step")
    a = ap.parse_args()

    from transformers import AutoModelForCausalLM

    placement = place("cpu", a.dtype, a.threads)
    t0 = time.perf_counter()
    ours = load_model(a.gguf, placement)
    ours.model.fuse()  # as runtime.open_model does
    ours_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs = AutoModelForCausalLM.from_pretrained(str(a.gguf.parent), gguf_file=a.gguf.name,
                                                  dtype=placement.dtype).eval()
    theirs_load = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, ours.args.vocab_size - 100, (a.prompt_tokens,), generator=g).tolist()
    ctx = a.prompt_tokens + a.gen_tokens

    steps = {"llmcli": None}
    if a.compile:
        from llmcli.runtime.compiled_step import CompiledStep

        steps["llmcli compiled"] = CompiledStep(ours.model)
    for step in steps.values():
        llmcli_once(ours, prompt, 4, ctx, step)  # warm-up (and compilation), not counted
    transformers_once(theirs, prompt, 4)
    rows = {name: [] for name in [*steps, "transformers"]}
    loads = {name: ours_load for name in steps} | {"transformers": theirs_load}
    for rep in range(a.reps):
        for name, step in steps.items():
            rows[name].append(llmcli_once(ours, prompt, a.gen_tokens, ctx, step))
        rows["transformers"].append(transformers_once(theirs, prompt, a.gen_tokens))
        print(f"rep {rep + 1}/{a.reps}: llmcli decode {rows['llmcli'][-1][1]:.1f} t/s, "
              f"transformers decode {rows['transformers'][-1][1]:.1f} t/s", flush=True)

    print(f"\n{a.gguf.name}, {a.dtype}, {a.threads} threads, prompt {a.prompt_tokens}, generate {a.gen_tokens}, "
          f"{a.reps} interleaved reps (median)\n")
    print("| engine | load s | prefill t/s | decode t/s |")
    print("|---|---|---|---|")
    med = {}
    for name, load in loads.items():
        pre = statistics.median(r[0] for r in rows[name])
        dec = statistics.median(r[1] for r in rows[name])
        med[name] = (pre, dec)
        print(f"| {name} | {load:.1f} | {pre:.0f} | {dec:.1f} |")
    for name in steps:
        print(f"\n{name} / transformers: prefill {med[name][0] / med['transformers'][0]:.2f}x, "
              f"decode {med[name][1] / med['transformers'][1]:.2f}x")


if __name__ == "__main__":
    main()
