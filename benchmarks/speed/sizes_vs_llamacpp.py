"""llmcli against llama.cpp on the same GGUF file, for models of growing size (issue 36): decode,
pp512, the first token of short prompts from a fresh process, peak RSS, and how near each decode comes
to this machine's memory roofline. The files: the shaped Q4_K_M models of `benchmarks.shapes`
(Qwen2.5-1.5B, Llama-3.2-3B, Llama-3.1-8B; random weights, real layer shapes), or any GGUF.

    python -m benchmarks.speed.sizes_vs_llamacpp FILE [FILE ...] --llama-cpp LLAMA_CPP/build/bin
        [--rounds 3] [-n 128] [-p 512] [--ttft 1,16,32,64] [-t 2] [-c CTX]

Each round, for each file in turn (interleaved: both engines see the same machine load):
  - `llmcli run FILE PROMPT -n 128 -t 2 -v --temp 0 --ignore-eos` (a subprocess, run's defaults
    otherwise): decode t/s from its -v line, and its peak RSS (wait4);
  - `llmcli bench FILE -p 512 -n 0 -r 1 -t 2`: pp512, timed with the prefill of the step `run` takes
    (one warm-up first, as llama-bench's);
  - for each --ttft size N, `llmcli run FILE PROMPT_N --raw -n 1 -t 2 -v --temp 0` from a fresh process,
    PROMPT_N being N tokens ("hello hello ..."): the -v line's first-token time;
  - `llama-bench -m FILE -t 2 -p 512,1,16,32,64 -n 128 -r 1 -o json`: tg128, pp512, and ppN, whose time
    N / (ppN t/s) is llama.cpp's first-token time for N tokens (a loaded model: no start-up).
The tables have the medians over rounds (peak RSS: the largest); ratios are llmcli / llama.cpp (of t/s:
above 1, llmcli faster; of first-token ms: above 1, llmcli slower).
Memory: run's peak RSS against the file plus the f16 KV of the tokens the run held (prompt + n; run
reserves its context's KV with torch.empty, whose pages count only once written), and llama-bench's
peak RSS beside it (its contexts are only as long as its tests). Roofline: bytes a decode
token reads (the file's tensors, less the token embedding when an output head is stored: a row of it
is read, not all; of a mixture's expert tensors, `*_exps`, the share of the experts a token runs) x t/s / the best read bandwidth of benchmarks/kernels/read_bandwidth.py with -t
threads (measured before and after the rounds).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from llmcli.formats.gguf import model_args, open_gguf

from ..kernels.read_bandwidth import bandwidth
from ..machine import cpu_name
from .formats_vs_llamacpp import (PROMPT, WAYS, Figures, fmt, llama_bench_tests, llmcli_pp, median, ratio,
                                  recorded_run)

KV_BYTES = 2  # run's KV cache on the CPU: f16


@dataclass(frozen=True)
class Sizes:
    """What a file's decode reads and holds, from its header."""

    file_bytes: int
    token_bytes: int  # read a decode token: every tensor but the embedding table when a head is stored
    # (a mixture's expert tensors: the share of its experts a token runs, as the memory plan's active bytes)
    kv_per_token: int  # f16 K and V of one token, all layers
    label: str

    @classmethod
    def of(cls, path: Path) -> Sizes:
        reader = open_gguf(path)
        names = {t.name for t in reader.tensors}
        args = model_args(reader.metadata, names, reader)
        untied = "output.weight" in names
        share = args.num_experts_per_tok / args.num_experts if getattr(args, "num_experts", 0) else 1.0
        token = sum(0 if untied and t.name == "token_embd.weight" else
                    t.n_bytes * share if "_exps." in t.name else t.n_bytes for t in reader.tensors)
        kv = args.num_hidden_layers * 2 * args.num_key_value_heads * args.head_dim * KV_BYTES
        types = sorted({t.tensor_type.name for t in reader.tensors if len(t.shape) > 1})
        label = f"{path.name} ({path.stat().st_size / 1e9:.2f} GB, {'/'.join(types)})"
        return cls(path.stat().st_size, int(token), kv, label)


