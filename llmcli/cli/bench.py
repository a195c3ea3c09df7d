"""`llmcli bench`: llama-bench's tests and flags; the table (or csv/json/jsonl) on stdout, progress on stderr."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from ..errors import InvalidParameterError
from .options import (Api, ApiKey, Compile, CtxSize, Device, Dtype, KvOffload, KvType, Offline, RegistryFile, Threads,
                      model_flags, stderr_console)

FORMATS = ("md", "csv", "json", "jsonl")


def bench(
    models: Annotated[Optional[list[str]], typer.Argument(help="Models to measure (default: smollm2:135m).", show_default=False)] = None,
    n_prompt: Annotated[str, typer.Option("--n-prompt", "-p", help="Prompt sizes to prefill, comma-separated (0 = none).")] = "512",
    n_gen: Annotated[str, typer.Option("--n-gen", "-n", help="Token counts to generate, comma-separated (0 = none).")] = "128",
    repetitions: Annotated[int, typer.Option("--repetitions", "-r", help="Counted repetitions per test (after one warm-up).")] = 5,
    depth: Annotated[int, typer.Option("--depth", "-d", help="Tokens already in the context when each test starts.")] = 0,
    quant: Annotated[str, typer.Option("--quant", "-q", help="Presets, comma-separated (none = as stored), e.g. -q bf16,q8,q4.")] = "none",
    output: Annotated[str, typer.Option("--output", "-o", help="md | csv | json | jsonl.")] = "md",
    baseline: Annotated[Optional[str], typer.Option("--baseline", help="Also time llama.cpp on the same GGUF, interleaved: llama-bench (the native tool, a subprocess) or llama.cpp (llama-cpp-python, in process).", show_default=False)] = None,
    llama_bench: Annotated[Optional[str], typer.Option("--llama-bench", help="The llama-bench executable (implies --baseline llama-bench; default: $LLAMA_BENCH, then PATH).", show_default=False)] = None,
    compile: Compile = False,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos/--stop-at-eos", help="tgN goes on past end-of-sequence tokens, as llama-bench's does (--stop-at-eos: a test ends early at one, as `run` without --ignore-eos).")] = True,
    ctx_size: CtxSize = None, device: Device = "auto", dtype: Dtype = "auto", threads: Threads = None,
    kv_type: KvType = "auto", kv_offload: KvOffload = "auto",
    registry: RegistryFile = None, offline: Offline = False,
    clients: Annotated[str, typer.Option("--clients", help="With --api: concurrent clients, comma-separated, e.g. 1,4,16.")] = "1",
    api: Api = None, api_key: ApiKey = None,
):
    """Measure prefill (ppN) and generation (tgN) speed, time to first token, load time and peak memory.
    --api URL: a server's latency and throughput at --clients N at once."""
    from ..bench import measure as b
    from ..runtime.flags import DEFAULT_MODEL

    prompts, gens = b.parse_sizes(n_prompt, "-p"), b.parse_sizes(n_gen, "-n")
    if repetitions < 1:
        raise InvalidParameterError(f"-r/--repetitions must be at least 1, got {repetitions}")
    if depth < 0:
        raise InvalidParameterError(f"-d/--depth must be >= 0, got {depth}")
    if output not in FORMATS:
        raise InvalidParameterError(f"-o/--output must be one of {', '.join(FORMATS)}, got {output!r}")
    if api is not None:
        from .remote import model_flags_given, refuse_local

        refuse_local({**model_flags_given(None if quant == "none" else quant, device, dtype, threads, kv_type,
                                          kv_offload, registry, offline, compile=compile),
                      "--baseline": baseline is not None, "--llama-bench": llama_bench is not None,
                      "-d/--depth": depth != 0})
        _remote(models, prompts, gens, b.parse_sizes(clients, "--clients"), repetitions, ignore_eos, output, api,
                api_key, ctx_size)
        return
    if clients != "1":
        raise InvalidParameterError("--clients measures a server: add --api URL")
    binary, baseline = _baseline(baseline, llama_bench)
    presets = [q.strip() for q in quant.split(",") if q.strip()] or ["none"]
    needed = max([depth + p for p in prompts] + [max(1, depth) + n + 1 for n in gens])
    err = stderr_console()
    results = []
    for name in models or [DEFAULT_MODEL]:
        for preset in presets:
            flags = model_flags(name, device=device, dtype=dtype, threads=threads, ctx_size=ctx_size or needed,
                                quant=None if preset == "none" else preset, kv_type=kv_type, kv_offload=kv_offload,
                                registry=registry, offline=offline)
            results += _measure(err, flags, preset, prompts, gens, depth, repetitions, compile, ignore_eos, binary,
                                baseline)
    print(b.format_results(results, output))
    if output == "md":
        for line in b.ratios(results):
            print(line)


