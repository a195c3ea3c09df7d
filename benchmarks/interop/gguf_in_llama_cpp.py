"""Do llama.cpp's tools load the GGUF files `llmcli quantize --format gguf` writes, and run them as llmcli
does? For each preset: write the file, compare its keys with a file llama.cpp's own convert_hf_to_gguf.py
(and llama-quantize) made from the same folder (--reference), let llama-simple continue a prompt greedily
beside `llmcli run --raw --temp 0`, and time decoding with llama-bench (llmcli's file, then the reference).

    python -m benchmarks.interop.gguf_in_llama_cpp MODEL --llama-cpp $LLAMA_CPP/build/bin \
        [--presets q4,q8] [--reference q8=FILE --reference q4=FILE] [--no-search] [-n 24] [-t 2] [-r 3]

MODEL is a Hugging Face folder or a GGUF file. Prints one table; the files go to --out (a temporary
folder by default).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPT = "The capital of France is"


def keys(path: Path) -> dict:
    import gguf

    return {k: f.contents() for k, f in gguf.GGUFReader(str(path)).fields.items() if not k.startswith("GGUF.")}


def key_differences(mine: Path, reference: Path) -> str:
    a, b = keys(mine), keys(reference)
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return "same keys and values" if not differ else "differ: " + ", ".join(differ)


def llama_simple(binary: Path, path: Path, tokens: int) -> str:
    out = subprocess.run([str(binary), "-m", str(path), "-n", str(tokens), PROMPT], capture_output=True, text=True,
                         timeout=600)
    if out.returncode:
        return f"failed: {out.stderr.strip().splitlines()[-1]}"
    return out.stdout.split(PROMPT, 1)[-1]  # it echoes the prompt (after a BOS it shows, such as Gemma's <bos>)


def llmcli_run(path: Path, tokens: int) -> str:
    return subprocess.run([sys.executable, "-m", "llmcli", "run", str(path), PROMPT, "--raw", "--temp", "0", "-n",
                           str(tokens)], capture_output=True, text=True, check=True, timeout=600).stdout


def llama_bench(binary: Path, path: Path, threads: int, reps: int) -> str:
    out = subprocess.run([str(binary), "-m", str(path), "-p", "0", "-n", "64", "-t", str(threads), "-r", str(reps),
                          "-o", "json"], capture_output=True, text=True, timeout=600)
    if out.returncode:
        return f"failed: {out.stderr.strip().splitlines()[-1]}"
    run = json.loads(out.stdout)[0]
    return f"{run['avg_ts']:.1f} ± {run['stddev_ts']:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--llama-cpp", type=Path, required=True, help="the folder with llama-simple and llama-bench")
    ap.add_argument("--presets", default="q4,q8")
    ap.add_argument("--reference", action="append", default=[], help="PRESET=FILE: llama.cpp's own file to compare")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--no-search", action="store_true", help="min/max scales (faster to write)")
    ap.add_argument("-n", type=int, default=24, help="tokens to continue the prompt by (default 24)")
    ap.add_argument("-t", type=int, default=2, help="threads for llama-bench (default 2)")
    ap.add_argument("-r", type=int, default=3, help="llama-bench repetitions (default 3)")
    a = ap.parse_args()
    from llmcli.quant.gguf_export import quantize_to_gguf

    out = a.out or Path(tempfile.mkdtemp(prefix="gguf-interop-"))
    references = dict(r.split("=", 1) for r in a.reference)
    rows = []
    for preset in a.presets.split(","):
        path = out / f"{a.model.stem}-{preset}.gguf"
        summary = quantize_to_gguf(a.model, preset, path, force=True, search=not a.no_search)
        types = ", ".join(f"{n} {t}" for t, n in summary.tensor_types.items())
        theirs = llama_simple(a.llama_cpp / "llama-simple", path, a.n)
        ours = llmcli_run(path, a.n)
        reference = references.get(preset)
        rows.append((preset, types, f"{path.stat().st_size / 1e6:.1f} MB",
                     key_differences(path, Path(reference)) if reference else "-",
                     "same" if theirs == ours else f"llama.cpp {theirs!r} / llmcli {ours!r}",
                     llama_bench(a.llama_cpp / "llama-bench", path, a.t, a.r),
                     llama_bench(a.llama_cpp / "llama-bench", Path(reference), a.t, a.r) if reference else "-"))
        print(f"{preset}: llama-simple continues {PROMPT!r} with {theirs!r}", file=sys.stderr)
    print("| preset | tensors | size | keys against llama.cpp's file | greedy text, llama-simple vs llmcli run "
          f"| llama-bench tg64 t/s (-t {a.t}) | llama.cpp's file tg64 t/s |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
