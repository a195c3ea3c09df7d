"""Time to first token of each turn of one conversation, with and without the prompt cache.

Two `llmcli serve MODEL` processes on loopback, one with its default prompt cache and one with
--cache-ram 0, hear the same conversation: a long system prompt, then --turns user messages, each
sent with the whole history so far (as a chat client does), greedy, streamed. Turns alternate
between the two servers (which one goes first alternates too), so both see the same machine
load; the replies must come out the same. TTFT is measured at the client: from sending the
request to the first streamed text. Each repetition starts a new conversation (a session number
opens the system prompt, so no repetition reuses another's cache); the table gives medians.

    python -m benchmarks.serving.prompt_cache_ttft [--model smollm2] [--turns 10] [--tokens 48] [-r 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time

import openai

from benchmarks.machine import cpu_name
from benchmarks.serving.concurrent_clients import start_server

SYSTEM = ("Session {n}. You are a patient assistant for a small bookshop. You help customers find books, explain "
          "the shop's policies and suggest reading for every age. The shop opens at nine and closes at six, Monday to "
          "Saturday; on Sunday it is closed. Books may be returned within thirty days with a receipt, in the state "
          "they were bought in. Orders for books that are not in stock take three to five working days; the customer "
          "pays when the book arrives. Members get ten percent off every book and an invitation to the monthly "
          "reading evening, which takes place on the first Thursday of each month at seven. Gift cards are sold in "
          "any amount from five to two hundred euros and never expire. When you do not know something, say so and "
          "offer to ask a bookseller. Keep answers short, friendly and concrete; never invent titles or prices.")
QUESTIONS = ["Hello! Are you open on Sunday?", "Can I return a book I bought last week?", "What if I lost the receipt?",
             "Do members get a discount?", "When is the next reading evening?", "Can I order a book you do not have?",
             "How long does that take?", "Do I pay in advance?", "Do you sell gift cards?",
             "Thank you! Any suggestion for a ten year old who loves dragons?", "And for her grandfather?",
             "Great, see you on Saturday."]


def turn(client: openai.OpenAI, messages: list[dict], tokens: int) -> dict:
    t0, ttft, text, usage = time.perf_counter(), None, [], None
    for c in client.chat.completions.create(model="", messages=messages, temperature=0, max_tokens=tokens, stream=True,
                                            stream_options={"include_usage": True}):
        if c.choices and c.choices[0].delta.content:
            ttft = ttft or time.perf_counter() - t0
            text.append(c.choices[0].delta.content)
        if c.usage:
            usage = c.usage
    details = usage.prompt_tokens_details
    return {"ttft": ttft, "text": "".join(text), "prompt": usage.prompt_tokens,
            "cached": details.cached_tokens if details else 0}


def conversation(clients: dict, n: int, turns: int, tokens: int, pause: float) -> dict[str, list[dict]]:
    """One conversation, turn by turn on every server; {server: [turn result, ...]}."""
    history = {name: [{"role": "system", "content": SYSTEM.format(n=n)}] for name in clients}
    results = {name: [] for name in clients}
    for i in range(turns):
        order = list(clients) if i % 2 == 0 else list(clients)[::-1]
        for name in order:
            history[name].append({"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]})
            r = turn(clients[name], history[name], tokens)
            history[name].append({"role": "assistant", "content": r["text"]})
            results[name].append(r)
            time.sleep(pause)  # the other server's threads settle before it works
        texts = {results[name][-1]["text"] for name in clients}
        if len(texts) != 1:
            sys.exit(f"error: turn {i + 1}: the servers answered differently: {texts}")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=48, help="tokens asked of each reply")
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--pause", type=float, default=0.2, help="seconds between requests")
    a = ap.parse_args()
    if a.turns > len(QUESTIONS) or a.repetitions > 10:
        sys.exit(f"error: at most {len(QUESTIONS)} turns and 10 repetitions")
    servers = {}
    try:
        for name, extra in (("cache", ()), ("no cache", ("--cache-ram", "0"))):
            servers[name] = start_server(a, extra)
        clients = {name: openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=900)
                   for name, (_, url) in servers.items()}
        for c in clients.values():  # warm-up: first-call costs out of the figures
            turn(c, [{"role": "user", "content": "Hi"}], 4)
        load0 = os.getloadavg()[0]
        runs = [conversation(clients, n, a.turns, a.tokens, a.pause) for n in range(a.repetitions)]
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        print(f"{cpu_name()}, {cores} cores, load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after; "
              f"{a.model}, {a.tokens} greedy tokens a reply, median of {a.repetitions} conversations\n")
        print("| turn | prompt tokens | cached tokens | TTFT without cache | TTFT with cache | speed-up |")
        print("|---:|---:|---:|---:|---:|---:|")
        for i in range(a.turns):
            cold = statistics.median(r["no cache"][i]["ttft"] for r in runs)
            warm = statistics.median(r["cache"][i]["ttft"] for r in runs)
            prompt = statistics.median(r["cache"][i]["prompt"] for r in runs)
            cached = statistics.median(r["cache"][i]["cached"] for r in runs)
            print(f"| {i + 1} | {prompt:.0f} | {cached:.0f} | {cold * 1000:.0f} ms | {warm * 1000:.0f} ms | "
                  f"{cold / warm:.1f}x |")
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


if __name__ == "__main__":
    main()
