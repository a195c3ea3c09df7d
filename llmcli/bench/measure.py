"""Benchmarks in llama-bench's terms: `ppN` (prefill N tokens) and `tgN` (generate N tokens, one per
step), repeated, reported as mean ± stddev tokens/s, with time to first token, load time and peak
memory. Library code: yields results; the CLI formats and prints them.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from .. import heap
from ..decode.request import Request
from ..errors import InvalidParameterError
from ..runtime.device import synchronize

if TYPE_CHECKING:
    import torch


@dataclass
class Result:
    model: str
    size_bytes: int  # weights in memory
    params: int
    backend: str
    threads: int
    quant: str
    test: str  # "pp512", "tg128", with "@d2048" at a context depth
    samples: list[float] = field(default_factory=list)  # tokens/s of each counted repetition
    ttft_ms: float = 0.0  # median time to the first token (pp: the prompt's prefill; tg: one step)
    load_s: float = 0.0
    peak_mem_bytes: int = 0
    engine: str = "llmcli"
    step: str = ""  # how decode steps ran (Runtime.describe_step): what `run` takes with the same flags

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else 0.0

    @property
    def stddev(self) -> float:
        return stddev(self.samples)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["tokens_per_s"] = round(self.mean, 3)
        d["stddev"] = round(self.stddev, 3)
        return d


def stddev(xs: list[float]) -> float:
    """Sample standard deviation (n - 1), as llama-bench reports it; 0 for fewer than two samples."""
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def parse_sizes(text: str, flag: str) -> list[int]:
    """"128,512" -> [128, 512]; 0 means "skip this kind of test"."""
    try:
        sizes = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        raise InvalidParameterError(f"{flag} takes comma-separated token counts, e.g. {flag} 128,512; got {text!r}") from None
    if not sizes or any(s < 0 for s in sizes):
        raise InvalidParameterError(f"{flag} takes token counts >= 0, got {text!r}")
    return sizes


# ------------------------------------------------------------------------------ memory


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(device)
    elif device.type == "cpu":
        try:  # Linux: "5" resets the peak resident set size (VmHWM) of this process
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def peak_memory(device: torch.device) -> int:
    """Peak bytes since the last reset: max allocated on CUDA, driver memory on MPS, peak RSS on CPU."""
    if device.type in ("cuda", "mps"):
        import torch

        if device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(device))
        return int(torch.mps.driver_allocated_memory())
    peak = heap.proc_bytes("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak
    import resource  # macOS

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if os.uname().sysname == "Darwin" else rss * 1024


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights as held in memory: parameters and buffers, plus the tensors of packed
    quantized weights (plain attributes of their modules, in the device's layout), each shared
    tensor counted once. The torch-free path's model says its own (LeanModel.held_bytes)."""
    if hasattr(model, "held_bytes"):
        return model.held_bytes()
    import torch

    seen: set[int] = set()

    def held(t: torch.Tensor) -> int:
        if t.data_ptr() in seen:
            return 0
        seen.add(t.data_ptr())
        return t.numel() * t.element_size()

    def packed_bytes(obj) -> int:  # a packed weight's tensors, and those of the weights it holds
        if hasattr(obj, "held_tensors"):
            return sum(held(t) for t in obj.held_tensors())
        total = 0
        for v in vars(obj).values():
            if isinstance(v, torch.Tensor):
                total += held(v)
            elif hasattr(v, "nbytes") and hasattr(v, "shape") and not isinstance(v, tuple):
                total += packed_bytes(v)
        return total

    total = sum(held(t) for t in list(model.parameters()) + list(model.buffers()))
    for m in model.modules():
        packed = getattr(m, "packed", None)
        if packed is not None and not isinstance(packed, torch.Tensor):
            total += packed_bytes(packed)
    return total


# ------------------------------------------------------------------------------ timing