@dataclass
class FileFigures:
    run: Figures = field(default_factory=Figures)  # the -n N run, and bench's ppP
    prompt_tokens: int = 0  # the run's prompt, with its template
    ttft: dict[int, Figures] = field(default_factory=dict)  # N -> the -n 1 runs of N-token prompts
    ttft_tokens: dict[int, int] = field(default_factory=dict)  # N -> the tokens run counted
    base: dict[str, list[float]] = field(default_factory=dict)  # llama-bench test -> t/s each round
    base_rss: list[int] = field(default_factory=list)  # llama-bench's peak RSS each round


def n_tokens_prompt(n: int) -> str:
    """N tokens of SmolLM2's (and most byte-level BPE) vocabularies: "hello" then " hello" N-1 times."""
    return " ".join(["hello"] * n)


def llmcli(target: Path, prompt: str, n: int, threads: int, ctx: int | None, raw: bool) -> list[str]:
    return ([sys.executable, "-m", "llmcli", "run", str(target), prompt, "-n", str(n), "-t", str(threads), "-v",
             "--temp", "0", "--ignore-eos"] + (["--raw"] if raw else []) + (["-c", str(ctx)] if ctx else []))


def one_round(path: Path, f: FileFigures, binary: Path, a) -> None:
    stats = recorded_run(llmcli(path, PROMPT, a.n, a.t, a.ctx, raw=False), f.run)
    if stats:
        f.prompt_tokens = int(stats.group(1))
    llmcli_pp(path, WAYS["gguf"], a.p, a.t, f.run)  # the file as stored: -q none
    for n in a.ttft:
        fig = f.ttft.setdefault(n, Figures())
        stats = recorded_run(llmcli(path, n_tokens_prompt(n), 1, a.t, a.ctx, raw=True), fig)
        if stats:
            f.ttft_tokens[n] = int(stats.group(1))
    sizes = ",".join(str(p) for p in [a.p, *a.ttft])
    tests, rss = llama_bench_tests(binary, path, sizes, a.n, a.t)
    for test, tps in tests.items():
        f.base.setdefault(test, []).append(tps)
    f.base_rss.append(rss)


def last(xs: list[float]) -> float | None:
    return xs[-1] if xs else None


