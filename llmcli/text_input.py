"""Text from outside (a prompt argument, stdin, a file): UTF-8 text, or one error that says so.

Bytes that are not UTF-8 are refused rather than replaced with U+FFFD: the model would otherwise
see a different prompt than the one sent, silently (llama.cpp passes raw bytes to its tokenizer,
ollama's JSON API replaces them). Text with NUL bytes is taken for a binary file, as `/read` does.
"""

from __future__ import annotations

import sys

from .errors import InvalidParameterError

_CONVERT = "convert it to UTF-8 first, e.g. with `iconv -t UTF-8`"


def decode_text(data: bytes, what: str) -> str:
    """`data` as UTF-8 text; `what` names it in the error ("stdin", "line 3 of stdin")."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidParameterError(f"{what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                                    f"{_CONVERT}") from None
    return _no_nul(text, what)


def check_text(text: str, what: str) -> str:
    """A str from argv or a text stream: Python decodes bytes that are not UTF-8 to lone
    surrogates (surrogateescape), which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidParameterError(f"{what} is not UTF-8 text (a byte at character {e.start} is not); {_CONVERT}") from None
    return _no_nul(text, what)


def read_stdin(what: str = "stdin") -> str:
    """All of stdin as text (bytes read and decoded here, whatever the locale's error handler)."""
    buffer = getattr(sys.stdin, "buffer", None)  # tests may swap in a StringIO
    return decode_text(buffer.read(), what) if buffer is not None else check_text(sys.stdin.read(), what)


def stdin_lines():
    """Yield (line number, bytes or str line) from stdin, to decode one at a time."""
    source = getattr(sys.stdin, "buffer", None) or sys.stdin
    yield from enumerate(source, 1)


def line_text(number: int, line: bytes | str) -> str:
    what = f"line {number} of stdin"
    return decode_text(line, what) if isinstance(line, bytes) else check_text(line, what)


def _no_nul(text: str, what: str) -> str:
    if "\0" in text:
        raise InvalidParameterError(f"{what} contains NUL bytes, so it looks like a binary file; pass text")
    return text
