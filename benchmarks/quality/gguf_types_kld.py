"""GGUF files kept packed at load (Q4_K -> int4 g32, Q5_x/Q6_K as blocks): what each GGUF block type
costs in quality, per file.

    python -m benchmarks.quality.gguf_types_kld FILE.gguf [FILE.gguf ...] --file TEXT [--ctx 256] [--chunks 8]

Per file, KL divergence of logits against the file dequantized to float32 (the reference,
`--dtype float32`), over windows of --ctx tokens scored on their second half:
    default        the default load: the file's blocks packed, bfloat16 activations
    bf16-dequant   every tensor dequantized to bfloat16 (what loading did before): the cost of bf16
    <TYPE> only    float32 activations, only the tensors of that GGUF type packed: the format's own
                   error (0 where the blocks are used as stored; bf16 scales for Q4_K)
The kernels' speed per format: benchmarks/kernels/matvec_by_format.py.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

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
    from llmcli.bench.measure import weights_bytes
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--file", required=True, help="a text, e.g. tinyshakespeare.txt")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--only", help="just these types' 'only' rows, e.g. Q4_K,Q5_0")
    quality(ap.parse_args())


if __name__ == "__main__":
    main()