def _tokens(n: int, vocab: int, seed: int) -> list[int]:
    """n token ids away from the vocabulary's ends (its special tokens), the same for a seed."""
    return np.random.default_rng(seed).integers(100, max(101, vocab - 100), n).tolist()


def _prefill(model, ids: list[int], cache, device) -> int:
    """Run ids into the cache as `run` prefills (the torch path's prefill, or the torch-free model's);
    the argmax of the last logits, as a first token's pick."""
    if getattr(model, "torch_free", False):
        return int(model.prefill(ids, cache)[0][0].argmax())
    import torch

    from ..decode.prefill import prefill

    with torch.inference_mode():
        return int(prefill(model, ids, cache, device).argmax())


def time_prefill(model, new_cache: Callable, n: int, depth: int, vocab: int, device) -> tuple[float, float]:
    """Seconds to prefill n tokens after `depth` tokens already in the cache; also the first-token time
    (the same prefill plus the argmax that picks the token)."""
    cache = new_cache()
    if depth:
        _prefill(model, _tokens(depth, vocab, 1), cache, device)
    ids = _tokens(n, vocab, 2)
    synchronize(device)
    t0 = time.perf_counter()
    _prefill(model, ids, cache, device)
    synchronize(device)
    elapsed = time.perf_counter() - t0
    return elapsed, elapsed


def time_decode(rt, step, n: int, depth: int, device, ignore_eos: bool = True) -> tuple[float, float, int]:
    """Seconds for n decode steps made as `llmcli run` makes them: the runtime's generate() with run's
    default sampling (Request's default SamplingParams: temperature 0.8, top-k 40, top-p 0.95, min-p
    0.05), the decode step run takes and its text stream, going on past end-of-sequence tokens as
    llama-bench does; after `depth` tokens (at least one) of prompt (`ignore_eos` False: an end token
    ends it early). Returns the seconds, the first step's seconds, and the steps made."""
    prompt = _tokens(max(1, depth), rt.loaded.args.vocab_size, 1)
    times, last = [], None
    request = Request(max_tokens=n + 1, ignore_eos=ignore_eos)  # run's default sampling
    for chunk in rt.generate(prompt, request, rt.new_cache(), step):
        if chunk.tokens:
            times.append(time.perf_counter())  # the first token comes out of the prefill; n steps follow
        last = chunk
    synchronize(device)
    steps = last.stats.completion_tokens - 1
    return last.stats.decode_s, times[1] - times[0] if steps else 0.0, steps


