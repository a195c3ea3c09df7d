"""Load on `llmcli serve`: 1, 8 and 50 clients at once, half streaming and half not, each asking
one chat completion of --tokens tokens. Per level: latency per request (sent to last byte),
p50 and p99 (nearest rank: with 8 or 50 requests, p99 is the slowest), time to first token of the
streams, answered/total (an answer is a 200 with a finish reason; a 503, a reset or any error is
not), generated tokens/s over the level's wall time, and the engine's mean batch (rows per decode
step, from llmcli's /health).

Loopback only, and bounded: one request per client per level, --rounds rounds, a deadline per
request. It starts `llmcli serve MODEL` on a free port (and stops it), or uses --url.

    python -m benchmarks.serving.concurrent_clients [--model smollm2] [--rows 8] [-c 1024] [--tokens 32] [--levels 1,8,50]
    python -m benchmarks.serving.concurrent_clients --url http://127.0.0.1:8080/v1      # a server already running
    python -m benchmarks.serving.concurrent_clients --models A,B [--models-max 1]        # models loaded on demand

With --models, the server starts with no model and client i asks for model i mod len(models), so the
models alternate: the report adds how many loads the server made (each model once, unless
--models-max makes them take turns) and the server's peak RSS.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import openai

from benchmarks.machine import cpu_name

TOPICS = ["the sea", "a city at night", "an old library", "a mountain village", "a lighthouse", "a desert",
          "a train journey", "a forest in autumn", "a market", "a winter morning"]


def ask(client: openai.OpenAI, i: int, tokens: int, stream: bool, model: str = "") -> dict:
    """One request: {"ok", "seconds", "ttft", "tokens", "error"}."""
    messages = [{"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}."}]
    t0 = time.perf_counter()
    try:
        if stream:
            ttft, finish, made = None, None, 0
            for c in client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=tokens,
                                                    stream=True, stream_options={"include_usage": True}):
                if c.choices and c.choices[0].delta.content and ttft is None:
                    ttft = time.perf_counter() - t0
                if c.choices and c.choices[0].finish_reason:
                    finish = c.choices[0].finish_reason
                if c.usage:
                    made = c.usage.completion_tokens
        else:
            r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=tokens)
            ttft, finish, made = None, r.choices[0].finish_reason, r.usage.completion_tokens
        return {"ok": finish is not None, "seconds": time.perf_counter() - t0, "ttft": ttft, "tokens": made, "error": None}
    except Exception as e:  # noqa: BLE001 - every failure is a finding: counted, and its kind shown
        return {"ok": False, "seconds": time.perf_counter() - t0, "ttft": None, "tokens": 0,
                "error": f"{type(e).__name__}: {getattr(e, 'status_code', '') or ''}".rstrip(": ")}


def health(url: str) -> dict:
    """The server's /health (llmcli's: rows, steps, mean batch), or {} from another server."""
    try:
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=10) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return {}


def level(url: str, clients: int, tokens: int, timeout: float, models: list[str] = ()) -> dict:
    """`clients` requests at once (a barrier releases them together), even-numbered ones streamed;
    client i asks for models[i mod len(models)] where models are given."""
    before = health(url)
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=timeout)
    results: list[dict] = [{}] * clients
    start = threading.Barrier(clients)

    def one(i: int) -> None:
        start.wait()
        results[i] = ask(client, i, tokens, stream=i % 2 == 0, model=models[i % len(models)] if models else "")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    wall = time.perf_counter() - t0
    client.close()
    after = health(url)
    steps = after.get("steps", 0) - before.get("steps", 0)
    rows = after.get("mean_batch", 0) * after.get("steps", 0) - before.get("mean_batch", 0) * before.get("steps", 0)
    return {"clients": clients, "wall": wall, "batch": rows / steps if steps else float("nan"),
            "results": [r or {"ok": False, "error": "no answer in time"} for r in results]}


def rank(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(p * len(s)) - 1)] if s else float("nan")


def report(levels: list[dict]) -> None:
    print("| clients | answered | p50 latency | p99 latency | p50 TTFT (streams) | tokens/s (all clients) | mean batch |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for lv in levels:
        rs = lv["results"]
        ok = [r for r in rs if r["ok"]]
        lat = [r["seconds"] for r in ok]
        ttft = [r["ttft"] for r in ok if r.get("ttft") is not None]
        made = sum(r["tokens"] for r in ok)
        print(f"| {lv['clients']} | {len(ok)}/{len(rs)} | {rank(lat, 0.5):.2f} s | {rank(lat, 0.99):.2f} s | "
              f"{rank(ttft, 0.5):.2f} s | {made / lv['wall']:.1f} | {lv['batch']:.1f} |")
        errors = sorted({r["error"] for r in rs if not r["ok"]})
        if errors:
            print(f"|   | failures: {', '.join(errors)} | | | | | |")


def loopback_only(url: str) -> None:
    host = urlsplit(url).hostname or ""
    addrs = {a[4][0] for a in socket.getaddrinfo(host, None)} if host else set()
    if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        sys.exit(f"error: {url} is not on this machine; this benchmark loads loopback servers only")


def start_server(a, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    model = ["--models-max", str(a.models_max)] if a.models else [a.model]
    cmd = [sys.executable, "-m", "llmcli", "serve", *model, "--port", "0", "--rows", str(a.rows), "-c", str(a.ctx)]
    cmd += (["-t", str(a.threads)] if a.threads else []) + list(extra)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "NO_COLOR": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    killer = threading.Timer(600, proc.kill)  # a server that never says it serves ends the benchmark
    killer.start()
    for line in proc.stderr:
        if line.startswith("serving "):
            killer.cancel()
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep its pipe drained
            return proc, line.rsplit(" on ", 1)[1].split()[0]
    killer.cancel()
    sys.exit(f"error: the server did not start ({proc.wait()})")



def _peak_rss(pid: int) -> int | None:
    """A process's peak resident memory in bytes (Linux's VmHWM), or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server's base URL (http://127.0.0.1:PORT/v1); default: start one")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--models", help="several models, comma-separated: the server loads them on demand, clients alternate")
    ap.add_argument("--models-max", type=int, default=2, help="with --models: the server's --models-max")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("-c", "--ctx", type=int, default=1024)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=32, help="tokens asked of each request")
    ap.add_argument("--levels", default="1,8,50", help="clients at once, one level after another")
    ap.add_argument("--rounds", type=int, default=1, help="the levels, this many times (medians not taken: each printed)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a request may take")
    a = ap.parse_args()
    levels = [int(n) for n in a.levels.split(",")]
    models = a.models.split(",") if a.models else []
    if max(levels) > 200 or a.rounds > 5 or a.tokens > 512:
        sys.exit("error: this benchmark is bounded: at most 200 clients, 5 rounds, 512 tokens")
    proc = None
    if a.url:
        url = a.url
    else:
        proc, url = start_server(a)
    try:
        loopback_only(url)  # (inside: a server this started stops whatever happens)
        if not models:
            ask(openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=a.timeout), 0, 4, False)  # warm-up
        load0 = os.getloadavg()[0]
        for r in range(a.rounds):
            served = url if a.url else f"{a.models or a.model} --rows {a.rows} -c {a.ctx}"
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
            print(f"\n{cpu_name()}, {cores} cores, load average {load0:.1f} before; {served}; "
                  f"{a.tokens} tokens per request; round {r + 1}")
            report([level(url, n, a.tokens, a.timeout, models) for n in levels])
        print(f"load average {os.getloadavg()[0]:.1f} after")
        if models:
            h = health(url)
            peak = _peak_rss(proc.pid) if proc is not None else None
            print(f"loads: {h.get('loads')} for {len(models)} models (--models-max {a.models_max}); loaded now: "
                  f"{', '.join(m['model'] for m in h.get('models', []))}"
                  + (f"; server peak RSS {peak / 1e6:.0f} MB" if peak else ""))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


if __name__ == "__main__":
    main()
