"""One chat session: a conversation, the model that answers it, and the KV cache kept across turns.

Each reply is generated from the whole conversation rendered through the model's chat template;
generate() reuses the longest prefix the cache already holds, so a new turn only prefills the tokens
that are new since the last reply. No terminal I/O here: chat.py reads and prints.
"""

from __future__ import annotations

import time
import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from ..decode.constrained import incomplete_message
from ..decode.stream import Stats
from ..decode.request import Request
from ..errors import IncompleteOutputError, InvalidParameterError
from ..text_input import check_text
from .conversation import Conversation, fit

if TYPE_CHECKING:
    from ..runtime.runtime import Runtime


@dataclass
class Turn:
    """What the last reply did."""
    text: str  # the text shown (with tools: before any call)
    finish: str  # "stop" | "length" | "interrupted"
    tokens: int  # tokens generated
    ttft_s: float | None  # None when interrupted before the first token
    stats: Stats | None  # None when interrupted (generate reports stats with its last chunk)
    context_used: int  # tokens in the cache after the reply
    stopped_by: str | None = None  # finish "length": "max_tokens" or "context" (generate.limit_reason)
    calls: list = field(default_factory=list)  # with tools: formats.tool_reply.Call, each whole and valid
    calls_cut: bool = False  # with tools: the reply ended inside a call
    reasoning: str = ""  # a reasoning model's thinking before the text (/show thinking)


# How the REPL's settings are named in a request's messages (/set parameter stop ...)
CHAT_SPELLING = {"stop": "stop texts", "max_tokens": "max-tokens", "hint": "; /set parameter stop none"}


