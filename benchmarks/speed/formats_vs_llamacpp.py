"""Every way a user runs an HF model with llmcli, against llama.cpp on the same weights (issue 35's
table): the bf16 folder as it is against llama.cpp's F16, `--quant q8` against Q8_0, `--quant q4`
against Q4_0, and the Q4_0 GGUF itself run by both (and `q8_int8`: q8 with llama.cpp's int8
activations instead of its int8x2, what they cost). The files are made by `benchmarks.hf_folders`
(llama.cpp's own convert_hf_to_gguf.py and llama-quantize).

    python -m benchmarks.speed.formats_vs_llamacpp --llama-cpp LLAMA_CPP/build/bin [--models smollm2,qwen2-1.5b]
        [--ways bf16,q8,q4,gguf,q8_int8] [--rounds 3] [-n 64] [-p 512] [-t 2] [--baseline CHECKOUT]

Each round, for each model and way in turn: `llmcli run MODEL PROMPT -n 64 -t 2 -v --ignore-eos`
(a subprocess with default flags otherwise: its -v line gives decode, prefill and the first-token time,
wait4 its peak RSS), `llmcli bench MODEL -p 512 -n 0 -r 1` with the same --quant (pp512), and
`llama-bench -m FILE -p 512 -n 64 -t 2 -r 1` (pp512 and tg64; once a round per file). The table has
the medians over rounds (peak RSS: the largest), and the step `run` took. With --baseline, each way
is run again right after by another checkout's llmcli (a worktree of the commit before a change):
before and after, interleaved in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from llmcli.bench.baseline_llamabench import parse_json

from ..hf_folders import QWEN2_1_5B, SMOLLM2, folder, gguf_file
from ..machine import cpu_name
from ..shape_configs import OUT

MODELS = {"smollm2": SMOLLM2, "qwen2-1.5b": QWEN2_1_5B}
PROMPT = "Tell me a long story about a dragon."
RUN_STATS = (r"(\d+) prompt tokens, (\d+) generated .*?; ttft (\d+) ms; prefill ([0-9.]+) t/s; "
             r"decode ([0-9.]+) t/s")


@dataclass(frozen=True)
class Way:
    key: str
    label: str
    quant: str | None  # llmcli's --quant
    gguf_type: str  # the llama.cpp file it is compared with
    runs_folder: bool = True  # else llmcli runs that GGUF file itself
    cwd: str | None = None  # the checkout whose llmcli runs (--baseline), else this one


WAYS = {w.key: w for w in (
    Way("bf16", "the bf16 folder as it is / F16", None, "F16"),
    Way("q8", "folder `--quant q8` / Q8_0", "q8", "Q8_0"),
    Way("q4", "folder `--quant q4` / Q4_0", "q4", "Q4_0"),
    Way("gguf", "the Q4_0 GGUF, both", None, "Q4_0", runs_folder=False),
    Way("q8_int8", "folder `--quant q8` with int8 activations / Q8_0", "q8_int8", "Q8_0"),
)}
DEFAULT_WAYS = "bf16,q8,q4,gguf"


def preset_file(quant: str | None) -> str | None:
    """--quant's argument: a shipped preset's name, or for q8_int8 a copy of q8.toml with int8
    activations (written to the temporary folder)."""
    if quant != "q8_int8":
        return quant
    from llmcli.quant.presets import shipped_dir

    text = (shipped_dir() / "q8.toml").read_text(encoding="utf-8")
    path = Path(tempfile.gettempdir()) / "q8_int8.toml"
    path.write_text(text.replace('activations = "int8x2"', 'activations = "int8"'), encoding="utf-8")
    return str(path)


@dataclass
class Figures:
    decode: list[float] = field(default_factory=list)
    prefill: list[float] = field(default_factory=list)  # run's own prompt
    ttft_ms: list[float] = field(default_factory=list)
    pp: list[float] = field(default_factory=list)  # llmcli bench ppN
    rss: list[int] = field(default_factory=list)
    step: str = ""
    failed: str = ""


def measured(cmd: list[str], cwd: str | None = None) -> tuple[int, str, str, int]:
    """(exit status, stdout, stderr, peak RSS in bytes) of one subprocess, its own rusage from wait4."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, cwd=cwd)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read(), err.read(), usage.ru_maxrss * 1024  # Linux: kilobytes


