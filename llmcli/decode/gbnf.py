"""llama.cpp's GBNF grammars, in llguidance's Lark, with llama.cpp's meaning kept.

    lark = gbnf_as_lark(open("arithmetic.gbnf").read())

llguidance's converter (llguidance.gbnf_to_lark) makes each rule built only of literals and
character classes one lexeme, which its lexer matches greedily; llama.cpp parses a character at a
time. The two differ where a lexeme can run on past the point where the grammar needed it to
stop: in llama.cpp's arithmetic.gbnf, `num ::= [0-9]+ ws` (ws ::= [ \\t\\n]*) swallows the newline
that `root` wants next, so no text ever completes that grammar. Parsing every rule a character at
a time is right but slow: token masks took a hundred times longer for json.gbnf.

So a terminal rule stays a lexeme only where greedy matching cannot cut a parse: where its language
is prefix-free (no text of it begins another, so the first complete match is the only one). Where
only a front part is (json.gbnf's `string ::= "\\"" (...)* "\\"" ws`: the quoted string is, the
trailing `ws` is not), that part becomes a lexeme and the rest is parsed by characters. The check
is conservative (character classes are compared only against single characters): where it cannot
tell, a rule is parsed by characters, which is always right.
"""

from __future__ import annotations

import re
from functools import lru_cache

_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\", "[": "[", "]": "]", "/": "/"}


def gbnf_as_lark(text: str) -> str:
    from llguidance.gbnf_to_lark import GrammarParser, RuleNode, RuleRefNode, SequenceNode, resolve

    rules = GrammarParser().parse(text)
    resolve(rules)
    terminals = [r for r in rules.values() if r.rule_is_terminal]
    kept = {r.name for r in terminals if _prefix_free(r.alternatives)}
    changed = True
    while changed:  # a lexeme may only be built of lexemes: drop those that use a dropped one
        changed = False
        for r in terminals:
            if r.name in kept and not _refs_kept(r.alternatives, kept):
                kept.discard(r.name)
                changed = True
    heads = []
    for r in terminals:
        if r.name in kept:
            continue
        parts = list(r.alternatives.nodes) if isinstance(r.alternatives, SequenceNode) else [r.alternatives]
        j = _prefix_free_head(parts, kept)
        r.rule_is_terminal, r.name = False, r.name.lower()
        if j > 1 or (j == 1 and not _one_char(parts[0])):  # a front part worth a lexeme
            head = RuleNode(f"{r.name.upper()}_HEAD", SequenceNode(parts[:j]) if j > 1 else parts[0], "",
                            rule_is_terminal=True)
            head.order = r.order
            r.alternatives = SequenceNode([RuleRefNode(head.name, head), *parts[j:]])
            heads.append(head)
    ordered = sorted([*rules.values(), *heads], key=lambda r: r.order)
    return "%llguidance {}\n\n" + "\n".join(str(r) for r in ordered) + "\n"


# ------------------------------------------------------------------------------ the analysis
# Over llguidance's GBNF AST: LiteralNode(value, escaped as Lark writes it), RegexNode(rx: one
# character class, or "."), SequenceNode, AlternativeNode, RepetitionNode(node, min, max), and
# RuleRefNode (inside a terminal rule, only to other terminal rules, which never recurse).


def _kind(node) -> str:
    return type(node).__name__


def _target(node):
    return node.target.alternatives


def _nullable(node) -> bool:
    k = _kind(node)
    if k == "LiteralNode":
        return node.value == ""
    if k == "RegexNode":
        return False
    if k == "SequenceNode":
        return all(_nullable(n) for n in node.nodes)
    if k == "AlternativeNode":
        return any(_nullable(n) for n in node.alternatives)
    if k == "RepetitionNode":
        return node.min_times == 0 or _nullable(node.node)
    return _nullable(_target(node))


