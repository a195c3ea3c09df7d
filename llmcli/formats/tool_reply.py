"""A reply that may call tools, read as it streams: the text before any call (the message's
content) and each call once its JSON is complete.

    reader = CallReader(HERMES, opener_id, tools)       # opener_id: the opener's token id, if it is one
    text, calls = reader.push(chunk.text, chunk.tokens)  # content to show now, calls just completed
    text, complete = reader.finish()                      # at the end: the rest; were the calls whole?
    reader.calls                                         # every call

The grammar (decode/tool_grammar.py) has already kept the calls well formed, so reading them is
scanning: the opener, one JSON value (raw_decode: a "</tool_call>" inside a string is no end), the
closer, and so on. A family whose opener is a token of its vocabulary opens a call only with that
token (the same characters written otherwise are text); one whose vocabulary lacks it opens a call
with the text. Content is held back while it might be the start of a call: whitespace at its end
(dropped before a call) and a partial opener.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import InvalidOutputError
from .tools import Tool, ToolFormat


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict

    def json(self) -> str:
        """The arguments as OpenAI sends them: a JSON string."""
        return json.dumps(self.arguments, ensure_ascii=False)


class CallReader:
    def __init__(self, fmt: ToolFormat, opener_id: int | None, tools: list[Tool], calls_only: bool = False):
        """`calls_only`: the output is calls from its first token (tool_choice required or named)."""
        self.fmt, self.opener_id, self.tools = fmt, opener_id, {t.name: t for t in tools}
        self.state = "calls" if calls_only else ("undecided" if fmt.at_start else "text")
        self.text_opener = fmt.opener if opener_id is None and not fmt.at_start else None
        self.held = ""  # content not shown yet (trailing whitespace, a partial opener)
        self.body = ""  # the text from the opener on
        self.end = 0  # body[:end] is read: whole calls
        self.calls: list[Call] = []

    def push(self, text: str, tokens: list[int]) -> tuple[str, list[Call]]:
        if self.state == "calls":
            self.body += text
            return "", self._scan()
        if self.opener_id is not None and self.opener_id in tokens:  # the chunk of the opener token
            return self._open(self.held, text)
        self.held += text
        if self.state == "undecided":  # a reply that opens with `{` is a call (llama3)
            if not self.held.strip():
                return "", []
            if self.held.lstrip().startswith("{"):
                return self._open("", self.held.lstrip())
            self.state = "text"
        if self.text_opener is not None and self.text_opener in self.held:
            at = self.held.find(self.text_opener)
            return self._open(self.held[:at], self.held[at:])
        partial = _partial(self.held, self.text_opener) if self.text_opener is not None else 0
        before = self.held[:len(self.held) - partial]
        cut = len(before.rstrip())  # whitespace, then maybe the start of an opener: held back
        out, self.held = self.held[:cut], self.held[cut:]
        return out, []

    def finish(self) -> tuple[str, bool]:
        """The content still held back, and whether the reply ended outside a call (False: it was
        cut inside one; the calls before it are whole)."""
        out, self.held = self.held, ""
        if self.state != "calls":
            return out, True
        self._scan()
        rest = self.body[self.end:].replace(self.fmt.closer or "\0", "")
        return out, rest.strip() == "" and bool(self.calls)

    def _open(self, before: str, body: str) -> tuple[str, list[Call]]:
        """The calls begin: the content before them (without its trailing whitespace) goes out."""
        self.state, self.body, self.held = "calls", body, ""
        return before.rstrip(), self._scan()

    def _scan(self) -> list[Call]:
        """Calls completed since the last scan (the body is re-read from its last whole call)."""
        decoder, before = json.JSONDecoder(), len(self.calls)
        pos = self.end
        while True:
            pos = _skip(self.body, pos, self.fmt)
            if pos >= len(self.body):
                break
            try:
                value, pos = decoder.raw_decode(self.body, pos)
            except json.JSONDecodeError:
                break  # not complete yet
            self.calls += [self._call(v) for v in (value if self.fmt.listed and isinstance(value, list) else [value])]
            self.end = pos
        return self.calls[before:]

    def _call(self, value) -> Call:
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            raise InvalidOutputError(f"a tool call is not {{\"name\": ..., \"{self.fmt.args_key}\": ...}} ({value!r:.80}); "
                                     "this is a bug, please report it")
        return self._checked(value["name"], value.get(self.fmt.args_key, {}), value)

    def _checked(self, name: str, args, shown) -> Call:
        """The call of `name` with `args`, which must be an offered tool's and valid under its schema
        (the grammar kept them so: otherwise a bug); `shown`: what the message quotes."""
        tool = self.tools.get(name)
        if tool is None or not isinstance(args, dict):
            raise InvalidOutputError(f"the tool call {shown!r:.80} names no offered tool or has no arguments object; "
                                     "this is a bug, please report it")
        _validate(args, tool)
        return Call(name, args)


def _skip(text: str, pos: int, fmt: ToolFormat) -> int:
    """Past whitespace and the family's markers (the grammar put them where they belong)."""
    markers = [m for m in (fmt.opener, fmt.closer) if m]
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        for m in markers:
            if text.startswith(m, pos):
                pos += len(m)
                break
        else:
            return pos
    return pos


def _partial(text: str, word: str) -> int:
    """Length of the longest end of `text` that begins `word`."""
    for n in range(min(len(word) - 1, len(text)), 0, -1):
        if text.endswith(word[:n]):
            return n
    return 0


def _validate(args: dict, tool: Tool) -> None:
    """The independent check of what the grammar guaranteed: the arguments validate."""
    import jsonschema

    cls = jsonschema.validators.validator_for(tool.parameters, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(cls(tool.parameters).iter_errors(args))
    if error is not None:
        raise InvalidOutputError(f"the arguments of a call to {tool.name} do not validate ({error.message}); "
                                 "this is a bug, please report it")
