"""Thinking kept apart from the answer: which format a model thinks in (read from its chat
template), a streaming parser per format, and one sequence's Reasoning (the parser, the count of
thinking tokens and the budget that closes the thinking).

    fmt = reasoning_format(template)          THINK (<think>...</think>), HARMONY (gpt-oss channels) or None
    r = Reasoning(fmt, tokenizer, prompt, budget=64)
    thinking, answer = r.push(token, text)    text_stream, per token (text: what the token decoded to)
    thinking, answer = r.finish()             at the end: what was held back
    r.forced()                                the token the budget forces next (None: the model picks)

The parsers work on text and never emit part of a marker as answer text: what may be the start of
one is held back until the next piece says. Where the thinking starts is read from the prompt's
end: a template that opens `<think>` itself (DeepSeek-R1 distills) starts inside it, one that
closes it (Qwen3 with enable_thinking false, SmolLM3's /no_think) starts in the answer, and
otherwise the model may open it with its first words. Thinking text comes out trimmed; the answer
after it without its leading whitespace (as llama-server and vLLM return them).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..formats.harmony_calls import RECIPIENT, call_header
from ..formats.tokenizer import Tokenizer

EFFORTS = ("low", "medium", "high")  # gpt-oss's reasoning_effort
FORMATS = ("auto", "deepseek", "none")  # reasoning_format: split (auto, llama.cpp's deepseek) or tags kept in the answer


@dataclass(frozen=True)
class ReasoningFormat:
    kind: str  # "think" | "harmony"
    switch: bool = False  # the template reads enable_thinking (Qwen3, SmolLM3): thinking can be turned off
    effort: bool = False  # the template reads reasoning_effort (gpt-oss)

    @property
    def markers(self) -> tuple[str, ...]:
        """The texts the parser must see even where they are special tokens that decoding drops."""
        return (OPEN, CLOSE) if self.kind == "think" else HARMONY_MARKERS

    def parser(self, prompt_tail: str, calls: bool = False):
        """`calls`: tools were offered (harmony: a message to=functions.NAME is a call, not thinking)."""
        return TagParser(prompt_tail) if self.kind == "think" else HarmonyParser(prompt_tail, calls)


def reasoning_format(template: str | None) -> ReasoningFormat | None:
    """The format a model thinks in, from its chat template; None for a model that does not."""
    if not template:
        return None
    if "<|channel|>" in template and "analysis" in template:
        return ReasoningFormat("harmony", effort="reasoning_effort" in template)
    if OPEN in template or CLOSE in template:
        return ReasoningFormat("think", switch="enable_thinking" in template)
    return None


def _held(text: str, markers) -> int:
    """Length of the longest end of `text` that is the start of a marker (held back)."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


# ------------------------------------------------------------------------- <think> ... </think>

OPEN, CLOSE = "<think>", "</think>"


class TagParser:
    """`<think>`...`</think>` (Qwen3, DeepSeek-R1, SmolLM3). States: "start" (the model may open
    the thinking with its first words), "thinking", "after" (the answer's leading whitespace), "answer"."""

    def __init__(self, prompt_tail: str = ""):
        tail = prompt_tail.rstrip()
        self.state = "thinking" if tail.endswith(OPEN) else "after" if tail.endswith(CLOSE) else "start"
        self.buf = ""
        self.lead = True  # the thinking's leading whitespace is dropped

    @property
    def thinking(self) -> bool:
        return self.state == "thinking"

    def closing(self) -> str | None:
        """The text that closes the thinking now (the budget), or None: nothing open to close."""
        return "\n" + CLOSE if self.state == "thinking" else None

    def push(self, text: str) -> tuple[str, str]:
        self.buf += text
        think, answer = [], []
        while self.buf:
            if self.state == "start":
                s = self.buf.lstrip()
                if s.startswith(OPEN):
                    self.state, self.buf = "thinking", s[len(OPEN):]
                elif not s or OPEN.startswith(s):
                    break  # whitespace, or the start of the opener: wait
                else:
                    self.state = "after"
            elif self.state == "thinking":
                at = self.buf.find(CLOSE)
                if at >= 0:
                    think.append(self._lead(self.buf[:at].rstrip()))
                    self.state, self.buf = "after", self.buf[at + len(CLOSE):]
                    continue
                keep = _held(self.buf, (CLOSE,))
                body = self.buf[:len(self.buf) - keep]
                sure = body.rstrip()  # trailing whitespace waits: it may end the thinking
                think.append(self._lead(sure))
                self.buf = self.buf[len(sure):]
                break
            elif self.state == "after":
                self.buf = self.buf.lstrip()
                if self.buf:
                    self.state = "answer"
            else:
                answer.append(self.buf)
                self.buf = ""
        return "".join(think), "".join(answer)

    def finish(self) -> tuple[str, str]:
        """What was held back: an unclosed thinking's text, or text that only looked like an opener."""
        rest, self.buf = self.buf, ""
        if self.state == "thinking":
            return self._lead(rest.rstrip()), ""
        return "", rest.strip() if self.state in ("start", "after") else rest

    def _lead(self, text: str) -> str:
        if self.lead:
            text = text.lstrip()
            self.lead = not text
        return text