def run_tests(rt, label: str, quant: str, prompts: list[int], gens: list[int], depth: int, reps: int,
              step=None, baseline=None, ignore_eos: bool = True) -> Iterator[tuple[str, Result]]:
    """Yield ("progress", partial result) after each repetition and ("done", result) per test.

    `baseline` (a LlamaCppBaseline or LlamaBenchBaseline) is timed in the same loop, interleaved with
    llmcli's repetitions: llmcli, baseline, llmcli, baseline, ...
    """
    loaded = rt.loaded
    device, vocab = rt.placement.device, loaded.args.vocab_size
    model, step = loaded.model, step or loaded.model
    size = weights_bytes(model)
    params = loaded.args.parameter_count()
    common = dict(model=label, size_bytes=size, params=params, backend=device.type, threads=rt.placement.threads,
                  quant=quant, load_s=loaded.load_seconds)
    ours_common = dict(common, step=rt.describe_step(step))
    tests = [("pp", n) for n in prompts if n > 0] + [("tg", n) for n in gens if n > 0]
    for kind, n in tests:
        name = f"{kind}{n}" + (f"@d{depth}" if depth else "")
        ctx = max(1, depth) + n + 1 if kind == "tg" else depth + n
        if ctx > rt.ctx_size:
            raise InvalidParameterError(f"{name} needs a context of {ctx} tokens; raise -c/--ctx-size (now {rt.ctx_size})")

        def new_cache():
            return rt.new_cache()

        def once():  # (seconds, first-token seconds, tokens)
            if kind == "pp":
                return (*time_prefill(_prefill_runner(model, step), new_cache, n, depth, vocab, device), n)
            return time_decode(rt, step, n, depth, device, ignore_eos)

        once()  # warm-up: not counted
        if baseline is not None and getattr(baseline, "needs_warm_up", True):
            baseline.once(kind, n, depth)
        ours = Result(test=name, **ours_common)
        reset_peak_memory(device)
        firsts, their_samples, their_firsts = [], [], []
        for _ in range(reps):
            elapsed, first, made = once()
            ours.samples.append(made / elapsed if elapsed > 0 else 0.0)
            firsts.append(first)
            if baseline is not None:
                elapsed, first = baseline.once(kind, n, depth)
                their_samples.append(n / elapsed)
                if first is not None:  # llama-bench reports no first-token time
                    their_firsts.append(first)
            yield "progress", ours
        ours.ttft_ms = sorted(firsts)[len(firsts) // 2] * 1000
        ours.peak_mem_bytes = peak_memory(device)
        yield "done", ours
        if baseline is not None:
            theirs = baseline.result(name, common)
            theirs.samples = their_samples
            theirs.ttft_ms = sorted(their_firsts)[len(their_firsts) // 2] * 1000 if their_firsts else 0.0
            yield "done", theirs


def _prefill_runner(model, step):
    """What prefills: the torch-free model itself, else decode/prefill.py's choice."""
    if getattr(model, "torch_free", False):
        return model
    from ..decode.prefill import prefill_runner

    return prefill_runner(model, step)


# ------------------------------------------------------------------------------ output

COLUMNS = ["model", "engine", "quant", "size", "params", "backend", "threads", "test", "t/s", "ttft ms", "load s",
           "peak mem", "step"]


def _human(n: float, unit: str = "B") -> str:
    for prefix in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(n) < 1024 or prefix == "Ti":
            return f"{n:.2f} {prefix}{unit}" if prefix else f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.2f} {unit}"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def row(r: Result) -> list[str]:
    return [r.model, r.engine, r.quant, _human(r.size_bytes, "B") if r.size_bytes else "-", _params(r.params),
            r.backend, str(r.threads), r.test, f"{r.mean:.2f} ± {r.stddev:.2f}", f"{r.ttft_ms:.1f}" if r.ttft_ms else "-",
            f"{r.load_s:.2f}" if r.load_s else "-", _human(r.peak_mem_bytes) if r.peak_mem_bytes else "-",
            r.step or "-"]


def format_results(results: list[Result], fmt: str) -> str:
    if fmt == "json":
        return json.dumps([r.as_dict() for r in results], indent=2)
    if fmt == "jsonl":
        return "\n".join(json.dumps(r.as_dict()) for r in results)
    if fmt == "csv":
        import csv
        import io

        out = io.StringIO()
        keys = list(results[0].as_dict()) if results else []
        w = csv.DictWriter(out, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        for r in results:
            d = r.as_dict()
            d["samples"] = ";".join(f"{s:.4f}" for s in r.samples)
            w.writerow(d)
        return out.getvalue().rstrip("\n")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---:" if c in ("t/s", "ttft ms", "load s") else "---"
                                                                  for c in COLUMNS) + "|"]
    lines += ["| " + " | ".join(row(r)) + " |" for r in results]
    return "\n".join(lines)


def ratios(results: list[Result]) -> list[str]:
    """"smollm2 none tg128: llmcli / llama-bench = 1.07x" for each baseline row, against the llmcli
    row of the same model and test measured with it (the one before it)."""
    out = []
    for i, other in enumerate(results):
        if other.engine == "llmcli" or other.mean <= 0:
            continue
        ours = next((r for r in reversed(results[:i]) if r.engine == "llmcli" and r.model == other.model
                     and r.test == other.test), None)
        if ours is not None:
            out.append(f"{ours.model} {ours.quant} {ours.test}: llmcli / {other.engine} = {ours.mean / other.mean:.2f}x")
    return out
