"""The GGUF block kernel of a git revision against the working tree's, on one model's weights,
interleaved in one process (this machine is too noisy to compare separate runs).

    python benchmarks/gguf_kernel_ab.py MODEL [--rev HEAD] [--rows 1] [--type Q4_1]

Prints ms per pass over every block weight in order, as a decode step streams them (the figure
that counts), and per weight shape repeated in place (weights in cache, which can mislead).
"""
import argparse
import collections
import re
import subprocess
import time

import torch
from torch.utils.cpp_extension import load_inline

from llmcli import native
from llmcli.quant.gguf_blocks import TYPE_IDS, GGUFBlockWeight
from llmcli.runtime.runtime import open_model

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--rev", default="HEAD")
ap.add_argument("--rows", type=int, default=1, help="activation rows (1: decoding)")
ap.add_argument("--type", help="only weights of this GGUF type")
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()



def show(path: str) -> str:
    return subprocess.run(["git", "show", f"{a.rev}:{path}"], capture_output=True, text=True, check=True).stdout


try:  # the kernels' sources as llmcli/native holds them, or earlier, as quant/gguf_kernel.py's _SOURCE
    source = "\n".join(show(f"llmcli/native/{name}") for name in native._SOURCES)
except subprocess.CalledProcessError:
    source = re.search(r'_SOURCE = r"""(.*?)"""', show("llmcli/quant/gguf_kernel.py"), re.S).group(1)
source = source.replace("llmcli_gguf", "llmcli_ab")
load_inline(f"llmcli_ab_{abs(hash(source)) % 10**8}", cpp_sources=source,
            functions=None if "PYBIND11_MODULE" in source else ["has_int8_dot"],
            extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"])
native.available()  # the tree's build, which registers llmcli_gguf
rt = open_model(a.model, threads=a.threads, ctx_size=512)
weights = list({id(v): v for m in rt.loaded.model.modules() for v in vars(m).values()
                if isinstance(v, GGUFBlockWeight) and (a.type is None or v.type_name == a.type)}.values())
args = [(torch.randn(a.rows, w.shape[1]), w.blocks, TYPE_IDS[w.type_name], w.shape[1]) for w in weights]
ops = {a.rev: torch.ops.llmcli_ab.mm, "tree": torch.ops.llmcli_gguf.mm}
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
print(f"{len(weights)} weights, {sum(w.nbytes for w in weights) / 2**20:.1f} MiB, {a.rows} activation rows")
for name, ms in passes.items():
    print(f"{name:>8}: ms per pass, sorted: {sorted(round(m, 2) for m in ms)}")
for key, ms in sorted(shapes.items()):
    print(f"{key[0]} {str(key[1]):14s} {key[2]:>8}: {ms:.3f} ms in place")