# ------------------------------------------------------------------------------------ harmony

HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")
FINAL = "<|channel|>final<|message|>"


class HarmonyParser:
    """gpt-oss's harmony messages: `<|channel|>analysis<|message|>...<|end|><|start|>assistant
    <|channel|>final<|message|>...`. The analysis (and commentary) channels are thinking, final is
    the answer. With `calls` (tools were offered), a message addressed to=functions.NAME is a tool
    call: it goes to the answer under formats/harmony_calls.py's call_header(NAME), for its reader.
    States: "header" (up to <|message|>), "analysis", "commentary", "final", "call"."""

    def __init__(self, prompt_tail: str = "", calls: bool = False):
        self.calls = calls
        tail = prompt_tail.rstrip()
        self.state = "header"
        if tail.endswith("<|message|>"):
            header = tail[:-len("<|message|>")].rsplit("<|start|>", 1)[-1]
            self.state = self._channel(header)
        self.buf = ""
        self.ended = False  # a message ended (<|end|>): the next begins with <|start|>assistant
        self.lead = True

    @property
    def thinking(self) -> bool:
        return self.state in ("analysis", "commentary")

    def closing(self) -> str | None:
        if self.state == "analysis":
            return "<|end|><|start|>assistant" + FINAL
        if self.state == "header" and not self.buf:  # nothing written yet: straight to the answer
            return ("<|start|>assistant" if self.ended else "") + FINAL
        return None

    @staticmethod
    def _channel(header: str) -> str:
        if "<|channel|>" not in header:
            return "final"
        name = header.split("<|channel|>", 1)[1].strip().split()
        channel = name[0] if name else ""
        return channel if channel in ("analysis", "final") else "commentary"

    def push(self, text: str) -> tuple[str, str]:
        self.buf += text
        think, answer = [], []
        while self.buf:
            if self.state == "header":
                at = self.buf.find("<|message|>")
                if at < 0:
                    if "<|" not in self.buf and len(self.buf) > 64:  # no header at all: plain answer text
                        self.state = "final"
                        continue
                    break
                header = self.buf[:at]
                self.state = self._channel(header)
                self.buf = self.buf[at + len("<|message|>"):]
                self.lead = True
                if self.calls and (to := RECIPIENT.search(header)):
                    self.state = "call"
                    answer.append(call_header(to.group(1)))
                continue
            ends = [(i, m) for m in HARMONY_MARKERS if (i := self.buf.find(m)) >= 0]
            if ends:
                at, marker = min(ends)
                body, self.buf = self.buf[:at], self.buf[at:]
            else:
                keep = _held(self.buf, HARMONY_MARKERS)
                body, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
            self._body(body, think, answer)
            if not ends:
                break
            if marker in ("<|end|>", "<|return|>", "<|call|>"):
                self.buf = self.buf[len(marker):]
                self.ended = True
            self.state = "header"  # <|start|> (kept: the header reads it) or after an end
        return "".join(think), "".join(answer)

    def _body(self, text: str, think: list, answer: list) -> None:
        if self.lead:
            text = text.lstrip()
            self.lead = not text
        (answer if self.state in ("final", "call") else think).append(text)

    def finish(self) -> tuple[str, str]:
        rest, self.buf = self.buf, ""
        if self.state == "header":
            return "", ""
        think, answer = [], []
        self._body(rest, think, answer)
        return "".join(think).rstrip(), "".join(answer)


