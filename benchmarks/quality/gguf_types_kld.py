"""GGUF files kept packed at load (Q4_K -> int4 g32, Q5_x/Q6_K as blocks): quality and kernel speed.

    python -m benchmarks.quality.gguf_types_kld quality FILE.gguf [FILE.gguf ...] --file TEXT [--ctx 256] [--chunks 8]
    python -m benchmarks.quality.gguf_types_kld speed [--repeats 7] [--threads 2]

quality: per file, KL divergence of logits against the file dequantized to float32 (the reference,
`--dtype float32`), over windows of --ctx tokens scored on their second half:
    default        the default load: the file's blocks packed, bfloat16 activations
    bf16-dequant   every tensor dequantized to bfloat16 (what loading did before): the cost of bf16
    <TYPE> only    float32 activations, only the tensors of that GGUF type packed: the format's own
                   error (0 where the blocks are used as stored; bf16 scales for Q4_K)
speed: y = x @ W.T for one token (decode) on SmolLM2-135M and Qwen2.5-0.5B weight shapes, per
format, interleaved rounds, medians: dense bf16, int8 g32 (the existing group-wise Int8Weight), the
GGUF block kernel per type, the same blocks through the torch fallback, and Q4_K as int4 g32.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from benchmarks.shapes import quantize as kquantize
from llmcli.bench.perplexity import Scores, logprobs, text_windows
from llmcli.formats.open import open_model_file
from llmcli.runtime.device import place
from llmcli.runtime.loader import LoadedModel, load_model


def _variant(path: Path, which: str, reference: LoadedModel) -> LoadedModel:
    from llmcli.quant import gguf_import, pipeline
    from llmcli.quant.presets import Preset, Rule

    if which == "default":
        return load_model(path, place("cpu", "bfloat16", 2))
    if which == "bf16-dequant":
        keep = gguf_import.as_stored_preset
        gguf_import.as_stored_preset = lambda sources: None
        try:
            return load_model(path, place("cpu", "bfloat16", 2))
        finally:
            gguf_import.as_stored_preset = keep
    type_name = which.removesuffix(" only")
    sources = open_model_file(path).sources()
    rules = [Rule((s.name,), (), gguf_import.AS_STORED[s.gguf_type]) for s in sources if s.gguf_type == type_name]
    if reference.args.tie_word_embeddings and any(r.patterns == ("model.embed_tokens.weight",) for r in rules):
        rules.append(Rule(("lm_head.weight",), (), gguf_import.AS_STORED[type_name]))
    placement = place("cpu", "float32", 2)
    # the other tensors stay float32, as in the reference (a preset's default keeps them at bf16)
    model = pipeline.model_from_sources(sources, reference.args, Preset(which, rules, dtype="float32"), placement)
    return LoadedModel(model, reference.tokenizer, reference.args, None, path, "gguf", 0, which, placement, 0.0)


def quality(a) -> None:
    from llmcli.bench.bench import weights_bytes
    from llmcli.quant.gguf_import import AS_STORED

    text = Path(a.file).read_text(encoding="utf-8")
    for path in map(Path, a.files):
        types = Counter(t.tensor_type.name for t in open_model_file(path).reader.tensors if len(t.shape) > 1)
        file_bytes = path.stat().st_size
        reference = load_model(path, place("cpu", "float32", 2))
        todo = text_windows(reference, text, a.ctx, a.chunks)
        names = ["default", "bf16-dequant"] + [f"{t} only" for t in sorted(types) if t in AS_STORED]
        if a.only:
            names = [f"{t} only" for t in a.only.split(",") if t in types]
        refs = [logprobs(reference, w) for w in todo]
        rows = []
        for name in names:
            m = _variant(path, name, reference)
            scores = Scores()
            for w, ref in zip(todo, refs):
                scores.add(logprobs(m, w), torch.tensor(w[a.ctx // 2 + 1:]), ref)
            r = scores.result(len(todo), a.ctx, 0)
            held = weights_bytes(m.model) if name == "default" else None
            rows.append((name, r, held))
            print(f"  done {name}", file=sys.stderr, flush=True)
        print(f"{path.name}: {file_bytes / 1e6:.1f} MB, 2-D tensors {dict(types)}, {len(todo)} x {a.ctx} tokens")
        for name, r, held in rows:
            size = f"  held {held / 1e6:.1f} MB ({held / file_bytes:.3f}x file)" if held else ""
            print(f"  {name:>14}: mean KLD {r.kld_mean:.6f}  p99 {r.kld_p99:.5f}  same top {100 * r.same_top:.2f}%"
                  f"  PPL ratio {r.ppl_ratio:.4f}{size}")


SHAPES = {"smollm2-135m": [(576, 576), (192, 576), (1536, 576), (576, 1536)],
          "qwen2.5-0.5b": [(896, 896), (128, 896), (4864, 896), (896, 4864)]}


def _formats(N: int, K: int):
    """name -> (matmul, bytes) for one (N, K) weight in every format that can hold it."""
    import gguf
    from gguf.quants import quantize

    from llmcli import native
    from llmcli.quant.gguf_blocks import GGUFBlockWeight
    from llmcli.quant.gguf_import import AS_STORED, import_block_quants
    from llmcli.quant.packed import Int4Weight, Int8Weight

    cpu = torch.device("cpu")
    w = np.random.default_rng(0).standard_normal((N, K)).astype(np.float32) * 0.02
    dense = torch.from_numpy(w).to(torch.bfloat16)
    out = {"dense bf16": (lambda x: x @ dense.T, dense.numel() * 2)}
    q8 = import_block_quants(quantize(w, gguf.GGMLQuantizationType.Q8_0), "Q8_0", N, K, AS_STORED["Q8_0"])
    i8 = Int8Weight.from_codes(q8["codes"], q8["scales"], cpu)
    out["int8 g32"] = (i8.matmul, i8.nbytes)
    types = ["Q5_0", "Q5_1", "Q8_0"] + (["Q4_K", "Q5_K", "Q6_K"] if K % 256 == 0 else [])
    for t in types:
        raw = kquantize(w, t)
        if t == "Q4_K":
            q = import_block_quants(raw, t, N, K, AS_STORED[t])
            i4 = Int4Weight.from_codes(q["codes"], q["scales"], q["zeros"], cpu)
            out["Q4_K as int4 g32"] = (i4.matmul, i4.nbytes)
        elif t != "Q8_0":
            b = GGUFBlockWeight.from_blocks(torch.from_numpy(raw.copy()), t, cpu)
            if native.available():
                out[f"{t} blocks kernel"] = (b.matmul, b.nbytes)

            def fallback(x, b=b):
                keep, native._module = native._module, False
                try:
                    return b.matmul(x)
                finally:
                    native._module = keep

            out[f"{t} blocks torch"] = (fallback, b.nbytes)
    return out


def speed(a) -> None:
    torch.set_num_threads(a.threads)
    for model, shapes in SHAPES.items():
        totals: dict[str, list[float]] = {}
        nbytes: Counter = Counter()
        for N, K in shapes:
            formats = _formats(N, K)
            x = torch.randn(1, K, dtype=torch.bfloat16)
            times = {name: [] for name in formats}
            for name, (f, size) in formats.items():
                f(x)  # warm up
                nbytes[name] += size
            for _ in range(a.repeats):
                for name, (f, _) in formats.items():
                    t = time.perf_counter()
                    for _ in range(a.calls):
                        f(x)
                    times[name].append((time.perf_counter() - t) / a.calls * 1e6)
            for name, t in times.items():
                totals.setdefault(name, []).append(statistics.median(t))
            print(f"{model} {N}x{K}: " + ", ".join(f"{n} {statistics.median(t):.0f} us" for n, t in times.items()),
                  flush=True)
        print(f"{model}, one layer's {len(shapes)} shapes summed (us, median per shape):")
        for name, t in totals.items():
            if len(t) == len(shapes):
                print(f"  {name:>20}: {sum(t):8.0f} us  {nbytes[name] / 1e6:6.2f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quality")
    q.add_argument("files", nargs="+")
    q.add_argument("--file", required=True, help="a text, e.g. tinyshakespeare.txt")
    q.add_argument("--ctx", type=int, default=256)
    q.add_argument("--chunks", type=int, default=8)
    q.add_argument("--only", help="just these types' 'only' rows, e.g. Q4_K,Q5_0")
    s = sub.add_parser("speed")
    s.add_argument("--repeats", type=int, default=7)
    s.add_argument("--calls", type=int, default=20)
    s.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    quality(a) if a.cmd == "quality" else speed(a)


if __name__ == "__main__":
    main()
