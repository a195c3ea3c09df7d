"""Reconstruction error of min/max scales vs the scale search (plain least squares, and weighted
towards large values: the default), on random Gaussian weights (where nothing lines up by luck) and,
optionally, on a real model's float weights.

    python benchmarks/scale_search.py [--model MODEL] [--rows 1024 --cols 4096]

Prints the relative mean squared error (error power / weight power) per format and each search's
gain over min/max (1 - searched / min-max). The error a model feels is measured by
benchmarks/quant_quality.py (KL divergence on text); the weighted search wins there.
"""

from __future__ import annotations

import argparse

import torch

from llmcli.quant.primitives import quantize, reconstruction_error

FORMATS = [(4, 32, False), (4, 64, False), (4, 128, False), (4, 32, True), (4, 128, True), (8, 32, True),
           (8, None, True)]


def table(label: str, weights: list[torch.Tensor]) -> None:
    print(f"{label}")
    print(f"{'format':>14} {'min/max':>10} {'plain':>10} {'gain':>7} {'weighted':>10} {'gain':>7}")
    for bits, group, symmetric in FORMATS:
        err = {"minmax": 0.0, "plain": 0.0, "weighted": 0.0}
        for w in weights:
            g = group or w.shape[1]
            if w.shape[1] % g:
                g = max(x for x in (32, 64, 128) if w.shape[1] % x == 0)  # as presets fall back
            for mode in err:
                err[mode] += reconstruction_error(w, quantize(w, bits, g, symmetric, search=mode)) / len(weights)
        name = f"int{bits}_{'row' if group is None else f'g{group}'}{'_sym' if bits == 4 and symmetric else ''}"
        print(f"{name:>14} {err['minmax']:>10.3e} {err['plain']:>10.3e} {100 * (1 - err['plain'] / err['minmax']):>6.1f}% "
              f"{err['weighted']:>10.3e} {100 * (1 - err['weighted'] / err['minmax']):>6.1f}%", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--model", help="also a model's 2-D float weights (e.g. a GGUF, dequantized)")
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    table(f"Gaussian weights {a.rows}x{a.cols}", [torch.randn(a.rows, a.cols, generator=gen)])
    if a.model:
        from llmcli.quant.pipeline import open_source

        src = open_source(a.model)
        weights = [s.values() for s in src.sources if len(s.shape) == 2 and "embed" not in s.name]
        table(f"{a.model}: {len(weights)} weight matrices", weights)


if __name__ == "__main__":
    main()