def last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no message"])[-1][:200]


def llmcli_run(target: Path, way: Way, n: int, threads: int, fig: Figures) -> None:
    cmd = [sys.executable, "-m", "llmcli", "run", str(target), PROMPT, "-n", str(n), "-t", str(threads), "-v",
           "--ignore-eos", "--seed", "7"] + (["--quant", preset_file(way.quant)] if way.quant else [])
    recorded_run(cmd, fig, way.cwd)


def recorded_run(cmd: list[str], fig: Figures, cwd=None) -> re.Match | None:
    """One `llmcli run ... -v` (cmd, run in `cwd`): its first-token time, prefill, decode and peak RSS
    appended to fig, and the -v line's match (group 1: the prompt's tokens); None when it failed
    (fig.failed says why)."""
    rc, _, err, rss = measured(cmd, cwd)
    flat = re.sub(r"\s+", " ", err)
    stats = re.search(RUN_STATS, flat)
    if rc != 0 or stats is None:
        fig.failed = f"run exit {rc}: {last_line(err)}"
        return None
    fig.ttft_ms.append(float(stats.group(3)))
    fig.prefill.append(float(stats.group(4)))
    fig.decode.append(float(stats.group(5)))
    fig.rss.append(rss)
    step = re.search(r"decode step: ([^\n]+)", err)
    fig.step = step.group(1).strip() if step else "?"
    return stats


def llmcli_pp(target: Path, way: Way, p: int, threads: int, fig: Figures) -> None:
    cmd = [sys.executable, "-m", "llmcli", "bench", str(target), "-p", str(p), "-n", "0", "-r", "1", "-t",
           str(threads), "-o", "json", "-q", preset_file(way.quant) or "none"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=way.cwd)
    if done.returncode != 0:
        fig.failed = fig.failed or f"bench exit {done.returncode}: {last_line(done.stderr)}"
        return
    rows = [r for r in json.loads(done.stdout) if r["test"] == f"pp{p}" and r["engine"] == "llmcli"]
    fig.pp.append(rows[0]["tokens_per_s"])


def llama_bench(binary: Path, file: Path, p: int, n: int, threads: int) -> dict[str, float]:
    """{"pp": t/s, "tg": t/s} from one `llama-bench -r 1` invocation."""
    return {test[:2]: tps for test, tps in llama_bench_tests(binary, file, p, n, threads)[0].items()}


def llama_bench_tests(binary: Path, file: Path, p: int | str, n: int | str,
                      threads: int) -> tuple[dict[str, float], int]:
    """({"pp512": t/s, "tg64": t/s, ...}, peak RSS in bytes) of one `llama-bench -r 1` invocation; p and n
    may list sizes ("512,1,16"; 0: none)."""
    rc, out, err, rss = measured([str(binary), "-m", str(file), "-p", str(p), "-n", str(n), "-t", str(threads),
                                  "-r", "1", "-o", "json"])
    if rc != 0:
        sys.exit(f"llama-bench failed (exit {rc}) on {file}: {last_line(err)}")
    return {f"{t['kind']}{t['n']}": t["n"] / t["seconds"][0] for t in parse_json(out)}, rss


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def ratio(a: float | None, b: float | None) -> str:
    return f"**{a / b:.2f}x**" if a and b else "–"


def fmt(x: float | None) -> str:
    return f"{x:.1f}" if x is not None else "–"


