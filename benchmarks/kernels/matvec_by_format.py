"""One token's y = x @ W.T (decode) per weight format, on SmolLM2-135M's and Qwen2.5-0.5B's weight
shapes: which format a GGUF type should load into.

    python -m benchmarks.kernels.matvec_by_format [--repeats 7] [--calls 20] [--threads 2]

Per shape, interleaved rounds, medians: dense bf16, int8 g32 (the group-wise Int8Weight), the GGUF
block kernel per type, the same blocks through the torch fallback, and Q4_K as int4 g32; then one
layer's shapes summed, with the bytes each format holds. The quality side: benchmarks/quality/gguf_types_kld.py.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import numpy as np
import torch

from benchmarks.gguf_blocks import quantize as kquantize

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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    speed(ap.parse_args())


if __name__ == "__main__":
    main()
