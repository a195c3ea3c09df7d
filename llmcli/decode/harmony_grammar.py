"""The grammar that keeps gpt-oss's tool calls valid (harmony). Unlike the other families'
(tool_grammar.py), it spans the whole reply, thinking included: a call is a message of its own
after the analysis ones, and its header names the tool whose schema the body follows.

    grammar = harmony_grammar(tools, "auto", tokenizer)   # or "required", or a tool's name

The reply goes on from the prompt's `<|start|>assistant`: messages of thought (analysis, or
commentary to no one), each ended by <|end|> and followed by the next header, then either the
final answer (auto only; <|return|> ends it) or one call, which <|call|> ends:

    <|channel|>analysis<|message|>TEXT<|end|><|start|>assistant<|channel|>commentary to=functions.NAME
    <|constrain|>json<|message|>{...}<|call|>

The recipient may come before the channel (` to=functions.NAME<|channel|>commentary`), as the
template writes past calls, and `<|constrain|>json` or `json` may follow it. Markers are matched
as their tokens (<[id]>); text holds no special token. Grammar.whole_reply tells think_first.py to
give it every token, not only the answer's.
"""

from __future__ import annotations

import json

from ..errors import GrammarError
from ..formats.tokenizer import Tokenizer
from ..formats.tools import Tool
from .constrained import Grammar, _check
from .tool_grammar import FREE, _lit, _params, added_tokens

MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>")


def harmony_grammar(tools: list[Tool], choice: str, tokenizer: Tokenizer) -> Grammar:
    """`choice`: "auto" (thoughts, then the final answer or a call), "required" (thoughts, then a
    call), or the name of the one tool to call."""
    added = added_tokens(tokenizer)
    missing = [m for m in MARKERS if m not in added]
    if missing:
        raise GrammarError(f"this model's vocabulary lacks harmony's {', '.join(missing)}, which its tool calls need")
    start, channel, message, end, call = (f"<[{added[m]}]>" for m in MARKERS)
    named = [t for t in tools if t.name == choice] if choice not in ("auto", "required") else tools
    if not named:
        raise GrammarError(f"tool_choice names {choice!r}, which is not among the tools")
    json_as = '" json"' + (f' | " " <[{added["<|constrain|>"]}]> "json"' if "<|constrain|>" in added else "")
    rules = [
        f"start: (thought {end} {start} {_lit('assistant')})* " + ("(final | call)" if choice == "auto" else "call"),
        f'thought: {channel} ("analysis" | "commentary") {message} TEXT',
        f'final: {channel} "final" {message} TEXT',
        f"call: {' | '.join(f'call_{i}' for i in range(len(named)))}",
        f"json_as: {json_as}",
        f"TEXT: {FREE}",
    ]
    for i, tool in enumerate(named):
        to = _lit(f" to=functions.{tool.name}")
        head = f'({to} {channel} "commentary" | {channel} "commentary" {to})'
        rules.append(f"call_{i}: {head} json_as? {message} %json {_params(tool)} {call}")
    lark = "%llguidance {}\n" + "\n".join(rules) + "\n"
    compiled = json.dumps({"grammars": [{"lark_grammar": lark}]})
    _check(compiled, "the tools' grammar")
    return Grammar("tools", lark, compiled, whole_reply=True)
