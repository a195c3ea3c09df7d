"""`llmcli run` on a GPU: prefill and decode speed per model, read from `-v` (its stats line), the
median of a few rounds, one row a model as soon as it is measured. Files that are absent are skipped
with one line; so are rounds that would start past --deadline-s.

    python -m benchmarks.speed.gpu_speed FILE [FILE ...] [--device cuda] [-p 512] [-n 128] [-r 2] [--deadline-s 300]

Each round is one `llmcli run FILE - --raw -n N --ignore-eos --temp 0 -c CTX -v` with a prompt of
about P tokens on stdin (a text cut to P tokens of the file's own tokenizer), in a new process: load,
prefill and decode as a user's command runs them. Part of benchmarks/gpu_check.sh.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

STATS = re.compile(r"(\d+) prompt tokens, (\d+) generated .*?; ttft (\d+) ms; prefill ([0-9.]+) t/s; decode ([0-9.]+) t/s")
LOADED = re.compile(r"loaded .*? \((.*)\) in ([0-9.]+) s; context")
STEP = re.compile(r"decode step: (.*)")
TEXT = ("The history of the river is long. It rose in the hills, ran through forests and fields, turned mills, "
        "carried boats of grain and timber to the sea, flooded the low town every spring, and was walled, "
        "bridged, dredged and painted by everyone who lived beside it. ")


def prompt_of(file: str, tokens: int) -> str:
    """About `tokens` tokens of plain text, cut by the file's own tokenizer."""
    from llmcli.formats.open import open_model_file

    tok = open_model_file(Path(file)).tokenizer
    ids = tok.encode(TEXT * (tokens // 8 + 1))[:tokens]
    return tok.decode(ids)


def one_run(file: str, prompt: str, args) -> dict:
    cmd = [sys.executable, "-m", "llmcli", "run", file, "-", "--raw", "-n", str(args.n), "--ignore-eos", "--temp", "0",
           "-c", str(args.ctx), "--device", args.device, "-v", *args.extra]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, input=prompt, capture_output=True, text=True, timeout=args.timeout,
                       env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    stats, loaded, step = STATS.search(r.stderr), LOADED.search(r.stderr), STEP.search(r.stderr)
    if stats is None:
        raise RuntimeError("no stats line in -v's output")
    return {"prompt": int(stats.group(1)), "generated": int(stats.group(2)), "ttft_ms": int(stats.group(3)),
            "prefill": float(stats.group(4)), "decode": float(stats.group(5)), "wall": wall,
            "runs_as": loaded.group(1) if loaded else "?", "load_s": float(loaded.group(2)) if loaded else float("nan"),
            "step": step.group(1).strip() if step else "?"}


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        return f"{p.name} ({p.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, CUDA {torch.version.cuda}"
    from benchmarks.machine import cpu_name

    return f"{cpu_name()}, torch {torch.__version__}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("-p", type=int, default=512, help="prompt tokens (default 512)")
    ap.add_argument("-n", type=int, default=128, help="tokens to generate (default 128)")
    ap.add_argument("-c", "--ctx", type=int, default=2048, help="--ctx-size (default 2048: a small KV cache for every model)")
    ap.add_argument("-r", "--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300, help="seconds one run may take (default 300)")
    ap.add_argument("--deadline-s", type=float, default=None, help="start no run after this many seconds")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more `llmcli run` flags, last")
    args = ap.parse_args()
    end = time.monotonic() + args.deadline_s if args.deadline_s else float("inf")

    print(f"`llmcli run` on {args.device}: {device_name(args.device)}; {time.strftime('%Y-%m-%d')}; "
          f"prompt ~{args.p} tokens (--raw), -n {args.n} --ignore-eos, -c {args.ctx}; median of {args.rounds}", flush=True)
    print("| model | size | runs as | load s | prompt | prefill t/s | ttft ms | decode t/s | decode step |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for file in args.files:
        path = Path(file).expanduser()
        if not path.exists():
            print(f"absent, skipped: {path}", flush=True)
            continue
        size = path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        runs, why = [], ""
        try:
            prompt = prompt_of(str(path), args.p)
            for _ in range(args.rounds):
                if time.monotonic() >= end:
                    why = "out of time"
                    break
                runs.append(one_run(str(path), prompt, args))
        except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as e:
            why = str(e).strip() or type(e).__name__
        if not runs:
            print(f"{path.name}: not measured ({why})", flush=True)
            continue
        med = {k: statistics.median(r[k] for r in runs) for k in ("load_s", "prompt", "prefill", "ttft_ms", "decode")}
        last = runs[-1]
        note = f" ({len(runs)} of {args.rounds} rounds: {why})" if why else ""
        mib = size / 2**20
        size_text = f"{mib:.0f} MiB" if mib < 1024 else f"{mib / 1024:.2f} GiB"
        print(f"| {path.name} | {size_text} | {last['runs_as']} | {med['load_s']:.1f} | {med['prompt']:.0f} | "
              f"{med['prefill']:.1f} | {med['ttft_ms']:.0f} | {med['decode']:.1f} | {last['step']}{note} |", flush=True)


if __name__ == "__main__":
    main()
