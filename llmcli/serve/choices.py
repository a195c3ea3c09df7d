"""The choices of one answer, each built from its engine request's chunks: what to stream as they
come (deltas) and the whole choice at the end. A request with `n` > 1 has n of them, decoded
together and independent.

    choice = ChatChoice(index, cursor, reader)   # cursor: logprobs.LogprobCursor; reader: a tool CallReader
    deltas = choice.push(chunk)                  # [(delta, logprobs)] to stream for this chunk
    choice.finish_reason, choice.body()          # once its last chunk was pushed

With tools, the reader holds back what may open a call, and a call goes out whole, as one
tool_calls delta, once its JSON is complete (its arguments parse and validate). A reasoning model's
thinking (Chunk.reasoning) goes out as `reasoning_content` deltas, apart from the content.
"""

from __future__ import annotations

from . import openai_api as api
from .logprobs import merge_legacy


class ChatChoice:
    def __init__(self, index: int, cursor=None, reader=None):
        self.index, self.cursor, self.reader = index, cursor, reader
        self.pieces: list[str] = []
        self.thoughts: list[str] = []  # the thinking of a reasoning model
        self.entries: list[dict] = []  # every logprobs entry
        self.unsent: list[dict] = []  # entries not streamed yet (their text was held back)
        self.last = None  # the chunk with the finish_reason
        self.sent_calls = 0

    def push(self, chunk) -> list[tuple[dict, list[dict] | None]]:
        """(delta, logprobs entries or None) pairs to stream for `chunk` (the finish is the caller's)."""
        entries = self.cursor.chat(chunk) if self.cursor else []
        self.entries += entries
        self.unsent += entries
        if self.reader is None:
            text = chunk.text
        else:  # (a thinking token is no call's opener)
            text, _ = self.reader.push(chunk.text, [] if chunk.reasoning else chunk.tokens)
        if chunk.finish_reason is not None:
            self.last = chunk
            if self.reader is not None:
                rest, self.whole = self.reader.finish()
                text += rest
        self.pieces.append(text)
        self.thoughts.append(chunk.reasoning)
        out = []
        if chunk.reasoning:
            out.append(({"reasoning_content": chunk.reasoning}, None if text else self._take()))
        if text or (chunk.finish_reason is not None and self.unsent):
            out.append(({"content": text}, self._take()))
        calls = self.reader.calls if self.reader is not None else []
        for k in range(self.sent_calls, len(calls)):
            out.append(({"tool_calls": [api.tool_call(calls[k], k)]}, self._take()))
        self.sent_calls = len(calls)
        return out

    def _take(self) -> list[dict] | None:
        if self.cursor is None:
            return None
        taken, self.unsent = self.unsent, []
        return taken

    @property
    def calls(self) -> list:
        return self.reader.calls if self.reader is not None else []

    @property
    def finish_reason(self) -> str:
        if self.calls and self.last.finish_reason == "stop":
            return "tool_calls"
        return self.last.finish_reason

    def body(self) -> dict:
        """The non-streamed choice: the message (with its tool_calls) and logprobs."""
        text = "".join(self.pieces)
        content = None if self.calls and not text.strip() else text
        return api.chat_choice(self.index, content, self.finish_reason, self.entries if self.cursor else None,
                               self.last.stopped_by, self.calls, "".join(self.thoughts))


class CompletionChoice:
    """The legacy endpoint's choice: text, and logprobs as parallel lists whose text_offset runs on
    from `offset` (the prompt's length, as OpenAI counts)."""

    def __init__(self, index: int, cursor=None, offset: int = 0):
        self.index, self.cursor, self.offset = index, cursor, offset
        self.pieces: list[str] = []
        self.parts: list[dict] = []
        self.last = None

    def push(self, chunk) -> dict | None:
        """This chunk's legacy logprobs (None without them)."""
        lp = None
        if self.cursor is not None:
            lp = self.cursor.legacy(chunk, self.offset)
            self.parts.append(lp)
        self.offset += len(chunk.text)
        self.pieces.append(chunk.text)
        if chunk.finish_reason is not None:
            self.last = chunk
        return lp

    @property
    def finish_reason(self) -> str:
        return self.last.finish_reason

    def body(self) -> dict:
        return api.completion_choice(self.index, "".join(self.pieces), self.finish_reason,
                                     merge_legacy(self.parts) if self.cursor else None, self.last.stopped_by)
