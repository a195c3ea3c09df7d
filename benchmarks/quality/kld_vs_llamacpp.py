"""The loss of each engine's default path against full precision, on the same GGUF file and text:
llama.cpp's (int8 activations) and llmcli's (`perplexity`: the native step `run` takes).

    python -m benchmarks.quality.kld_vs_llamacpp FILE.gguf[:CHUNKS] [...] --file TEXT
        --llama-cpp $LLAMA_CPP/build/bin [--ctx 512] [--chunks 8] [--work /tmp/kld] [--int8]

Per file:
  llama.cpp  the file dequantized to F32 (`llama-quantize --allow-requantize FILE F32.gguf F32`),
             `llama-perplexity -m F32.gguf --kl-divergence-base BASE` (the full-precision logits),
             then `llama-perplexity -m FILE --kl-divergence-base BASE --kl-divergence`
  llmcli     `llmcli perplexity FILE -f TEXT -c CTX --chunks N --reference f32 --json`: the default
             step against the file dequantized to float32 and run in float32 (torch)
  --int8     llmcli again with LLMCLI_ACTIVATIONS=int8 (llama.cpp's activations on every matmul)
Both score windows of --ctx tokens on their second half (llama-perplexity's way), the first N
windows of the text (FILE:N overrides --chunks). Printed: a markdown table, one row per engine and
file: mean KLD, same top token, PPL, reference PPL, their ratio. The F32 files and logits are kept
in --work and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

_FIELDS = {"kld": r"Mean\s+KLD:\s+([-\d.]+)", "same_top": r"Same top p:\s+([\d.]+)",
           "ppl": r"Mean PPL\(Q\)\s+:\s+([\d.]+)", "ppl_ref": r"Mean PPL\(base\)\s+:\s+([\d.]+)",
           "ratio": r"Mean PPL\(Q\)/PPL\(base\)\s+:\s+([\d.]+)"}


def _run(cmd: list[str], log: Path, env=None) -> str:
    print("$ " + " ".join(cmd), file=sys.stderr)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    log.write_text(r.stdout + r.stderr)
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}; see {log}")
    return r.stdout + r.stderr


def llama_cpp(path: Path, text: Path, ctx: int, chunks: int, bin_dir: Path, work: Path) -> dict:
    stem = f"{path.stem}.c{ctx}.n{chunks}"
    f32, base = work / f"{path.stem}.f32.gguf", work / f"{stem}.base.kld"
    if not f32.exists():
        _run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(path), str(f32), "F32"],
             work / f"{stem}.q.log")
    common = ["-f", str(text), "-c", str(ctx), "--chunks", str(chunks), "-t", str(os.cpu_count() or 2)]
    if not base.exists():
        _run([str(bin_dir / "llama-perplexity"), "-m", str(f32), *common, "--kl-divergence-base", str(base)],
             work / f"{stem}.base.log")
    out = _run([str(bin_dir / "llama-perplexity"), "-m", str(path), *common, "--kl-divergence-base", str(base),
                "--kl-divergence"], work / f"{stem}.kld.log")
    got = {k: float(re.search(p, out).group(1)) for k, p in _FIELDS.items()}
    got["same_top"] /= 100
    return got


def llmcli(path: Path, text: Path, ctx: int, chunks: int, int8: bool = False) -> dict:
    env = {**os.environ, **({"LLMCLI_ACTIVATIONS": "int8"} if int8 else {})}
    r = subprocess.run([sys.executable, "-m", "llmcli", "perplexity", str(path), "-f", str(text), "-c", str(ctx),
                        "--chunks", str(chunks), "--reference", "f32", "--json"],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"llmcli perplexity failed: {r.stderr}")
    out = json.loads(r.stdout)
    return {"kld": out["kld_mean"], "same_top": out["same_top"], "ppl": out["ppl"], "ppl_ref": out["ppl_reference"],
            "ratio": out["ppl_ratio"], "step": out["step"], "windows": out["windows"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="GGUF files, each FILE or FILE:CHUNKS")
    p.add_argument("--file", required=True, type=Path, help="the text")
    p.add_argument("--llama-cpp", required=True, type=Path, help="llama.cpp's build/bin")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--work", type=Path, default=Path("/tmp/kld_vs_llamacpp"))
    p.add_argument("--int8", action="store_true", help="also llmcli with llama.cpp's int8 activations everywhere")
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in a.files:
        name, _, n = spec.partition(":")
        path, chunks = Path(name).expanduser(), int(n or a.chunks)
        theirs = llama_cpp(path, a.file, a.ctx, chunks, a.llama_cpp, a.work)
        rows.append((path.name, chunks, "llama.cpp (int8 activations)", theirs))
        mine = llmcli(path, a.file, a.ctx, chunks)
        rows.append((path.name, chunks, f"llmcli default: {mine['step']}", mine))
        if a.int8:
            coarse = llmcli(path, a.file, a.ctx, chunks, int8=True)
            rows.append((path.name, chunks, "llmcli, LLMCLI_ACTIVATIONS=int8", coarse))
    print(f"windows of {a.ctx} tokens scored on their second half; text {a.file.name}")
    print("| file | windows | path | mean KLD | same top | PPL | PPL of the F32 reference | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for file, chunks, what, r in rows:
        print(f"| {file} | {chunks} | {what} | {r['kld']:.6f} | {100 * r['same_top']:.2f} % | {r['ppl']:.4f} | "
              f"{r['ppl_ref']:.4f} | {r['ratio']:.4f} |")


if __name__ == "__main__":
    main()
