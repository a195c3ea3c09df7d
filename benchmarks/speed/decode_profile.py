"""Where a decode step's time goes: torch.profiler over 32 one-token steps after a 64-token prefill.

    python -m benchmarks.speed.decode_profile MODEL eager|compiled|native [THREADS]

Prints wall ms/token, the ops with the most self time, and buckets (int4 matmuls, dense matmuls,
attention, sampling); the rest of the self time is norms, rope and element-wise ops. `native` (the
C++ step of a GGUF model, native_step.py) is one call the profiler cannot see into: it prints the
call's own ms/token beside the step's.
"""
import argparse
import collections
import time

import torch

from llmcli.runtime.runtime import open_model

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("model")
ap.add_argument("mode", choices=["eager", "compiled", "native"])
ap.add_argument("threads", type=int, nargs="?", default=2)
a = ap.parse_args()
mode = a.mode
rt = open_model(a.model, threads=a.threads, ctx_size=512)
model = rt.loaded.model
from llmcli.runtime.compiled_step import CompiledStep
from llmcli.runtime.native_step import NativeStep

step = {"eager": model, "compiled": CompiledStep(model), "native": rt.decode_step(False)}[mode]
assert mode != "native" or isinstance(step, NativeStep), "no native step for this model here"
cache = rt.new_cache()
from llmcli.decode.prefill import prefill

with torch.inference_mode():
    logits = prefill(model, list(range(100, 164)), cache, rt.placement.device)
    tok = logits.argmax().view(1, 1)
    for _ in range(5):
        tok = step(tok, cache, last_only=True)[0, -1].argmax().view(1, 1)
    N = 32
    t = time.perf_counter()
    for _ in range(N):
        tok = step(tok, cache, last_only=True)[0, -1].argmax().view(1, 1)
    print(f"{mode}: {(time.perf_counter()-t)/N*1e3:.2f} ms/token wall")
    if mode == "native":  # the C++ call alone: every layer, the final norm and the output projection
        ids, rows, at = tok.view(1), torch.zeros(1, dtype=torch.long), torch.tensor([cache.length])
        if step._native.embedding is not None:  # embedding and RoPE rows looked up in C++, as the step does
            call = lambda: step._native.run_ids(ids, rows, at, at)  # noqa: E731
        else:
            x, tables = model.embed(tok.view(1, 1)).reshape(1, -1), step._rope(at, cache)
            call = lambda: step._native.run(x, rows, at, *tables)  # noqa: E731
        t = time.perf_counter()
        for _ in range(N):
            call()
        print(f"native: {(time.perf_counter()-t)/N*1e3:.2f} ms/token in the C++ call")
    from torch.profiler import ProfilerActivity, profile
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(N):
            tok = step(tok, cache, last_only=True)[0, -1].argmax().view(1, 1)
    print(f"profiled wall {(time.perf_counter()-t)/N*1e3:.2f} ms/token")
    ev = prof.key_averages()
    cats = collections.Counter()
    def cat(name):
        n = name.lower()
        if "int4pack_mm" in n: return "int4 matmul"
        if "addmv" in n or n == "aten::mv": return "dense matmul"
        if "scaled_dot_product" in n or "flash_attention" in n or "_efficient_attention" in n: return "attention (SDPA)"
        if "argmax" in n: return "sampling (argmax)"
        return None
    total_self = 0
    for e in ev:
        total_self += e.self_cpu_time_total
    # top-level buckets from self time of leaf-ish ops
    rows = sorted(ev, key=lambda e: -e.self_cpu_time_total)[:25]
    for e in rows:
        print(f"{e.key[:70]:70s} calls/tok {e.count/N:6.1f} self {e.self_cpu_time_total/N/1e3:7.3f} ms/tok  total {e.cpu_time_total/N/1e3:7.3f}")
    for e in ev:
        c = cat(e.key)
        if c: cats[c] += e.cpu_time_total / N / 1e3
    print("buckets (cpu_time_total, ms/token):", {k: round(v, 3) for k, v in cats.items()})
    print("sum of self time ms/token:", round(total_self/N/1e3, 3))
