"""Log-probabilities as OpenAI returns them: a sequence's recorded entries (decode.picker.Logprobs),
handed out with the chunks they belong to, in chat's shape or the legacy completions' shape, and
the bytes each token stands for.

    cursor = LogprobCursor(seq.logprobs, tokenizer)
    cursor.chat(chunk)              [{token, logprob, bytes, top_logprobs}] for the chunk's tokens
    cursor.legacy(chunk, offset)    {tokens, token_logprobs, top_logprobs, text_offset}
"""

from __future__ import annotations

import re
from functools import lru_cache

IMPOSSIBLE = -9999.0  # what OpenAI reports for a logprob of -inf (JSON has no infinity)


class LogprobCursor:
    """A request's generate.Logprobs entries, handed out with the chunks they belong to.

    The engine records an entry per sampled token before it makes that token's chunk, so a chunk's
    token is the next entry. A grammar's closing end token was never sampled (no entry); a sampled
    end-of-sequence token is skipped: it is not part of the text, so its entry is not either."""

    def __init__(self, recorder, tokenizer):
        self.recorder, self.tokenizer, self.taken = recorder, tokenizer, 0

    def take(self, chunk) -> list[tuple[int, float, list]]:
        out = []
        entries = self.recorder.entries
        for token in chunk.tokens:
            if self.taken < len(entries) and entries[self.taken][0] == token:
                self.taken += 1
                if token not in self.tokenizer.eos_ids:
                    out.append(entries[self.taken - 1])
        return out

    def chat(self, chunk) -> list[dict]:
        """OpenAI chat's shape: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]."""
        def one(t, lp):
            return {"token": _text(self.tokenizer, t), "logprob": _finite(lp), "bytes": list(token_bytes(self.tokenizer, t))}

        return [{**one(t, lp), "top_logprobs": [one(a, alp) for a, alp in top]} for t, lp, top in self.take(chunk)]

    def legacy(self, chunk, offset: int) -> dict:
        """The completions endpoint's shape: parallel lists; text_offset counts characters from
        `offset` (the prompt's length, as OpenAI counts)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for t, lp, top in self.take(chunk):
            text = _text(self.tokenizer, t)
            out["tokens"].append(text)
            out["token_logprobs"].append(_finite(lp))
            out["top_logprobs"].append({_text(self.tokenizer, a): _finite(alp) for a, alp in top})
            out["text_offset"].append(offset)
            offset += len(text)
        return out


def merge_legacy(parts: list[dict]) -> dict:
    return {k: [x for p in parts for x in p[k]] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


def _text(tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special=False)


def _finite(logprob: float) -> float:
    return logprob if logprob > IMPOSSIBLE else IMPOSSIBLE


def token_bytes(tokenizer, token: int) -> bytes:
    """The bytes a token stands for, also when it is part of a UTF-8 character (its text is then
    U+FFFD): SentencePiece byte pieces <0xAB>, and byte-level BPE's printable stand-ins for bytes."""
    text = _text(tokenizer, token)
    if "\ufffd" not in text:
        return text.encode("utf-8")
    piece = tokenizer.token_text(token) or ""
    byte = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
    if byte:
        return bytes([int(byte[1], 16)])
    table = _byte_of_char()
    if piece and all(c in table for c in piece):
        return bytes(table[c] for c in piece)
    return text.encode("utf-8")


@lru_cache(maxsize=1)
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character that stands for each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars
