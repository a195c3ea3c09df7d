"""gpt-oss's tool calls (harmony), read out of a reply's answer text. A call is a message on the
commentary channel addressed to the function, its body the arguments' JSON, and <|call|> ends the
reply:

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

(the recipient may also come first: ` to=functions.x<|channel|>commentary json<|message|>`).
decode/reasoning.py's HarmonyParser reads the headers; where tools were offered it gives a call's
message to the answer under one header, call_header(name) (the one gpt-oss's template writes for a
past call), and HarmonyCallReader takes the calls from there as tool_reply.CallReader does for the
other families (same push/finish/calls).

    reader = HarmonyCallReader(tools)           # calls_only: tool_choice required or named
    text, calls = reader.push(chunk.text, chunk.tokens)
    text, complete = reader.finish()
"""

from __future__ import annotations

import json
import re

from .tool_reply import Call, CallReader
from .tools import HARMONY, Tool

OPENER = "<|start|>assistant to=functions."
RECIPIENT = re.compile(r"to=functions\.([A-Za-z0-9_-]+)")  # in a message's header
_HEADER = re.compile(re.escape(OPENER) + r"([A-Za-z0-9_-]+)<\|channel\|>commentary json<\|message\|>")


def call_header(name: str) -> str:
    """The header a call's message is given to the answer under."""
    return f"{OPENER}{name}<|channel|>commentary json<|message|>"


class HarmonyCallReader(CallReader):
    """CallReader's holding back and states; a call is call_header(name) then the arguments' JSON
    (then <|call|>, when the parser saw it)."""

    def __init__(self, tools: list[Tool], calls_only: bool = False):
        super().__init__(HARMONY, None, tools, calls_only)
        self.text_opener = OPENER

    def finish(self) -> tuple[str, bool]:
        out, self.held = self.held, ""
        if self.state != "calls":
            return out, True
        self._scan()
        return out, self.body[self.end:].replace("<|call|>", "").strip() == "" and bool(self.calls)

    def _scan(self) -> list[Call]:
        decoder, before, pos = json.JSONDecoder(), len(self.calls), self.end
        while True:
            while pos < len(self.body) and (self.body[pos].isspace() or self.body.startswith("<|call|>", pos)):
                pos += 1 if self.body[pos].isspace() else len("<|call|>")
            header = _HEADER.match(self.body, pos)
            if header is None:
                break  # the end, or a header not whole yet
            try:
                value, pos = decoder.raw_decode(self.body, header.end())
            except json.JSONDecodeError:
                break  # not complete yet
            self.calls.append(self._checked(header.group(1), value, {"name": header.group(1), "arguments": value}))
            self.end = pos
        return self.calls[before:]