def _remote(models, prompts, gens, levels, repetitions: int, ignore_eos: bool, output: str, url: str, key, ctx_size):
    """bench --api: each model the server serves (default its only one) at each number of clients."""
    from ..bench import remote as r
    from .remote import open_api

    if any(n < 1 for n in levels):
        raise InvalidParameterError("--clients takes whole numbers of at least 1, e.g. 1,4,16")
    if not any(gens):
        raise InvalidParameterError("-n/--n-gen must name at least one token count above 0 with --api")
    err = stderr_console()
    live, results = sys.stderr.isatty(), []
    for name in models or [None]:
        rt = open_api(err, url, key, name, ctx_size)
        for n_clients in levels:
            for p in prompts:
                for n in (g for g in gens if g > 0):
                    if live:
                        err.print(f"[dim]{rt.model} {n_clients} clients pp{p}+tg{n}...[/dim]", end="\r")
                    results.append(r.measure(rt, n_clients, p, n, repetitions, ignore_eos))
    print(r.format_levels(results, output))


def _baseline(baseline: str | None, llama_bench: str | None):
    """(the llama-bench executable or None, the baseline asked for): a missing binary fails before anything loads."""
    if llama_bench and baseline is None:
        baseline = "llama-bench"
    if baseline not in (None, "llama-bench", "llama.cpp", "llamacpp"):
        raise InvalidParameterError(f"--baseline takes llama-bench or llama.cpp, got {baseline!r}")
    if baseline != "llama-bench":
        return None, baseline
    from ..bench.baseline_llamabench import find_binary

    return find_binary(llama_bench), baseline


def _check_room_beside(path) -> None:
    """llama-bench maps the whole file beside this process's loaded model (the runs interleave): where
    the memory left cannot hold it, the two would swap or the kernel would kill one mid-run."""
    from pathlib import Path

    from ..bench.baseline_llamabench import LlamaBenchError
    from ..runtime.budget import host_available

    size, left = Path(path).stat().st_size, host_available()
    if left and size > left:
        raise LlamaBenchError(f"llama-bench would map the {size / 1e9:.2f} GB file beside the model loaded here, and "
                              f"{left / 1e9:.2f} GB is free: run `llama-bench -m {path}` on its own, then bench "
                              "without --llama-bench")


def _measure(err, flags, preset: str, prompts, gens, depth: int, repetitions: int, compile: bool, ignore_eos: bool,
             binary, baseline):
    """One model under one preset: its results (and the baseline's, interleaved), progress on stderr."""
    from ..bench import measure as b
    from ..runtime.lean import open_lean
    from .startup import opening

    with opening(err) as progress:
        rt = None if compile else open_lean(flags, progress=progress)  # the path `run` takes, torch-free where it is
        if rt is None:
            from ..runtime.runtime import open_model

            rt = open_model(flags, progress)
    step = rt.decode_step(compile)
    base = None
    if binary is not None:
        from ..bench.baseline_llamabench import LlamaBenchBaseline

        base = LlamaBenchBaseline(rt.loaded.path, rt.placement.threads, binary)
        _check_room_beside(rt.loaded.path)
    elif baseline:
        from ..bench.baseline_llamacpp import LlamaCppBaseline

        base = LlamaCppBaseline(rt.loaded.path, rt.placement.threads, rt.ctx_size)
    live, results = sys.stderr.isatty(), []
    for event, r in b.run_tests(rt, flags.model, preset, prompts, gens, depth, repetitions, step, base, ignore_eos):
        if event == "done":
            results.append(r)
        if live:
            err.print(f"[dim]{flags.model} {preset} {r.engine} {r.test}: {len(r.samples)}/{repetitions} "
                      f"{r.mean:.1f} t/s[/dim]", end="\r" if event == "progress" else "\n")
    return results
