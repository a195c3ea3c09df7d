"""The grammar that keeps a reply's tool calls valid: free text until the model opens a call (its
family's marker), then only well-formed calls of the offered tools, each call's arguments valid
under that tool's JSON Schema; or calls from the first token (tool_choice "required" or a named
function). A constrained.Grammar like the others, so every decode path takes it.

    grammar = tool_grammar(HERMES, tools, "auto", tokenizer)      # or "required", or a tool's name
    opener_id(HERMES, tokenizer)                                 # the opener's token id, or None

In llguidance's Lark dialect. Markers that are tokens of the vocabulary are matched as those tokens
(<[id]>): the same characters written another way stay text. Where the vocabulary lacks them they
are text, and free text ends at the first opener through a lazy rule (llguidance's way to end a
lexeme as soon as it can). Free text may hold the vocabulary's other added tokens (Qwen3's
<think>), never an end token before it ends. Each call is written as the family writes it, e.g.
`{"name": "get_weather", "arguments": {...}}`, spaced as --json-schema output is.
"""

from __future__ import annotations

import json

from ..errors import GrammarError
from ..formats.tokenizer import Tokenizer
from ..formats.tools import Tool, ToolFormat
from .constrained import JSON_LAYOUT, Grammar, _check, from_json_schema

FREE = r"/(.|\n)*/"


def added_tokens(tokenizer: Tokenizer) -> dict[str, int]:
    """Text -> id of the vocabulary's added tokens (llguidance matches these only as tokens)."""
    return {t.content: i for i, t in tokenizer.backend.get_added_tokens_decoder().items()}


def opener_id(fmt: ToolFormat, tokenizer: Tokenizer) -> int | None:
    return added_tokens(tokenizer).get(fmt.opener) if fmt.opener else None


def tool_grammar(fmt: ToolFormat, tools: list[Tool], choice: str, tokenizer: Tokenizer,
                 parallel: bool = True) -> Grammar:
    """`choice`: "auto" (text, or calls once opened), "required" (calls from the first token), or
    the name of the one tool to call. Every tool's parameters are checked as --json-schema's are."""
    added = added_tokens(tokenizer)
    eos = set(tokenizer.eos_ids)
    named = [t for t in tools if t.name == choice] if choice not in ("auto", "required") else tools
    if not named:
        raise GrammarError(f"tool_choice names {choice!r}, which is not among the tools")
    one = fmt.one_call or not parallel or choice not in ("auto", "required")
    rules = [f"fn: {' | '.join(f'fn_{i}' for i in range(len(named)))}"]
    for i, tool in enumerate(named):
        head = _lit('{"name": "%s", "%s": ' % (tool.name, fmt.args_key))
        rules.append(f"fn_{i}: {head} %json {_params(tool)} {_lit('}')}")

    def marker(text: str) -> str:
        return f"<[{added[text]}]>" if text in added else _lit(text)

    opener = marker(fmt.opener) if fmt.opener else None
    if fmt.listed:  # Phi-4-mini: <|tool_call|>[{...}, {...}]<|/tool_call|>
        body = f'"[" fn "]" {marker(fmt.closer)}' if one else f'"[" fn (", " fn)* "]" {marker(fmt.closer)}'
        calls = f"{opener} {body}"
    elif fmt.at_start:  # Llama 3: the reply is the call's JSON
        calls = "fn"
    else:  # Hermes: <tool_call>\n{...}\n</tool_call>, several separated by a newline
        each = f'"\\n" fn "\\n" {marker(fmt.closer)}'
        body = each if one else f'{each} ("\\n" {opener} {each})*'
        calls = f"{opener} {body}"
    if choice != "auto":
        rules.insert(0, f"start: {calls}")
    elif fmt.at_start:  # text that does not open with `{`, or a call (after whitespace or <|python_tag|>)
        tagged = f" | {opener} fn" if fmt.opener in added else ""
        rules.insert(0, f"start: FREE_START | /[ \\t\\r\\n]*/ fn{tagged}")
        rules.append(r"FREE_START: /[ \t\r\n]*([^{ \t\r\n](.|\n)*)?/")
    elif fmt.opener in added:
        others = sorted(set(added.values()) - eos - {added[fmt.opener], added.get(fmt.closer)})
        text = f"TEXT ({_ids(others)} TEXT)*" if others else "TEXT"
        rules.insert(0, f"start: text | text {calls}")
        rules += [f"text: {text}", f"TEXT: {FREE}"]
    else:
        rules.insert(0, f"start: TEXT | opened {body}")
        rules += [f"opened[lazy]: TEXT {_lit(fmt.opener)}", f"TEXT: {FREE}"]
    lark = "%llguidance {}\n" + "\n".join(rules) + "\n"
    compiled = json.dumps({"grammars": [{"lark_grammar": lark}]})
    _check(compiled, "the tools' grammar")
    return Grammar("tools", lark, compiled)


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _ids(ids: list[int]) -> str:
    """A choice of token ids, as ranges: (<[3-7]> | <[9]>)."""
    spans, start = [], None
    for i, t in enumerate(ids):
        if start is None:
            start = t
        if i + 1 == len(ids) or ids[i + 1] != t + 1:
            spans.append(f"<[{start}]>" if start == t else f"<[{start}-{t}]>")
            start = None
    return "(" + " | ".join(spans) + ")"


def _params(tool: Tool) -> str:
    """The tool's parameters schema, checked as --json-schema's are, laid out as its output is."""
    schema = dict(tool.parameters)
    from_json_schema(json.dumps(schema), f"the parameters of tool {tool.name!r}")
    schema.setdefault("x-guidance", JSON_LAYOUT)
    return json.dumps(schema, ensure_ascii=False)
