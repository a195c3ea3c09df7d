"""--regex patterns (Rust `regex` syntax), read before llguidance sees them: one pass over the
pattern that knows escapes, classes, groups and quantifiers, for two jobs.

    ascii_digits("\\d{3}")      -> "[0-9]{3}"   Rust's \\d is Unicode's Nd (Arabic-Indic, fullwidth,
                                              mathematical digits ...); people who write \\d mean 0-9
    repetitions("a{1000}{1000}") -> 1000000    how many copies of its atoms counted repetitions ask
                                              for: llguidance builds its lexer lazily and fails with
                                              "too many expressions" mid-generation past ~10^6
"""

from __future__ import annotations

import re

MAX_REPETITIONS = 100_000  # a{100000} already slows llguidance's every token; a{1000000} fails mid-generation

_COUNTED = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}")
_GROUP_OPEN = re.compile(r"\((?:\?(P?<[A-Za-z_][A-Za-z0-9_]*>|[a-zA-Z-]*:|[a-zA-Z-]*\)))?")
_ESCAPE = re.compile(r"\\(x\{[0-9A-Fa-f]*\}|x[0-9A-Fa-f]{2}|u\{[0-9A-Fa-f]*\}|u[0-9A-Fa-f]{4}|[pP]\{[^}]*\}|[pP].|.)",
                     re.DOTALL)


def _class_end(pattern: str, i: int) -> int:
    """The index after the class that opens at pattern[i] == "[" (nested classes, [:alpha:], escapes)."""
    i += 1
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):  # a leading ] is a literal
        i += 1
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i = _ESCAPE.match(pattern, i).end() if _ESCAPE.match(pattern, i) else i + 1
        elif c == "[" and pattern.startswith("[:", i) and ":]" in pattern[i:]:
            i = pattern.index(":]", i) + 2
        elif c == "[":
            i = _class_end(pattern, i)
        elif c == "]":
            return i + 1
        else:
            i += 1
    return i


def ascii_digits(pattern: str, python: bool = False) -> str | None:
    """`pattern` with \\d as [0-9] and \\D as [^0-9], in classes too ([^\\d] -> [^0-9]; [\\D] -> [[^0-9]],
    a nested class, which Rust reads). `python`: for Python's `re`, which has no nested classes:
    None where one would be needed."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            end = _class_end(pattern, i)
            inner = _in_class(pattern[i:end], python)
            if inner is None:
                return None
            out.append(inner)
            i = end
        elif c == "\\" and pattern.startswith(("\\d", "\\D"), i):
            out.append("[0-9]" if pattern[i + 1] == "d" else "[^0-9]")
            i += 2
        elif c == "\\":
            m = _ESCAPE.match(pattern, i)
            end = m.end() if m else i + 1
            out.append(pattern[i:end])
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _in_class(text: str, python: bool) -> str | None:
    out, i = [], 0
    while i < len(text):
        if text.startswith("\\d", i):
            out.append("0-9")
            i += 2
        elif text.startswith("\\D", i):
            if python:
                return None
            out.append("[^0-9]")
            i += 2
        elif text[i] == "\\":
            m = _ESCAPE.match(text, i)
            end = m.end() if m else i + 1
            out.append(text[i:end])
            i = end
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def repetitions(pattern: str) -> int:
    """An upper bound on the copies of atoms the pattern's counted repetitions ask for: a sequence
    or an alternation adds its parts, {m,n} multiplies by n ({m,}: by m), and so do stacked or
    nested ones (a{1000}{1000} and (a{1000}){1000} are both 10^6). *, + and ? are loops: 1."""
    stack: list[list[int]] = []  # per open group: [total of closed alternatives, current sequence, last atom]
    total, current, last = 0, 0, 0
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            m = _ESCAPE.match(pattern, i)
            i = m.end() if m else i + 1
            current, last = current + 1, 1
        elif c == "[":
            i = _class_end(pattern, i)
            current, last = current + 1, 1
        elif c == "(":
            m = _GROUP_OPEN.match(pattern, i)
            i = m.end()
            if m.group(1) and m.group(1).endswith(")"):  # (?i): flags only, no group
                last = 0
                continue
            stack.append([total, current])
            total, current, last = 0, 0, 0
        elif c == ")" and stack:
            size = total + current
            total, current = stack.pop()
            current, last = current + size, size
            i += 1
        elif c == "|":
            total, current, last = total + current, 0, 0
            i += 1
        elif c == "{" and _COUNTED.match(pattern, i):
            m = _COUNTED.match(pattern, i)
            low, comma, high = int(m.group(1)), m.group(2), m.group(3)
            times = int(high) if comma and high else low
            current += last * (times - 1)
            last *= times
            i = m.end()
        elif c in "*+?":
            i += 1
        elif c in "^$":
            last = 0
            i += 1
        else:
            current, last = current + 1, 1
            i += 1
    while stack:  # an unclosed group: llguidance refuses the pattern anyway
        size = total + current
        total, current = stack.pop()
        current += size
    return total + current