def table(name: str, ways: list[Way], figs: dict[str, Figures], base: dict[str, dict[str, list[float]]],
          sizes: dict[str, int], p: int, n: int) -> list[str]:
    lines = [f"| {name}: way (llmcli / llama.cpp) | llmcli step | llmcli decode t/s | llama.cpp tg{n} t/s | ratio | "
             f"llmcli pp{p} t/s | llama.cpp pp{p} t/s | ratio | run: prefill t/s, first token ms | "
             "run's peak RSS / llama.cpp file |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for w in ways:
        f, b = figs[w.key], base[w.gguf_type]
        tg, pp = median(b["tg"]), median(b["pp"])
        dec, llm_pp = median(f.decode), median(f.pp)
        size = sizes[w.gguf_type]
        rss = f"{max(f.rss) / 1e6:.0f} MB / {size / 1e6:.0f} MB ({max(f.rss) / size:.2f}x)" if f.rss else "–"
        step = f.step + (f" ({f.failed})" if f.failed else "")
        lines.append(f"| {w.label} | {step} | {fmt(dec)} | {fmt(tg)} | {ratio(dec, tg)} | {fmt(llm_pp)} | {fmt(pp)} | "
                     f"{ratio(llm_pp, pp)} | {fmt(median(f.prefill))}, {fmt(median(f.ttft_ms))} | {rss} |")
    return lines



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", type=Path, required=True, help="the folder with llama-bench (LLAMA_CPP/build/bin)")
    ap.add_argument("--models", default="smollm2,qwen2-1.5b", help=f"of {', '.join(MODELS)} (default: both)")
    ap.add_argument("--ways", default=DEFAULT_WAYS, help=f"of {', '.join(WAYS)} (default: {DEFAULT_WAYS})")
    ap.add_argument("--dir", type=Path, default=OUT, help="where benchmarks.hf_folders wrote them (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=64, help="tokens generated (default 64)")
    ap.add_argument("-p", type=int, default=512, help="prompt size of the prefill test (default 512)")
    ap.add_argument("-t", type=int, default=2, help="threads (default 2)")
    ap.add_argument("--baseline", help="another checkout of llmcli (a git worktree of the commit before a change): "
                                       "each way run by its llmcli too, right after this one's")
    a = ap.parse_args()
    binary = a.llama_cpp.expanduser() / "llama-bench"
    if not binary.exists():
        sys.exit(f"no llama-bench in {a.llama_cpp}; build llama.cpp's tools as benchmarks/README.md says")
    names = [MODELS[m.strip()] for m in a.models.split(",") if m.strip()]
    ways = [WAYS[w.strip()] for w in a.ways.split(",") if w.strip()]
    if a.baseline:  # (python -m llmcli from that folder imports its llmcli)
        base_dir = str(Path(a.baseline).expanduser().resolve())
        ways = [v for w in ways for v in (w, Way(f"{w.key}@baseline", f"{w.label}, baseline", w.quant, w.gguf_type,
                                                 w.runs_folder, base_dir))]
    types = list(dict.fromkeys(w.gguf_type for w in ways))
    for name in names:
        needed = [folder(name, a.dir)] + [gguf_file(name, t, a.dir) for t in types]
        missing = [str(p) for p in needed if not p.exists()]
        if missing:
            sys.exit(f"missing {', '.join(missing)}: make them with python -m benchmarks.hf_folders (see its --help)")
    load_before = os.getloadavg()[0]
    figs = {name: {w.key: Figures() for w in ways} for name in names}
    base = {name: {t: {"pp": [], "tg": []} for t in types} for name in names}
    for r in range(a.rounds):
        for name in names:
            timed = set()
            for w in ways:
                target = folder(name, a.dir) if w.runs_folder else gguf_file(name, w.gguf_type, a.dir)
                f = figs[name][w.key]
                llmcli_run(target, w, a.n, a.t, f)
                llmcli_pp(target, w, a.p, a.t, f)
                if w.gguf_type not in timed:  # each llama.cpp file once a round, right after its first way
                    timed.add(w.gguf_type)
                    for kind, tps in llama_bench(binary, gguf_file(name, w.gguf_type, a.dir), a.p, a.n, a.t).items():
                        base[name][w.gguf_type][kind].append(tps)
                print(f"round {r + 1} {name} {w.key}: llmcli decode {fmt(f.decode[-1] if f.decode else None)}, "
                      f"pp{a.p} {fmt(f.pp[-1] if f.pp else None)}; llama.cpp tg{a.n} "
                      f"{fmt(base[name][w.gguf_type]['tg'][-1])}, pp{a.p} {fmt(base[name][w.gguf_type]['pp'][-1])}"
                      + (f" [{f.failed}]" if f.failed else ""), file=sys.stderr, flush=True)
    print(f"\n{cpu_name()}, {a.t} threads, {a.rounds} rounds (medians); load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")
    for name in names:
        sizes = {t: gguf_file(name, t, a.dir).stat().st_size for t in types}
        print()
        print("\n".join(table(name, ways, figs[name], base[name], sizes, a.p, a.n)))


if __name__ == "__main__":
    main()
