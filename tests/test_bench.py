"""`llmcli bench` on a tiny model: formats agree, stddev is right, one row per preset and size."""

from __future__ import annotations

import csv
import io
import json
import math
import sys

import pytest
from conftest import run_cli

from llmcli import native
from llmcli.bench.measure import Result, format_results, parse_sizes, stddev
from llmcli.errors import InvalidParameterError


def test_stddev_of_known_samples():
    assert stddev([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(math.sqrt(32 / 7))  # sample (n - 1) stddev
    assert stddev([3.0]) == 0.0 and stddev([]) == 0.0
    r = Result("m", 1, 1, "cpu", 2, "none", "tg8", samples=[10.0, 12.0, 14.0])
    assert r.mean == 12.0 and r.stddev == pytest.approx(2.0)


def test_parse_sizes():
    assert parse_sizes("128,512", "-p") == [128, 512]
    assert parse_sizes("0", "-p") == [0]
    for bad in ("a,b", "-1", ""):
        with pytest.raises(InvalidParameterError):
            parse_sizes(bad, "-p")


def _parse(text: str, fmt: str) -> list[dict]:
    """Each format read back as (quant, test, t/s, stddev) rows."""
    if fmt == "json":
        return [{k: r[k] for k in ("quant", "test", "tokens_per_s", "stddev")} for r in json.loads(text)]
    if fmt == "jsonl":
        return [{k: r[k] for k in ("quant", "test", "tokens_per_s", "stddev")} for r in map(json.loads, text.splitlines())]
    if fmt == "csv":
        return [{"quant": r["quant"], "test": r["test"], "tokens_per_s": float(r["tokens_per_s"]),
                 "stddev": float(r["stddev"])} for r in csv.DictReader(io.StringIO(text))]
    lines = text.splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    out = []
    for line in lines[2:]:
        cells = dict(zip(head, (c.strip() for c in line.strip("|").split("|"))))
        mean, sd = cells["t/s"].split(" ± ")
        out.append({"quant": cells["quant"], "test": cells["test"], "tokens_per_s": float(mean), "stddev": float(sd)})
    return out


def test_every_format_holds_the_same_numbers(tiny_folder):
    """One measurement, written in each format and read back: the same rows and numbers."""
    from llmcli.bench import measure
    from llmcli.runtime.runtime import open_model

    results = []
    for preset in ("none", "q8"):
        rt = open_model(str(tiny_folder), device="cpu", threads=1, ctx_size=64, quant=None if preset == "none" else preset)
        results += [r for event, r in measure.run_tests(rt, "tiny", preset, [16, 32], [8], 0, 2) if event == "done"]
    # one row per preset x test: 2 presets x (pp16, pp32, tg8)
    assert [(r.quant, r.test) for r in results] == [(q, t) for q in ("none", "q8") for t in ("pp16", "pp32", "tg8")]
    for r in results:
        assert len(r.samples) == 2 and r.load_s > 0 and r.ttft_ms > 0 and r.peak_mem_bytes > 0
    parsed = {fmt: _parse(format_results(results, fmt), fmt) for fmt in ("md", "csv", "json", "jsonl")}
    for fmt, rows in parsed.items():
        assert [(r["quant"], r["test"]) for r in rows] == [(r.quant, r.test) for r in results], fmt
        for row, r in zip(rows, results):
            assert row["tokens_per_s"] == pytest.approx(r.mean, abs=0.006), fmt  # md rounds to 2 decimals
            assert row["stddev"] == pytest.approx(r.stddev, abs=0.006), fmt


@pytest.mark.parametrize("fmt", ["md", "csv", "json", "jsonl"])
def test_cli_writes_each_format(tiny_folder, fmt):
    r = run_cli("bench", str(tiny_folder), "-p", "16", "-n", "4", "-r", "2", "-q", "none,q4", "--no-compile", "-t", "1",
                "-o", fmt)
    assert r.returncode == 0, r.stderr
    rows = _parse(r.stdout, fmt)
    assert [(x["quant"], x["test"]) for x in rows] == [("none", "pp16"), ("none", "tg4"), ("q4", "pp16"), ("q4", "tg4")]
    assert all(x["tokens_per_s"] > 0 for x in rows)


def test_depth_names_the_test(tiny_folder):
    r = run_cli("bench", str(tiny_folder), "-p", "8", "-n", "4", "-d", "16", "-r", "1", "--no-compile", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert [row["test"] for row in json.loads(r.stdout)] == ["pp8@d16", "tg4@d16"]


@pytest.mark.parametrize("flags,needle", [(["-o", "xml"], "--output"), (["-r", "0"], "--repetitions"),
                                          (["-p", "x"], "-p"), (["--baseline", "vllm"], "llama.cpp"),
                                          (["-q", "q3"], "q3")])
def test_bad_flags(tiny_folder, flags, needle):
    r = run_cli("bench", str(tiny_folder), "-r", "1", "--no-compile", *flags)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr


def test_baseline_needs_a_gguf_or_says_how_to_install(tiny_folder):
    r = run_cli("bench", str(tiny_folder), "-r", "1", "-p", "8", "-n", "0", "--no-compile", "--baseline", "llama.cpp")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    assert "GGUF" in r.stderr or "pip install" in r.stderr


# ------------------------------------------------------------------ --baseline llama-bench (native, subprocess)

LLAMA_BENCH_JSON = """[
  {
    "build_commit": "abc", "build_number": 1, "model_filename": "m.gguf", "model_type": "llama ?B Q4_1",
    "model_size": 90000000, "model_n_params": 134515008, "n_threads": 2, "n_prompt": 0, "n_gen": 128,
    "n_depth": 0, "avg_ns": 1000000000, "stddev_ns": 0, "avg_ts": 128.0, "stddev_ts": 0.0,
    "samples_ns": [ 1000000000 ],
    "samples_ts": [ 128 ]
  }
]
"""

FAKE = """#!{python}
import json, sys
a = sys.argv[1:]
arg = lambda f: a[a.index(f) + 1]
open({log!r}, "a").write("B\\n")
p, n = int(arg("-p")), int(arg("-n"))
print(json.dumps([{{"model_type": "llama ?B Q8_0", "model_size": 1000, "model_n_params": 10, "n_threads": int(arg("-t")),
                   "n_prompt": p, "n_gen": n, "n_depth": int(arg("-d")), "samples_ns": [int(1e9 * (n or p) / 100)]}}]))
"""


def test_llama_bench_json_is_read():
    from llmcli.bench.baseline_llamabench import parse_json

    [t] = parse_json(LLAMA_BENCH_JSON)
    assert (t["kind"], t["n"], t["depth"], t["quant"], t["params"]) == ("tg", 128, 0, "Q4_1", 134515008)
    assert t["seconds"] == [1.0]
    [t] = parse_json(LLAMA_BENCH_JSON.replace("llama ?B Q4_1", "qwen2 1B Q4_K - Medium"))
    assert t["quant"] == "Q4_K - Medium"


def test_llama_bench_unreadable_output_is_an_error():
    from llmcli.bench.baseline_llamabench import LlamaBenchError, parse_json

    with pytest.raises(LlamaBenchError, match="no JSON"):
        parse_json("main: error: failed to load model\n")


def test_llama_bench_runs_interleaved_with_llmcli(tiny_gguf, tmp_path):
    """A fake llama-bench: one invocation per repetition, alternating with llmcli's (L B L B), never warmed
    up separately (it warms up itself), and its rows and the ratio come out."""
    from llmcli.bench import measure
    from llmcli.bench.baseline_llamabench import LlamaBenchBaseline
    from llmcli.runtime.runtime import open_model

    log = tmp_path / "log"
    fake = tmp_path / "llama-bench"
    fake.write_text(FAKE.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    rt = open_model(str(tiny_gguf), device="cpu", threads=1, ctx_size=64)

    def step(*a, **k):
        with open(log, "a") as f:
            f.write("L\n")
        return rt.loaded.model(*a, **k)

    base = LlamaBenchBaseline(rt.loaded.path, 1, fake)
    results = [r for e, r in measure.run_tests(rt, "tiny", "none", [0], [4], 0, 3, step, base) if e == "done"]
    calls = log.read_text().split()
    runs = [c for i, c in enumerate(calls) if i == 0 or calls[i - 1] != c]
    assert runs == ["L", "B"] * 3  # 3 rounds, the first after llmcli's warm-up
    assert calls.count("L") == 4 * 4 and calls.count("B") == 3  # 4 steps: warm-up + 3 repetitions
    ours, theirs = results
    assert theirs.engine == "llama-bench" and theirs.quant == "gguf (Q8_0)" and theirs.samples == [100.0] * 3
    assert theirs.ttft_ms == 0 and "-" in measure.row(theirs)
    assert measure.ratios(results) == [f"tiny none tg4: llmcli / llama-bench = {ours.mean / 100:.2f}x"]


def test_cli_llama_bench_flag_runs_it(tiny_gguf, tmp_path):
    fake = tmp_path / "llama-bench"
    fake.write_text(FAKE.format(python=sys.executable, log=str(tmp_path / "log")))
    fake.chmod(0o755)
    r = run_cli("bench", str(tiny_gguf), "-p", "8", "-n", "4", "-r", "2", "--no-compile", "-t", "1",
                "--llama-bench", str(fake))
    assert r.returncode == 0, r.stderr
    assert "| llama-bench |" in r.stdout and "tg4: llmcli / llama-bench = " in r.stdout
    assert "pp8: llmcli / llama-bench = " in r.stdout


def test_llama_bench_beside_a_model_that_leaves_no_room_for_its_map_is_refused(tiny_gguf, monkeypatch):
    """Interleaved, llama-bench maps the whole file beside the model loaded here: where the memory left
    cannot hold it (an 18 GB MoE on 24 GB), one error line says to run it alone, before either starts."""
    from llmcli.bench.baseline_llamabench import LlamaBenchError
    from llmcli.cli import bench
    from llmcli.runtime import budget

    size = tiny_gguf.stat().st_size
    monkeypatch.setattr(budget, "host_available", lambda: size - 1)
    with pytest.raises(LlamaBenchError, match="run `llama-bench -m .*` on its own, then bench without --llama-bench"):
        bench._check_room_beside(tiny_gguf)
    monkeypatch.setattr(budget, "host_available", lambda: size + 1)
    bench._check_room_beside(tiny_gguf)  # room: nothing to say


def test_missing_llama_bench_says_how_to_build_it(tiny_gguf, tmp_path):
    env = {"PATH": str(tmp_path), "LLAMA_BENCH": ""}
    r = run_cli("bench", str(tiny_gguf), "-r", "1", "--no-compile", "--baseline", "llama-bench", env=env)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("error:") and "cmake" in r.stderr and "llama-cpp-python" in r.stderr
    r = run_cli("bench", str(tiny_gguf), "-r", "1", "--no-compile", "--llama-bench", str(tmp_path / "nope"))
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "no llama-bench executable" in r.stderr


@pytest.mark.parametrize("how", ["gguf", "folder -q q4"])
def test_bench_times_the_step_run_takes(tiny_gguf, tiny_folder, how):
    """`bench` decodes through the step `run` takes with the same flags (default flags on a GGUF,
    `-q q4` on an HF folder: quantized at load into the native step's blocks), and says which."""
    model, quant = (tiny_gguf, ()) if how == "gguf" else (tiny_folder, ("--quant", "q4"))
    r = run_cli("bench", str(model), "-p", "0", "-n", "8", "-r", "1", "-o", "json", "-t", "1", *quant)
    assert r.returncode == 0, r.stderr
    (result,) = json.loads(r.stdout)
    ran = run_cli("run", str(model), "Hello", "-n", "4", "-t", "1", "-v", *quant)
    assert ran.returncode == 0, ran.stderr
    step = next(line.split("decode step: ", 1)[1] for line in ran.stderr.splitlines() if "decode step: " in line)
    assert result["step"] == step and result["test"] == "tg8" and result["tokens_per_s"] > 0
    if native.int8_dot():  # the blocks' kernels run here: the one-call step, not the eager path
        assert step.startswith("native")
