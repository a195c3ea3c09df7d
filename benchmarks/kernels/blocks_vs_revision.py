"""The GGUF block kernels of a git revision against the working tree's, one variant, on one model's
weights, interleaved in one process (this machine is too noisy to compare separate runs).

    python -m benchmarks.kernels.blocks_vs_revision MODEL [--rev HEAD] [--variant avx2] [--rows 1] [--type Q4_1]

Prints ms per pass over every block weight in order, as a decode step streams them (the figure
that counts), and per weight shape repeated in place (weights in cache, which can mislead). The
revision's llmcli/native sources are built with the tree's build.py, so revisions from the src/ and
arch/ layout and the llmcli_step_* names on (before them the files lay flat; before the per-ISA
libraries, the kernels were a torch extension).
"""
import argparse
import collections
import time

import torch

from llmcli import native
from llmcli.quant.gguf_blocks import TYPE_IDS, GGUFBlockWeight
from llmcli.runtime.runtime import open_model

from .revision import kernels_at

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--rev", default="HEAD")
ap.add_argument("--variant", help="default: the one this CPU picks")
ap.add_argument("--rows", type=int, default=1, help="activation rows (1: decoding)")
ap.add_argument("--type", help="only weights of this GGUF type")
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()

variant = a.variant or native.variants()[0]
ops = {a.rev: kernels_at(a.rev, variant).mm}
ops["tree"] = native.load(variant).mm
rt = open_model(a.model, threads=a.threads, ctx_size=512)
torch.set_num_threads(a.threads)
weights = list({id(v): v for m in rt.loaded.model.modules() for v in vars(m).values()
                if isinstance(v, GGUFBlockWeight) and (a.type is None or v.type_name == a.type)}.values())
args = [(torch.randn(a.rows, w.shape[1]), w.blocks, TYPE_IDS[w.type_name], w.shape[1]) for w in weights]
for x in args:
    torch.testing.assert_close(ops[a.rev](*x), ops["tree"](*x), rtol=1e-4, atol=1e-3)
passes, shapes = collections.defaultdict(list), collections.defaultdict(float)
with torch.inference_mode():
    for _ in range(6):
        for name, op in ops.items():
            t = time.perf_counter()
            for _ in range(10):
                for x in args:
                    op(*x)
            passes[name].append((time.perf_counter() - t) / 10 * 1e3)
    for name, op in ops.items():
        for x, w in zip(args, weights):
            t = time.perf_counter()
            for _ in range(30):
                op(*x)
            shapes[(w.type_name, tuple(w.shape), name)] += (time.perf_counter() - t) / 30 * 1e3
print(f"{variant}: {len(weights)} weights, {sum(w.nbytes for w in weights) / 2**20:.1f} MiB, {a.rows} activation rows")
for name, ms in passes.items():
    print(f"{name:>8}: ms per pass, sorted: {sorted(round(m, 2) for m in ms)}")
for key, ms in sorted(shapes.items()):
    print(f"{key[0]} {str(key[1]):14s} {key[2]:>8}: {ms:.3f} ms in place")