def _first(node) -> list[tuple[str, str]]:
    """What can begin `node`'s text: ("char", c) and ("class", regex) items."""
    k = _kind(node)
    if k == "LiteralNode":
        return [("char", _decode(node.value)[0])] if node.value else []
    if k == "RegexNode":
        return [("class", node.rx)]
    if k == "SequenceNode":
        out = []
        for n in node.nodes:
            out += _first(n)
            if not _nullable(n):
                break
        return out
    if k == "AlternativeNode":
        return [f for n in node.alternatives for f in _first(n)]
    if k == "RepetitionNode":
        return _first(node.node)
    return _first(_target(node))


def _disjoint(a: list, b: list) -> bool:
    for ka, va in a:
        for kb, vb in b:
            if ka == kb == "char":
                if va == vb:
                    return False
            elif ka == kb == "class":
                return False  # two classes: not compared (conservative)
            else:
                char, cls = (va, vb) if ka == "char" else (vb, va)
                pattern = _class(cls)
                if pattern is None or pattern.fullmatch(char):
                    return False
    return True


def _prefix_free(node) -> bool:
    """No text of the node's language is the beginning of another (sufficient conditions)."""
    k = _kind(node)
    if k == "LiteralNode":
        return node.value != ""
    if k == "RegexNode":
        return True  # one character
    if k == "SequenceNode":
        return _sequence_prefix_free(list(node.nodes))
    if k == "AlternativeNode":
        alts = node.alternatives
        return all(_prefix_free(n) and not _nullable(n) for n in alts) and all(
            _disjoint(_first(x), _first(y)) for i, x in enumerate(alts) for y in alts[i + 1:])
    if k == "RepetitionNode":
        return node.min_times == node.max_times and node.min_times > 0 and _prefix_free(node.node)
    return _prefix_free(_target(node))


def _sequence_prefix_free(parts: list) -> bool:
    """A sequence of prefix-free parts is prefix-free; so is one with a repetition of a prefix-free
    part when what comes next is not empty and cannot begin like the repeated part (the repetition
    then ends exactly where the next part begins)."""
    if not parts:
        return False
    for i, p in enumerate(parts):
        if _prefix_free(p):
            continue
        if (_kind(p) == "RepetitionNode" and _prefix_free(p.node) and not _nullable(p.node) and i + 1 < len(parts)
                and not _nullable(parts[i + 1]) and _disjoint(_first(p.node), _first(parts[i + 1]))):
            continue
        return False
    return True


def _prefix_free_head(parts: list, kept: set) -> int:
    """The length of the longest front part of `parts` that is prefix-free and built of lexemes."""
    for j in range(len(parts), 0, -1):
        head = parts[:j]
        if _sequence_prefix_free(head) and all(_refs_kept(p, kept) for p in head):
            return j
    return 0


def _refs_kept(node, kept: set) -> bool:
    k = _kind(node)
    if k == "RuleRefNode":
        return node.target.name in kept
    children = {"SequenceNode": lambda: node.nodes, "AlternativeNode": lambda: node.alternatives,
                "RepetitionNode": lambda: [node.node]}.get(k, lambda: [])()
    return all(_refs_kept(c, kept) for c in children)


def _one_char(node) -> bool:
    return _kind(node) == "RegexNode" or (_kind(node) == "LiteralNode" and len(_decode(node.value)) == 1)


def _decode(value: str) -> str:
    """A literal's text as Lark writes it (\\n, \\", \\xHH, \\uHHHH escapes) -> the characters."""
    def one(m):
        e = m.group(1)
        if e[0] in "xuU":
            return chr(int(e[1:], 16))
        return _ESCAPES.get(e, e)
    return re.sub(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|.)", one, value)


@lru_cache(maxsize=256)
def _class(rx: str):
    """A character class as a Python pattern, or None where Python reads it otherwise."""
    if rx == ".":
        return re.compile(r"[^\n]")
    rx = re.sub(r"\\u([0-9a-fA-F]{1,4})(?![0-9a-fA-F])", lambda m: "\\u" + m.group(1).zfill(4), rx)
    rx = re.sub(r"\\U([0-9a-fA-F]{1,8})(?![0-9a-fA-F])", lambda m: "\\U" + m.group(1).zfill(8), rx)
    try:
        return re.compile(rx)
    except re.error:
        return None