# -------------------------------------------------------------------------------- one sequence


class Reasoning:
    """One sequence's thinking: the format's parser, started where the prompt leaves it; the number
    of tokens generated while thinking (`tokens`); and the `budget`: after that many thinking
    tokens, forced() gives the tokens that close the thinking, one at a time, and the parser reads
    them like any others. `raw` (reasoning_format none): everything stays answer text, tags included."""

    def __init__(self, fmt: ReasoningFormat, tokenizer: Tokenizer, prompt: list[int], budget: int | None = None,
                 raw: bool = False, calls: bool = False):
        self.format, self.tokenizer, self.budget, self.raw = fmt, tokenizer, budget, raw
        self.parser = fmt.parser(tokenizer.decode(prompt[-24:], skip_special=False), calls)
        # marker texts of special tokens, which decoding drops: the parser must see them
        self.markers = {i: t for t in fmt.markers
                        if (i := tokenizer.backend.token_to_id(t)) is not None and i in tokenizer.special_ids}
        self.tokens = 0
        self.cut = False  # the budget closed the thinking
        self._queue: list[int] = []

    @property
    def thinking(self) -> bool:
        return self.parser.thinking

    @property
    def state(self) -> str:
        return self.parser.state

    def opener_id(self) -> int | None:
        """The token that opens the thinking where it is one token (a grammar allows it first)."""
        if self.format.kind != "think" or self.parser.state != "start":
            return None
        return self.tokenizer.backend.token_to_id(OPEN)

    def forced(self) -> int | None:
        """The next token the budget forces (None: the model chooses)."""
        if not self._queue and not self.cut and self.budget is not None and self.tokens >= self.budget:
            text = self.parser.closing()
            if text is not None:
                self._queue = self.tokenizer.encode(text, add_bos=False)
                self.cut = True
        return self._queue[0] if self._queue else None

    @property
    def forcing(self) -> bool:
        return bool(self._queue)

    def push(self, token: int | None, text: str) -> tuple[str, str]:
        """(thinking, answer) text of one generated token that decoded to `text` (None: text the
        decoder held back, at the end)."""
        if token is None:
            think, answer = self.parser.push(text)
            return ("", text) if self.raw else (think, answer)
        if self._queue:
            self._queue = self._queue[1:] if token == self._queue[0] else []
        if token in self.markers:
            text += self.markers[token]
        before = self.parser.thinking
        think, answer = self.parser.push(text)
        if before or self.parser.thinking:
            self.tokens += 1
        return ("", text) if self.raw else (think, answer)

    def finish(self) -> tuple[str, str]:
        think, answer = self.parser.finish()
        return ("", "") if self.raw else (think, answer)


def template_variables(fmt: ReasoningFormat | None, think: bool | None, budget: int | None,
                       effort: str | None) -> dict:
    """What the chat template is told: enable_thinking where it has the switch (off for --no-think
    or a budget of 0), reasoning_effort where it reads it."""
    out = {}
    if fmt is None:
        return out
    if fmt.switch and (think is not None or budget == 0):
        out["enable_thinking"] = bool(think) if think is not None else False
    if fmt.effort and effort is not None:
        out["reasoning_effort"] = effort
    return out


def reasoning_variables(fmt: ReasoningFormat | None, request, variables: dict | None = None) -> dict:
    """What a chat template is told beside the messages: `request`'s (decode.Request) thinking
    switch and effort, then the caller's own `variables` (a server's chat_template_kwargs), which win."""
    out = template_variables(fmt, request.think, request.reasoning_budget, request.reasoning_effort) if request else {}
    return {**out, **(variables or {})}


def sequence_reasoning(fmt: ReasoningFormat | None, tokenizer: Tokenizer, prompt: list[int], think: bool | None,
                       budget: int | None, reasoning_format: str = "auto", calls: bool = False) -> Reasoning | None:
    """The Reasoning of one sequence of a request (None: the model does not think). Thinking turned
    off where the template has no switch is a budget of 0: closed as soon as it opens. `calls`:
    the request offers tools (a harmony message to a function is a call)."""
    if fmt is None:
        return None
    if think is False and not fmt.switch:
        budget = 0
    return Reasoning(fmt, tokenizer, prompt, budget, raw=reasoning_format == "none", calls=calls)
