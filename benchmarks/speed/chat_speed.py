"""`llmcli chat` at a terminal against `llmcli run` and llama-bench, interleaved: the decode speed of
chat's first and second replies (read from its stats line, in a pseudo-terminal), run's `-v` decode
figure, and llama-bench's tg128, each round in turn.

    python -m benchmarks.speed.chat_speed FILE --llama-bench build/bin/llama-bench [--rounds 2] [-n 200] [-t 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import pexpect

STATS = r"(\d+) tokens · first token ([0-9.]+) s · ([0-9.]+) tokens/s"
QUESTIONS = ["Tell me a long story about a dragon.", "Now tell me one about a cat."]


def chat(file: str, tokens: int, threads: int) -> list[float]:
    env = {**os.environ, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1", "NO_COLOR": "1"}
    child = pexpect.spawn(sys.executable, ["-m", "llmcli", "chat", file, "--seed", "7", "-n", str(tokens),
                                           "-t", str(threads)], env=env, encoding="utf-8", timeout=300,
                          dimensions=(40, 200))
    child.expect(">>>")
    speeds = []
    for question in QUESTIONS:
        child.send(question + "\r")
        child.expect(STATS, searchwindowsize=400)  # (the whole growing reply searched at every read took CPU from the chat)
        speeds.append(float(child.match.group(3)))
    child.send("/bye\r")
    child.expect(pexpect.EOF)
    return speeds


def run(file: str, tokens: int, threads: int) -> float:
    err = subprocess.run([sys.executable, "-m", "llmcli", "run", file, QUESTIONS[0], "-n", str(tokens), "--seed", "7",
                          "-t", str(threads), "-v"], capture_output=True, text=True, check=True).stderr
    return float(re.search(r"decode ([0-9.]+) t/s", err).group(1))


def llama_bench(binary: str, file: str, threads: int) -> float:
    out = subprocess.run([binary, "-m", file, "-p", "0", "-n", "128", "-t", str(threads), "-r", "1", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["avg_ts"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-n", type=int, default=200, help="tokens a reply (default 200)")
    ap.add_argument("-t", type=int, default=2, help="threads (default 2)")
    a = ap.parse_args()
    print("round | chat reply 1 t/s | chat reply 2 t/s | run decode t/s | llama-bench tg128 t/s")
    for i in range(a.rounds):
        first, second = chat(a.file, a.n, a.t)
        print(f"{i + 1} | {first:.1f} | {second:.1f} | {run(a.file, a.n, a.t):.1f} | "
              f"{llama_bench(a.llama_bench, a.file, a.t):.1f}", flush=True)


if __name__ == "__main__":
    main()
