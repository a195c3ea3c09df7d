"""llama.cpp's own `llama-bench` (a native build) timed on the same GGUF file, as a subprocess.

The anchor the speed goals are stated against: a native build, same file, same threads, same run.
Each repetition is one whole `llama-bench -r 1` invocation (it loads the file, warms up, times one
run), alternated with llmcli's repetitions so that both see the same machine load.

Build it from the llama-cpp-python sdist (its vendored llama.cpp):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build -j --target llama-bench
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import LlmcliError
from .measure import Result

ENV = "LLAMA_BENCH"
HOW_TO_BUILD = ("build it from the llama-cpp-python sdist: pip download --no-deps --no-binary :all: "
                "llama-cpp-python==0.3.36, untar, cd vendor/llama.cpp, cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF "
                "&& cmake --build build -j --target llama-bench; then pass --llama-bench PATH or set LLAMA_BENCH")


class LlamaBenchError(LlmcliError):
    """llama-bench is missing, failed, or printed something unreadable."""


def find_binary(path: str | None = None) -> Path:
    """--llama-bench PATH, else $LLAMA_BENCH, else `llama-bench` on PATH; an error that says how to build one."""
    given = path or os.environ.get(ENV)
    if given:
        p = Path(given).expanduser()
        if p.is_dir():
            p = p / "llama-bench"
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise LlamaBenchError(f"no llama-bench executable at {p}; {HOW_TO_BUILD}")
        return p
    found = shutil.which("llama-bench")
    if found is None:
        raise LlamaBenchError(f"--baseline llama-bench needs llama.cpp's llama-bench, not found on PATH; {HOW_TO_BUILD}")
    return Path(found)


def parse_json(text: str) -> list[dict]:
    """llama-bench's `-o json` (a list of tests) -> per test: the kind and size, the depth, the seconds of
    each repetition, and the model's size, parameter count and quantization as llama-bench names them."""
    try:
        tests = json.loads(text)
    except json.JSONDecodeError as e:
        raise LlamaBenchError(f"llama-bench printed no JSON ({e.msg}); run it by hand to see why") from None
    out = []
    for t in tests if isinstance(tests, list) else []:
        try:
            n_prompt, n_gen = int(t["n_prompt"]), int(t["n_gen"])
            out.append({
                "kind": "tg" if n_gen else "pp", "n": n_gen or n_prompt, "depth": int(t.get("n_depth", 0)),
                "seconds": [ns / 1e9 for ns in t["samples_ns"]],
                "model_size": int(t.get("model_size", 0)), "params": int(t.get("model_n_params", 0)),
                "quant": _quant(str(t.get("model_type", ""))),
                "threads": int(t.get("n_threads", 0)),
            })
        except (KeyError, TypeError, ValueError) as e:
            raise LlamaBenchError(f"llama-bench's JSON lacks {e}; is it a llama-bench from 2025 or later?") from None
    return out


def _quant(model_type: str) -> str:
    """"qwen2 1B Q4_K - Medium" (architecture, size class, file type) -> "Q4_K - Medium"."""
    parts = model_type.split(" ", 2)
    return parts[2] if len(parts) == 3 else "?"


class LlamaBenchBaseline:
    """Same interface as baseline_llamacpp.LlamaCppBaseline: once(kind, n, depth) and result(test, common)."""

    engine = "llama-bench"
    needs_warm_up = False  # every invocation warms up by itself before its timed run

    def __init__(self, gguf: Path, threads: int, binary: Path):
        if not str(gguf).endswith(".gguf"):
            raise LlamaBenchError(f"llama-bench reads GGUF files only; {gguf} is not one")
        self.gguf, self.threads, self.binary = Path(gguf), threads, Path(binary)
        self.info: dict = {}

    def command(self, kind: str, n: int, depth: int) -> list[str]:
        p, g = (n, 0) if kind == "pp" else (0, n)
        return [str(self.binary), "-m", str(self.gguf), "-t", str(self.threads), "-p", str(p), "-n", str(g),
                "-d", str(depth), "-r", "1", "-o", "json"]

    def once(self, kind: str, n: int, depth: int) -> tuple[float, float | None]:
        """(seconds of one timed run, None: llama-bench does not report a first-token time)."""
        cmd = self.command(kind, n, depth)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise LlamaBenchError(f"could not run {self.binary}: {e.strerror}; {HOW_TO_BUILD}") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise LlamaBenchError(f"llama-bench failed (exit {done.returncode}) on {self.gguf.name}: {last}")
        tests = [t for t in parse_json(done.stdout) if t["kind"] == kind and t["n"] == n]
        if not tests or not tests[0]["seconds"]:
            raise LlamaBenchError(f"llama-bench reported no {kind}{n} test; run {' '.join(cmd)} to see why")
        self.info = tests[0]
        return tests[0]["seconds"][0], None

    def result(self, test: str, common: dict) -> Result:
        info = self.info or {}
        return Result(**{**common, "test": test, "engine": self.engine, "quant": f"gguf ({info.get('quant', '?')})",
                         "size_bytes": info.get("model_size") or self.gguf.stat().st_size,
                         "params": info.get("params") or common["params"], "load_s": 0.0, "peak_mem_bytes": 0})
