"""How fast this machine reads memory with 1..N threads: the roofline a memory-bound decode step is
measured against (a token reads every weight once; bytes a token / this = the fastest it can go).

    python -m benchmarks.kernels.read_bandwidth [--gib 1] [--threads 1,2] [--rounds 5] [--model-gb 3.09 --tps 6.5]

Builds read_bandwidth.cpp beside this file with the compiler llmcli's kernels use (-O3 -march=native,
into a temporary folder), then for each thread count reads a buffer of --gib GiB (far past the
caches) --rounds times and prints the best round's GB/s. With --model-gb and --tps (a decode's
bytes a token and its tokens/s), also the share of the roofline that decode reached.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from llmcli.native import build

from ..machine import cpu_name

SOURCE = Path(__file__).with_name("read_bandwidth.cpp")


def compiled(folder: Path) -> Path:
    cxx = build.compiler()
    if cxx is None:
        sys.exit("no C++ compiler (install g++ or clang++, or set CXX)")
    out = folder / "read_bandwidth"
    subprocess.run([*cxx.split(), "-O3", "-march=native", "-std=c++17", "-pthread", str(SOURCE), "-o", str(out)],
                   check=True)
    return out


def bandwidth(threads: list[int], gib: float = 1.0, rounds: int = 5) -> dict[int, float]:
    """{threads: GB/s}: the best of `rounds` reads of a `gib` GiB buffer with each thread count (the
    reader built once, in a temporary folder). Other benchmarks' roofline: `from
    benchmarks.kernels.read_bandwidth import bandwidth`."""
    with tempfile.TemporaryDirectory() as d:
        binary = compiled(Path(d))
        return {t: float(subprocess.run([str(binary), str(int(gib * 2**30)), str(t), str(rounds)], capture_output=True,
                                        text=True, check=True).stdout.split()[0]) for t in threads}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model-gb", type=float, help="bytes a decode token reads, in GB")
    ap.add_argument("--tps", type=float, help="that decode's tokens/s")
    a = ap.parse_args()
    measured = bandwidth([int(x) for x in a.threads.split(",")], a.gib, a.rounds)
    print(f"{cpu_name()}: reading {a.gib:g} GiB, best of {a.rounds}")
    for t, gbs in measured.items():
        line = f"{t} thread{'s' if t > 1 else ''}: {gbs:.1f} GB/s"
        if a.model_gb and a.tps:
            line += f"; {a.model_gb:g} GB a token at {a.tps:g} t/s = {a.model_gb * a.tps:.1f} GB/s, " \
                    f"{a.model_gb * a.tps / gbs:.0%} of it"
        print(line)


if __name__ == "__main__":
    main()
