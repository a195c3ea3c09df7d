"""`llmcli bench --api URL`: a server's latency and throughput at N concurrent clients, as
benchmarks/serving/concurrent_clients.py measures `llmcli serve`, for any OpenAI-compatible server.

Per test (clients, prompt size, tokens): every client sends its requests one after another (after
one warm-up request), each a streamed chat completion, greedy, of exactly n tokens where the server
honours ignore_eos (vLLM, llama-server, llmcli). Reported: time to first token (p50), latency per
request (p50, p99: nearest rank), decode tokens/s of one request (the mean), and generated tokens/s
over the test's wall time (the server's throughput at that load).
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from dataclasses import dataclass, field

from ..decode.request import Request
from ..decode.sampling_plain import SamplingParams
from ..runtime.remote import CHARS_PER_TOKEN

WORDS = ("the quiet harbour wakes as fishing boats return with silver nets and gulls circle over the old stone "
         "pier while a baker opens the shutters ").split()


@dataclass
class LevelResult:
    model: str
    clients: int
    test: str  # "pp16+tg32": prompt tokens (estimated) and tokens generated per request
    ttft: list[float] = field(default_factory=list)  # seconds, per request
    latency: list[float] = field(default_factory=list)
    decode_tps: list[float] = field(default_factory=list)
    tokens: int = 0  # generated over the test
    wall: float = 0.0
    failed: int = 0

    def as_dict(self) -> dict:
        return {"model": self.model, "clients": self.clients, "test": self.test, "requests": len(self.latency),
                "failed": self.failed, "ttft_p50_ms": round(rank(self.ttft, 50) * 1000, 1),
                "latency_p50_s": round(rank(self.latency, 50), 3), "latency_p99_s": round(rank(self.latency, 99), 3),
                "request_tokens_per_s": round(statistics.fmean(self.decode_tps), 2) if self.decode_tps else 0.0,
                "total_tokens_per_s": round(self.tokens / self.wall, 2) if self.wall > 0 else 0.0}


def rank(values: list[float], p: float) -> float:
    """The nearest-rank percentile (with few requests, p99 is the slowest)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def prompt_text(tokens: int, client: int, repetition: int) -> str:
    """About `tokens` tokens of plain text (estimated as the remote runtime does), different from its
    first words on per client and repetition, so that a server's prompt cache does not answer it."""
    words = [f"{client}.{repetition}:"]
    while len(" ".join(words)) < max(1, tokens) * CHARS_PER_TOKEN:
        words.append(WORDS[len(words) % len(WORDS)])
    return " ".join(words)


def measure(rt, clients: int, n_prompt: int, n_gen: int, repetitions: int, ignore_eos: bool = True) -> LevelResult:
    """One test: `clients` threads, each `repetitions` streamed requests after one warm-up; the first
    failure (the server gone) is raised when every request failed."""
    request = Request(SamplingParams(temperature=0), n_gen, ignore_eos=ignore_eos)
    result = LevelResult(rt.model, clients, f"pp{n_prompt}+tg{n_gen}")
    lock, errors = threading.Lock(), []

    def one(client: int, repetition: int):
        prompt = rt.prompt_ids([{"role": "user", "content": prompt_text(n_prompt, client, repetition)}])
        t0 = time.perf_counter()
        last = None
        for chunk in rt.generate(prompt, request):
            last = chunk
        return time.perf_counter() - t0, last.stats

    def client(i: int):
        for r in range(repetitions):
            try:
                seconds, stats = one(i, r)
            except Exception as e:  # noqa: BLE001 - counted; raised below when nothing succeeded
                with lock:
                    result.failed += 1
                    errors.append(e)
                continue
            with lock:
                result.latency.append(seconds)
                result.ttft.append(stats.ttft_s)
                result.decode_tps.append(stats.decode_tps)
                result.tokens += stats.completion_tokens

    one(-1, -1)  # warm-up (and a failing server says so at once)
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.wall = time.perf_counter() - t0
    if errors and not result.latency:
        raise errors[0]
    return result


COLUMNS = ("model", "clients", "test", "requests", "failed", "ttft_p50_ms", "latency_p50_s", "latency_p99_s",
           "request_tokens_per_s", "total_tokens_per_s")
HEADERS = ("model", "clients", "test", "requests", "failed", "TTFT p50 ms", "latency p50 s", "latency p99 s",
           "t/s per request", "t/s total")


def format_levels(results: list[LevelResult], fmt: str) -> str:
    """md (a table), csv, json (one list) or jsonl (an object a line)."""
    rows = [r.as_dict() for r in results]
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if fmt == "jsonl":
        return "\n".join(json.dumps(r) for r in rows)
    if fmt == "csv":
        return "\n".join([",".join(COLUMNS)] + [",".join(str(r[c]) for c in COLUMNS) for r in rows])
    rule = "|" + "|".join("---" if i < 3 else "---:" for i in range(len(HEADERS))) + "|"  # figures right-aligned
    lines = ["| " + " | ".join(HEADERS) + " |", rule]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)
