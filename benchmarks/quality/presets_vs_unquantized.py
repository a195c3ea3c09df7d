"""Every preset against the unquantized model on real text, in one pass; and their speed.

    python -m benchmarks.quality.presets_vs_unquantized MODEL --file TEXT [--ctx 512] [--chunks 40] [--dtype float32]
        [--presets q8,q4,q4_g128,q4_mixed,bf16,f16] [--variants] [--path eager|step] [--speed] [--json results.json]

Quality: windows of --ctx tokens scored on their second half (llmcli perplexity / llama-perplexity);
the reference (MODEL as stored, dequantized to float32) is evaluated once per window and every preset
(built in --dtype) is compared with it: mean and p99 KL divergence, same top token, perplexity
ratio, and the size of the checkpoint it would write. `name:minmax` / `name:plain` / `name:weighted` evaluate a preset with
min/max scales or one kind of scale search, `name:requant` re-quantizes GGUF blocks it would import;
--variants adds symmetric, per-row and re-quantized variants under each search, to judge the search.

--path step scores each preset the way `run` decodes it: through the native step (int8 activations
per 32, as llama.cpp, or the preset's int8x2; `name:int8` / `name:int8x2` forces one; a float16 KV
cache) where the step takes the model (on a CPU whose kernels have
integer dot products: q4, q8, q4_mixed as GGUF blocks), else as --path eager does: the model's own
forward over the window (for blocks and packed weights, their dequantized tiles in a dense GEMM).
Today's path before blocks: LLMCLI_KERNEL=portable (llmcli's own int4/int8 layouts) with --path eager.

Speed (--speed): pp512 (prefill) and tg128 (decode) tokens/s in bfloat16 on --threads threads, for
the unquantized model and each preset, interleaved over --repeats rounds (medians): this machine is
noisy, so only numbers from one run are compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from llmcli.bench.perplexity import Scores, logprobs, text_windows
from llmcli.cache import new_cache
from llmcli.cache.static import StaticKVCache
from llmcli.decode.prefill import prefill
from llmcli.quant.convert import convert
from llmcli.quant.held import hold_activations
from llmcli.quant.model import build
from llmcli.quant.pipeline import open_source
from llmcli.quant.presets import load_preset, parse_preset
from llmcli.runtime.device import place
from llmcli.runtime.loader import LoadedModel, load_model
from llmcli.runtime.native_step import NativeStep

VARIANT_PRESETS = {
    "q8_row": '[[rules]]\nmatch = "*"\nbits = 8\ngroup_size = "row"\n',
    "q4_sym": ('[[rules]]\nmatch = ["model.embed_tokens.weight", "lm_head.weight"]\nbits = 8\n\n'
               '[[rules]]\nmatch = "*"\nbits = 4\ngroup_size = 32\nsymmetric = true\n'),
    "q4_g128_sym": ('[[rules]]\nmatch = ["model.embed_tokens.weight", "lm_head.weight"]\nbits = 8\n\n'
                    '[[rules]]\nmatch = "*"\nbits = 4\ngroup_size = 128\nsymmetric = true\n'),
    "q4_all": '[[rules]]\nmatch = "*"\nbits = 4\ngroup_size = 32\n',
}
VARIANTS = ["q8_row", "q4_all", "q4:requant", "q4_mixed:requant", "q4_g128:minmax", "q4_g128:plain",
            "q4_sym", "q4_sym:minmax"]


def _preset(name: str):
    return parse_preset(VARIANT_PRESETS[name], name) if name in VARIANT_PRESETS else load_preset(name)


def quantized_model(source, spec: str, placement) -> tuple[LoadedModel, int]:
    """(model quantized as `spec` says, bytes of the checkpoint tensors it would write).

    spec: preset[:minmax|:plain|:weighted][:requant][:int8|:int8x2] (requant: quantize GGUF blocks
    again instead of importing them; int8, int8x2: the kernels' activations, else the preset's)."""
    name, *how = spec.split(":")
    src = open_source(source)
    args = src.args
    if "requant" in how:
        for s in src.sources:
            s.gguf_type = None
    search = next((h for h in how if h in ("minmax", "plain", "weighted")), True)
    converted = convert(src.sources, _preset(name), args.num_hidden_layers, args.tie_word_embeddings,
                        search=search)
    model = build(args, converted, placement.device, placement.dtype)
    hold_activations(model, next((h for h in how if h in ("int8", "int8x2")), _preset(name).activations))
    loaded = LoadedModel(model, None, args, None, Path(source), "quantized", converted.nbytes, spec, placement, 0.0)
    return loaded, converted.nbytes


def scorer(loaded, path: str):
    """window -> log-probabilities of its scored half (as bench.perplexity's), by `path`."""
    if path != "step" or not NativeStep.supports(loaded.model):
        return lambda w: logprobs(loaded, w)
    step = NativeStep(loaded.model)

    def score(w: list[int]) -> torch.Tensor:
        cache = new_cache(loaded.args, len(w), torch.device("cpu"), torch.float32, "f16")
        with torch.inference_mode():
            logits = step(torch.tensor([w]), cache)[0]
        return torch.log_softmax(logits[len(w) // 2:-1].float(), dim=-1)

    return score


def quality(a) -> dict:
    placement = place("cpu", a.dtype, a.threads)
    reference = load_model(a.model, place("cpu", "float32", a.threads))
    text = Path(a.file).read_text(encoding="utf-8")
    todo = text_windows(reference, text, a.ctx, a.chunks)
    names = a.presets.split(",") + (VARIANTS if a.variants else [])
    models = {}
    for name in names:
        loaded, nbytes = quantized_model(a.model, name, placement)
        loaded.tokenizer = reference.tokenizer
        score = scorer(loaded, a.path)
        models[name] = (score, nbytes, Scores())
        how = "native step" if a.path == "step" and NativeStep.supports(loaded.model) else "eager"
        print(f"built {name} ({how})", file=sys.stderr, flush=True)
    base_scores = Scores()
    t0 = time.perf_counter()
    for i, w in enumerate(todo):
        targets = torch.tensor(w[a.ctx // 2 + 1:])
        ref = logprobs(reference, w)
        base_scores.add(ref, targets)
        for score, _, scores in models.values():
            scores.add(score(w), targets, ref)
        print(f"window {i + 1}/{len(todo)} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    out = {"reference": {"weights": reference.weights_type, "bytes": reference.weights_bytes,
                         "ppl": base_scores.result(len(todo), a.ctx, 0).ppl}}
    for name, (_, nbytes, scores) in models.items():
        out[name] = {**scores.result(len(todo), a.ctx, 0).as_dict(), "bytes": nbytes}
    return out


def speed(a, names: list[str]) -> dict:
    placement = place("cpu", "bfloat16", a.threads)
    models = {"unquantized": load_model(a.model, placement)}
    for name in names:
        models[name] = quantized_model(a.model, name, placement)[0]
    times = {name: {"pp": [], "tg": []} for name in models}
    prompt = list(range(1000, 1512))
    for _ in range(a.repeats):
        for name, m in models.items():
            cache = StaticKVCache.for_model(m.args, 1024, placement.device, placement.dtype)
            t = time.perf_counter()
            prefill(m.model, prompt, cache, placement.device)
            times[name]["pp"].append(512 / (time.perf_counter() - t))
            token = torch.tensor([[1000]])
            with torch.inference_mode():
                t = time.perf_counter()
                for _ in range(128):
                    m.model(token, cache, last_only=True)
            times[name]["tg"].append(128 / (time.perf_counter() - t))
        print(f"speed round done: {({k: round(statistics.median(v['tg']), 1) for k, v in times.items()})}",
              file=sys.stderr, flush=True)
    return {name: {"pp512_tps": round(statistics.median(t["pp"]), 1), "tg128_tps": round(statistics.median(t["tg"]), 1),
                   "pp512_all": [round(x, 1) for x in t["pp"]], "tg128_all": [round(x, 1) for x in t["tg"]]}
            for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--file", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=40)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--presets", default="q8,q4,q4_g128,q4_mixed,bf16,f16,nf4,llm_int8")
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--path", choices=("eager", "step"), default="eager",
                    help="score through the model's forward (eager) or the native step where it runs (as run decodes)")
    ap.add_argument("--speed", action="store_true", help="also measure pp512 / tg128")
    ap.add_argument("--no-quality", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    results = {"args": vars(a)}
    if not a.no_quality:
        results["quality"] = quality(a)
        q = results["quality"]
        print(f"reference ({q['reference']['weights']}): ppl {q['reference']['ppl']:.4f}")
        print(f"{'preset':>20} {'mean KLD':>9} {'p99 KLD':>8} {'same top':>9} {'PPL ratio':>9} {'MB':>7}")
        for name, r in q.items():
            if name != "reference":
                print(f"{name:>20} {r['kld_mean']:>9.5f} {r['kld_p99']:>8.4f} {100 * r['same_top']:>8.2f}% "
                      f"{r['ppl_ratio']:>9.4f} {r['bytes'] / 1e6:>7.1f}")
    if a.speed:
        results["speed"] = speed(a, a.presets.split(","))
        print(f"{'model':>20} {'pp512 t/s':>10} {'tg128 t/s':>10}")
        for name, r in results["speed"].items():
            print(f"{name:>20} {r['pp512_tps']:>10.1f} {r['tg128_tps']:>10.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