class ChatSession:
    def __init__(self, rt: Runtime, conv: Conversation | None = None, step=None, request: Request = Request()):
        """`request`: what every reply follows beside the conversation's own parameters (sampling,
        max-tokens, stop: /set changes them): a grammar, or tools offered with every message (their
        calls are read out of the reply), a context shift."""
        self.rt = rt
        self.request = request
        # a template without tools is refused now, not at the first message
        self.grammar = rt.grammar(request) if request.tools else request.grammar  # every reply follows it
        self.conv = conv or Conversation()
        self.cache = rt.new_cache()
        self.step = step  # what runs decode steps (a compiled model); None: the model
        self.last: Turn | None = None
        self.replies = 0
        self.generated = 0
        self._prompt: list[int] | None = None  # set by add_user / take_back_reply, used by reply()

    @property
    def tools(self):
        return self.request.tools

    def reply_request(self) -> Request:
        """The next reply's request: the session's, with the conversation's parameters now."""
        c = self.conv
        return self.request.with_(CHAT_SPELLING, sampling=c.params, max_tokens=c.max_tokens, stop=c.stop)

    def decode_mode(self) -> str:
        """How decode steps run (Runtime.describe_step)."""
        return self.rt.describe_step(self.step)

    @property
    def ctx_size(self) -> int:
        return self.rt.ctx_size

    @property
    def model_info(self) -> dict:
        """How a saved conversation names the model it was written with."""
        loaded = self.rt.loaded
        return {"name": loaded.name, "architecture": loaded.metadata.get("architecture") or loaded.args.model_type,
                "weights": loaded.weights_type, "path": str(loaded.path)}

    def encode(self, messages: list[dict]) -> list[int]:
        return self.rt.prompt_ids(messages, tools=self.request.tools, request=self.request)

    @property
    def thinks(self) -> bool:
        """Whether replies start with thinking (a reasoning model, not switched off)."""
        return self.rt.reasoning_format is not None and self.request.think is not False \
            and self.request.reasoning_budget != 0

    def set_think(self, on: bool) -> str:
        """/set think on|off: the template's switch (or the thinking closed at once where it has none)."""
        if self.rt.reasoning_format is None:
            raise InvalidParameterError(f"{self.rt.loaded.name} does not think (its chat template has no <think> tags "
                                        "or analysis channel)")
        budget = self.request.reasoning_budget
        self.request = self.request.with_(think=on, reasoning_budget=None if not on or budget == 0 else budget)
        return "thinking on" if on else "thinking off"

    def context_used(self) -> int:
        """Tokens the conversation takes in the context now (0 before the first message)."""
        return len(self.encode(self.conv.window())) if self.conv.messages else 0

    def add_user(self, text: str) -> list[dict]:
        """Add a user message and fit the conversation to the context; returns the messages dropped
        to make room (usually none). A message that cannot fit is refused and not added."""
        if not text.strip():
            raise InvalidParameterError("the message is empty; type some text")
        check_text(text, "the message")
        self.reply_request()  # stop texts that could cut a reply the grammar must complete: refused now
        return self._add({"role": "user", "content": text})

    def _add(self, message: dict) -> list[dict]:
        """Append `message` and fit the conversation to the context (the messages dropped), or leave
        the conversation as it was if it cannot fit."""
        self.conv.messages.append(message)
        try:
            fitted = fit(self.conv, self.encode, self.ctx_size)
        except BaseException:
            self.conv.messages.pop()
            raise
        self._prompt = fitted.ids
        return fitted.dropped

    def add_tool_result(self, text: str) -> tuple[list[dict], bool]:
        """Answer the last reply's next unanswered tool call with `text`: (messages dropped to make
        room, whether every call of it is answered now, so that the model can reply)."""
        check_text(text, "the tool result")
        calls = self._open_calls()
        if not calls:
            raise InvalidParameterError("there is no tool call to answer; /tool answers the calls of the last reply")
        dropped = self._add({"role": "tool", "tool_call_id": calls[0]["id"], "content": text})
        return dropped, len(calls) == 1

    def _open_calls(self) -> list[dict]:
        """The last reply's calls that no tool message answers yet."""
        answered = []
        for m in reversed(self.conv.messages):
            if m["role"] == "tool":
                answered.append(m.get("tool_call_id"))
            elif m["role"] == "assistant":
                return [c for c in m.get("tool_calls") or [] if c["id"] not in answered]
            else:
                return []
        return []

    def take_back_reply(self) -> list[dict]:
        """For /regen: forget the last reply so reply() answers the same message again."""
        reply = self.conv.last_reply
        if reply is None:
            raise InvalidParameterError("there is no reply to generate again; send a message first")
        self.reply_request()
        self.conv.messages.pop()
        try:
            fitted = fit(self.conv, self.encode, self.ctx_size)
        except BaseException:
            self.conv.messages.append(reply)
            raise
        self._prompt = fitted.ids
        return fitted.dropped

    def reply(self) -> Iterator[str]:
        """Generate the assistant's reply, yielding text as it arrives. Closing this iterator early
        (Ctrl-C) stops generation between two tokens; the partial reply is kept, marked interrupted."""
        if self._prompt is None:
            raise RuntimeError("reply() needs add_user() or take_back_reply() first")
        prompt, self._prompt = self._prompt, None
        request = self.reply_request()
        t0 = time.perf_counter()
        pieces, thoughts, tokens, ttft, last = [], [], 0, None, None
        shift = self.rt.context_shift(self.conv.window()) if request.context_shift else None
        reader = self.rt.call_reader(request)
        calls_cut = False
        chunks = self.rt.generate(prompt, request, self.cache, self.step, shift=shift)
        try:
            for chunk in chunks:
                if chunk.tokens and ttft is None:
                    ttft = time.perf_counter() - t0
                tokens += len(chunk.tokens)
                thoughts.append(chunk.reasoning)
                calls_from = [] if chunk.reasoning else chunk.tokens  # (a thinking token is no call's opener)
                text = reader.push(chunk.text, calls_from)[0] if reader else chunk.text
                if chunk.finish_reason:
                    last = chunk
                    if reader:
                        rest, whole = reader.finish()
                        text, calls_cut = text + rest, not whole and reader.state == "calls"
                if text:
                    pieces.append(text)
                    yield text
        finally:
            chunks.close()
            text, thinking = "".join(pieces), "".join(thoughts)
            message = {"role": "assistant", "content": text}
            if thinking:  # for the templates that render it (Qwen3's drops it from earlier turns)
                message["reasoning_content"] = thinking
            calls = reader.calls if reader else []
            if calls:  # as OpenAI writes them, for the template to render in later turns
                message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                          "function": {"name": c.name, "arguments": c.json()}} for c in calls]
            if last is None:
                message["interrupted"] = True
            self.conv.messages.append(message)
            self.replies += 1
            self.generated += tokens
            self.last = Turn(text, last.finish_reason if last else "interrupted", tokens,
                             last.stats.ttft_s if last else ttft, last.stats if last else None,
                             len(prompt) + tokens if not (shift and shift.shifts) else self.cache.length + 1,
                             last.stopped_by if last else None, calls, calls_cut, thinking)

    def calls_json(self) -> str | None:
        """The last reply's calls as --tools prints them (one JSON line), or None."""
        if self.last is None or not self.last.calls:
            return None
        return json.dumps([{"name": c.name, "arguments": c.arguments} for c in self.last.calls], ensure_ascii=False)

    def check_reply(self) -> None:
        """With a grammar: raise unless the last reply is complete and valid (an interrupted one is
        left as it is: the user stopped it)."""
        turn = self.last
        if self.grammar is None or turn is None or turn.finish == "interrupted":
            return
        if self.tools:  # free text may end at -n; a call may not
            if turn.finish == "length" and (turn.calls_cut or (self.request.tool_choice != "auto" and not turn.calls)):
                raise IncompleteOutputError(incomplete_message(self.grammar, turn.tokens, self.conv.max_tokens))
            return
        if turn.finish == "length":
            raise IncompleteOutputError(incomplete_message(self.grammar, turn.tokens, self.conv.max_tokens))
        self.grammar.check_output(turn.text)
