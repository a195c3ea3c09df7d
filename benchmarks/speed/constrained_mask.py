"""The grammar mask's cost per token against the decode step it rides on.

    python -m benchmarks.speed.constrained_mask MODEL [--schema FILE] [-r 3] [--dtype auto] [--threads 2]

Generates the same constrained answers (a JSON Schema, a regex) and free text, greedy, interleaved
over -r repetitions. Per token it times the constraint's mask + advance, and the whole step (time
between two tokens, which includes the mask); prints medians and the ratio as a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from llmcli.decode import constrained
from llmcli.decode.generate import generate
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.runtime.runtime import open_model

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "languages"],
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0},
                         "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}}
CASES = [("json_schema", "Describe a programmer named Ada, 36, as JSON."),
         ("regex", "Write the date the Berlin Wall fell, as YYYY-MM-DD."),
         ("free", "Describe a programmer named Ada, 36, as JSON.")]


class Timed:
    """A TokenConstraint whose mask() and advance() are timed per token."""

    def __init__(self, inner):
        self.inner, self.per_token, self._t = inner, [], 0.0

    def mask(self, logits):
        t0 = time.perf_counter()
        out = self.inner.mask(logits)
        self._t = time.perf_counter() - t0
        return out

    def advance(self, token):
        t0 = time.perf_counter()
        self.inner.advance(token)
        self.per_token.append(self._t + time.perf_counter() - t0)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2")
    ap.add_argument("--schema", help="a JSON Schema file (default: a small person object)")
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    rt = open_model(a.model, dtype=a.dtype, threads=a.threads, ctx_size=1024)
    tok = rt.loaded.tokenizer
    schema = open(a.schema).read() if a.schema else json.dumps(PERSON)
    grammars = {"json_schema": constrained.from_json_schema(schema),
                "regex": constrained.from_regex(r"(19|20)[0-9]{2}-[01][0-9]-[0-3][0-9]"), "free": None}
    compiler = constrained.GrammarCompiler(tok)
    masks = {k: [] for k in grammars}
    steps = {k: [] for k in grammars}
    texts = {}
    for _ in range(a.repetitions):
        for kind, prompt in CASES:
            c = Timed(compiler.constraint(grammars[kind])) if grammars[kind] else None
            ids = rt.prompt_ids([{"role": "user", "content": prompt}])
            last, pieces = None, []
            request = Request(SamplingParams(temperature=0), 40, grammar=grammars[kind])
            for chunk in generate(rt.loaded.model, tok, ids, request, rt.new_cache(), constraint=c):
                now = time.perf_counter()
                if last is not None and chunk.finish_reason is None:
                    steps[kind].append(now - last)
                last = now
                pieces.append(chunk.text)
            texts[kind] = "".join(pieces)
            if c is not None:
                masks[kind].extend(c.per_token[1:])  # the first mask builds lexer state: reported apart
    print(f"{rt.loaded.name}, {rt.placement.reason}")
    print("| output | text | mask + advance, ms/token (median) | decode step, ms (median) | share |")
    print("|---|---|---:|---:|---:|")
    for kind in grammars:
        m = statistics.median(masks[kind]) * 1000 if masks[kind] else 0.0
        s = statistics.median(steps[kind]) * 1000
        print(f"| {kind} | `{texts[kind][:60]}` | {m:.3f} | {s:.1f} | {m / s:.1%} |")


if __name__ == "__main__":
    main()