def speed_table(files: list[Path], figs: dict[Path, FileFigures], sizes: dict[Path, Sizes], gbs: float,
                a) -> list[str]:
    lines = [f"| file | llmcli step | llmcli decode t/s | llama.cpp tg{a.n} t/s | ratio | GB a token | roofline share: "
             f"llmcli / llama.cpp | llmcli pp{a.p} t/s | llama.cpp pp{a.p} t/s | ratio | "
             "run's peak RSS / file + KV (ratio) | llama-bench's peak RSS |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for path in files:
        f, s = figs[path], sizes[path]
        dec, tg = median(f.run.decode), median(f.base.get(f"tg{a.n}", []))
        pp, base_pp = median(f.run.pp), median(f.base.get(f"pp{a.p}", []))

        def share(tps):
            return f"{tps * s.token_bytes / 1e9 / gbs:.0%}" if tps else "–"

        held = s.file_bytes + s.kv_per_token * (f.prompt_tokens + a.n)
        rss = (f"{max(f.run.rss) / 1e6:.0f} MB / {held / 1e6:.0f} MB ({max(f.run.rss) / held:.2f}x)"
               if f.run.rss else "–")
        base_rss = f"{max(f.base_rss) / 1e6:.0f} MB" if f.base_rss else "–"
        step = f.run.step + (f" ({f.run.failed})" if f.run.failed else "")
        lines.append(f"| {s.label} | {step} | {fmt(dec)} | {fmt(tg)} | {ratio(dec, tg)} | {s.token_bytes / 1e9:.2f} | "
                     f"{share(dec)} / {share(tg)} | {fmt(pp)} | {fmt(base_pp)} | {ratio(pp, base_pp)} | {rss} | "
                     f"{base_rss} |")
    return lines


def ttft_table(files: list[Path], figs: dict[Path, FileFigures], a) -> list[str]:
    lines = ["| file | " + " | ".join(f"{n} tokens: llmcli / llama.cpp ms (ratio)" for n in a.ttft) + " |",
             "|---|" + "---:|" * len(a.ttft)]
    for path in files:
        f, cells = figs[path], []
        for n in a.ttft:
            ours = median(f.ttft[n].ttft_ms) if n in f.ttft else None
            tps = median(f.base.get(f"pp{n}", []))
            theirs = n / tps * 1000 if tps else None
            counted = f.ttft_tokens.get(n, n)
            note = f" [{counted} tokens]" if counted != n else ""
            failed = f" ({f.ttft[n].failed})" if n in f.ttft and f.ttft[n].failed else ""
            cells.append(f"{fmt(ours)} / {fmt(theirs)} ({ratio(ours, theirs).strip('*')}){note}{failed}")
        lines.append(f"| {path.name} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path, help="GGUF files (e.g. ~/.cache/llmcli-bench/*-shapes.q4_k_m.gguf)")
    ap.add_argument("--llama-cpp", type=Path, required=True, help="the folder with llama-bench (LLAMA_CPP/build/bin)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=128, help="tokens generated (default 128)")
    ap.add_argument("-p", type=int, default=512, help="prompt size of the prefill test (default 512)")
    ap.add_argument("--ttft", default="1,16,32,64", help="prompt sizes of the first-token test (default 1,16,32,64)")
    ap.add_argument("-t", type=int, default=2, help="threads (default 2)")
    ap.add_argument("-c", "--ctx", type=int, help="run's --ctx-size (default: run's own choice, the model's context "
                                                  "as memory allows)")
    a = ap.parse_args()
    a.ttft = [int(x) for x in a.ttft.split(",") if x.strip()]
    binary = a.llama_cpp.expanduser() / "llama-bench"
    if not binary.exists():
        sys.exit(f"no llama-bench in {a.llama_cpp}; build llama.cpp's tools as benchmarks/README.md says")
    files = [p.expanduser() for p in a.files]
    missing = [str(p) for p in files if not p.exists()]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: make them with python -m benchmarks.shapes (see its docstring)")
    sizes = {p: Sizes.of(p) for p in files}
    load_before = os.getloadavg()[0]
    gbs = [bandwidth([a.t])[a.t]]
    figs = {p: FileFigures() for p in files}
    for r in range(a.rounds):
        for path in files:
            f = figs[path]
            one_round(path, f, binary, a)
            print(f"round {r + 1} {path.name}: llmcli decode {fmt(last(f.run.decode))}, pp{a.p} {fmt(last(f.run.pp))}; "
                  f"llama.cpp tg{a.n} {fmt(last(f.base.get(f'tg{a.n}', [])))}, "
                  f"pp{a.p} {fmt(last(f.base.get(f'pp{a.p}', [])))}" + (f" [{f.run.failed}]" if f.run.failed else ""),
                  file=sys.stderr, flush=True)
    gbs.append(bandwidth([a.t])[a.t])
    print(f"\n{cpu_name()}, {a.t} threads, {a.rounds} rounds (medians); read bandwidth {max(gbs):.1f} GB/s "
          f"(best of {', '.join(f'{g:.1f}' for g in gbs)}); load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after\n")
    print("\n".join(speed_table(files, figs, sizes, max(gbs), a)))
    print("\nFirst token from a fresh process (llmcli run's ttft) against llama-bench's ppN time (N / t/s); "
          "ratio above 1: llmcli slower\n")
    print("\n".join(ttft_table(files, figs, a)))


if __name__ == "__main__":
    main()
