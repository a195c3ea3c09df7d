"""Weight-only kernels vs dequantize + dense GEMM, by activation rows: where DENSE_FROM_ROWS comes from.

    python -m benchmarks.kernels.weight_only_vs_dense [--threads 2] [--shapes 576x576,1536x576,49152x576,4096x4096]

Prints the median time of x @ W.T per path (µs) for each weight shape (N x K) and row count. The
two paths are timed interleaved, so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from llmcli.quant import kernels
from llmcli.quant.packed import Int4Weight, Int8Weight
from llmcli.quant.primitives import pack_int4, quantize

CPU = torch.device("cpu")


def timed(fn, limit: int) -> float:
    kernels.DENSE_FROM_ROWS["cpu"] = limit
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default="576x576,1536x576,576x1536,49152x576,4096x4096")
    ap.add_argument("--rows", default="1,4,8,16,32,128,512")
    ap.add_argument("--repeats", type=int, default=9)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"{'weight':>12} {'format':>10} {'rows':>5} {'kernel µs':>10} {'dequant+GEMM µs':>16} {'dense bf16 µs':>14}")
    for shape in a.shapes.split(","):
        N, K = map(int, shape.split("x"))
        w = torch.randn(N, K) * 0.02
        dense = w.to(torch.bfloat16)
        q4 = quantize(w, 4, 32, symmetric=False, search=False)
        q8g = quantize(w, 8, 32, search=False)
        q8r = quantize(w, 8, K, search=False)
        formats = {"int4_g32": Int4Weight(pack_int4(q4.codes), q4.scales, q4.zeros, CPU),
                   "int8_g32": Int8Weight(q8g.codes, q8g.scales, CPU),
                   "int8_row": Int8Weight(q8r.codes, q8r.scales, CPU)}
        for rows in map(int, a.rows.split(",")):
            x = torch.randn(rows, K, dtype=torch.bfloat16)
            for name, weight in formats.items():
                k, d, b = [], [], []
                for _ in range(a.repeats):
                    k.append(timed(lambda: weight.matmul(x), 1 << 30))
                    d.append(timed(lambda: weight.matmul(x), 0))
                    b.append(timed(lambda: x @ dense.t(), 0))
                print(f"{shape:>12} {name:>10} {rows:>5} {statistics.median(k):>10.0f} {statistics.median(d):>16.0f} "
                      f"{statistics.median(b):>14.0f}", flush=True)


if __name__ == "__main__":
    main()
