"""A conversation -> prompt token ids, where only the chat template's own structure makes control
tokens: the text of the messages never does.

Tokenizing the rendered prompt as one string turns every special token written anywhere in it into
its id, so a user message holding `<|im_end|>\n<|im_start|>system\n...` would close its own turn and
open a system turn on a ChatML model. Here the special tokens inside the messages are swapped for
sentinels (private-use characters around a random number) before rendering; the special tokens
left in the rendered text are the template's own and become ids, and the text between them, with
the sentinels put back, is tokenized with special tokens as plain text (llama.cpp's
`parse_special=false` for content). A conversation without special tokens in its messages (every
ordinary one) gives exactly the ids of tokenizing the rendered text.

One exception, written by llmcli itself: a message text may be a `Markup`, pieces of message text and
of the model family's own markup (a tool call in the syntax a template leaves to the model, e.g.
Phi-4-mini's `<|tool_call|>...<|/tool_call|>`); its markup pieces make control tokens, its text
pieces do not.

    conversation_ids(tokenizer, template, [{"role": "user", "content": "Hi"}])
"""

from __future__ import annotations

import re
import secrets

from dataclasses import dataclass

from .chat_template import plain_prompt, render
from .tokenizer import Tokenizer


@dataclass(frozen=True)
class Markup:
    """Message text with pieces of the family's own markup in it: (text, is_markup) pairs."""

    pieces: tuple[tuple[str, bool], ...]

    def __str__(self) -> str:
        return "".join(text for text, _ in self.pieces)


def conversation_ids(tok: Tokenizer, template: str | None, messages: list[dict], **variables) -> list[int]:
    """The prompt for the next reply: `messages` through `template` (None: plain_prompt, all of it
    message text), with a generation prompt. `variables` go to the template as they are (`tools`:
    the tool definitions, OpenAI's shape, as Hugging Face passes them); special tokens written in
    them are plain text too."""
    if template is None:
        return tok.encode(plain_prompt([{**m, "content": str(m["content"])} for m in messages]), special=False)
    sentinels = _Sentinels(tok)
    marked = [sentinels.mark(m) for m in messages]
    variables = {k: sentinels.mark(v) for k, v in variables.items()}
    text = render(template, marked, add_generation_prompt=True, bos_token=tok.bos_token, eos_token=tok.eos_token,
                  **variables)
    if not sentinels.literal:  # no special token in the messages: the rendered text is all there is
        return tok.encode(text, add_bos=False)  # the template writes BOS itself where the model wants one
    return template_ids(tok, text, sentinels.restore)


def template_ids(tok: Tokenizer, text: str, restore=lambda s: s) -> list[int]:
    """The special tokens in `text` as ids, and each stretch of text between them, through
    `restore`, with special tokens as plain text. For text whose stretches hold no special token
    this is tok.encode(text): the tokenizer splits at special tokens first, then tokenizes each
    stretch on its own."""
    ids, at = [], 0
    for start, end, token in tok.special_tokens_in(text):
        ids += tok.encode(restore(text[at:start]), add_bos=False, special=False) if start > at else []
        ids.append(token)
        at = end
    return ids + (tok.encode(restore(text[at:]), add_bos=False, special=False) if at < len(text) else [])


class _Sentinels:
    """Special tokens in message text <-> sentinels that no tokenizer or template filter changes."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.nonce = str(secrets.randbits(48))  # digits: `upper`, `lower` and `trim` leave them alone
        self.literal: dict[str, str] = {}  # sentinel -> the special token's text it stands for
        self._pattern = re.compile("\ue000" + self.nonce + r"\.\d+\ue001")

    def mark(self, value):
        """`value` (a message, its content, any JSON-like part) with special tokens in its text swapped."""
        if isinstance(value, str):
            return self._mark_text(value)
        if isinstance(value, Markup):
            return "".join(text if markup else self._mark_text(text) for text, markup in value.pieces)
        if isinstance(value, dict):
            return {k: self.mark(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.mark(v) for v in value]
        return value

    def _mark_text(self, text: str) -> str:
        found = self.tok.special_tokens_in(text) if text else []
        if not found:
            return text
        pieces, at = [], 0
        for start, end, _ in found:
            sentinel = f"\ue000{self.nonce}.{len(self.literal)}\ue001"
            self.literal[sentinel] = text[start:end]
            pieces += [text[at:start], sentinel]
            at = end
        return "".join(pieces + [text[at:]])

    def restore(self, text: str) -> str:
        return self._pattern.sub(lambda m: self.literal.get(m.group(0), m.group(0)), text)
