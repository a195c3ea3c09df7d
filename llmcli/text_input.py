"""Text from outside (a prompt argument, stdin, a file): UTF-8 text, or one error that says so.

Bytes that are not UTF-8 are refused rather than replaced with U+FFFD: the model would otherwise
see a different prompt than the one sent, silently (llama.cpp passes raw bytes to its tokenizer,
ollama's JSON API replaces them). Text with NUL bytes is taken for a binary file, as `/read` does.

What is read is bounded: stdin and text files up to MAX_TEXT_BYTES (data files, such as a batch's
requests or perplexity's text, up to MAX_DATA_BYTES), so `/dev/zero` or an endless pipe is an error
after a moment, not a machine out of memory. Files must be regular files: a FIFO would block the
first read until someone writes to it, a device may never end.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from .errors import InvalidParameterError

MAX_TEXT_BYTES = 16 << 20  # a prompt on stdin, /read, --json-schema, --grammar, a preset, a saved chat
MAX_DATA_BYTES = 256 << 20  # batch's requests, perplexity's --file
MAX_NAME_BYTES, MAX_PATH_BYTES = 255, 4096  # Linux's NAME_MAX and PATH_MAX

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


def size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def read_stdin(what: str = "stdin", limit: int = MAX_TEXT_BYTES) -> str:
    """All of stdin as text (bytes read and decoded here, whatever the locale's error handler), at
    most `limit` bytes: more is an error that says how much is allowed."""
    buffer = getattr(sys.stdin, "buffer", None)  # tests may swap in a StringIO
    if buffer is None:
        text = sys.stdin.read(limit + 1)
        if len(text) > limit:
            raise _too_much_stdin(what, limit)
        return check_text(text, what)
    try:
        data = buffer.read(limit + 1)
    except OSError as e:
        raise InvalidParameterError(f"{what} cannot be read ({e.strerror or e}); pipe text in") from None
    if len(data) > limit:
        raise _too_much_stdin(what, limit)
    return decode_text(data, what)


def stdin_lines(limit: int = MAX_TEXT_BYTES):
    """Yield (line number, bytes or str line) from stdin, to decode one at a time; a line longer
    than `limit` bytes ends it with an error (/dev/zero is one endless line)."""
    source = getattr(sys.stdin, "buffer", None) or sys.stdin
    number = 0
    while True:
        try:
            line = source.readline(limit + 1)
        except OSError as e:
            raise InvalidParameterError(f"stdin cannot be read ({e.strerror or e}); pipe text in") from None
        if not line:
            return
        number += 1
        if len(line) > limit and not line.endswith(b"\n" if isinstance(line, bytes) else "\n"):
            raise InvalidParameterError(f"line {number} of stdin is longer than {size(limit)}; llmcli reads lines "
                                        f"of up to {size(limit)} from stdin")
        yield number, line


def _too_much_stdin(what: str, limit: int) -> InvalidParameterError:
    return InvalidParameterError(f"{what} holds more than {size(limit)}; llmcli reads at most {size(limit)} "
                                 "from stdin: pass less text")


def check_path(path: str | Path, what: str = "") -> Path:
    """`path` (~ expanded), refused when the system could not take it: a name over MAX_NAME_BYTES
    bytes or a path over MAX_PATH_BYTES (instead of an OSError from the first call that opens it)."""
    path = Path(path).expanduser()
    name = f"{what} {str(path)[:60]}..." if what else f"{str(path)[:60]}..."
    n = len(os.fsencode(path))
    if n >= MAX_PATH_BYTES:
        raise InvalidParameterError(f"{name} is a path of {n} bytes; the system takes paths of up to "
                                    f"{MAX_PATH_BYTES - 1} bytes")
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    if longest > MAX_NAME_BYTES:
        raise InvalidParameterError(f"{name} has a file or folder name of {longest} bytes; the system takes "
                                    f"names of up to {MAX_NAME_BYTES} bytes")
    return path


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def read_text_file(path: str | Path, what: str = "", limit: int = MAX_TEXT_BYTES, hint: str = "pass a text file") -> str:
    """A regular file's text (UTF-8, no NUL bytes, at most `limit` bytes); `what` names it in errors
    ("--json-schema", "/read"), `hint` ends them. FIFOs, devices and folders are refused before
    anything is read."""
    path = check_path(path, what)
    name = f"{what} {path}" if what else str(path)
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise InvalidParameterError(f"{name} does not exist; {hint}") from None
    except OSError as e:
        raise InvalidParameterError(f"{name} cannot be read ({e.strerror or e})") from None
    _check_regular(info.st_mode, name, hint)
    if info.st_size > limit:
        raise _too_big(name, limit)
    try:  # O_NONBLOCK: should a FIFO have taken the file's place since, opening it does not block
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except PermissionError:
        raise InvalidParameterError(f"{name} cannot be read: permission denied (see `ls -l {path}`)") from None
    except OSError as e:
        raise InvalidParameterError(f"{name} cannot be read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        _check_regular(os.fstat(fd).st_mode, name, hint)
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise InvalidParameterError(f"{name} cannot be read ({e.strerror or e})") from None
    if len(data) > limit:
        raise _too_big(name, limit)
    if b"\0" in data:
        raise InvalidParameterError(f"{name} is a binary file (it holds NUL bytes); {hint}")
    return decode_text(data, name)


def _check_regular(mode: int, name: str, hint: str) -> None:
    if stat.S_ISDIR(mode):
        raise InvalidParameterError(f"{name} is a folder, not a file; {hint}")
    for test, kind in _KINDS:
        if test(mode):
            raise InvalidParameterError(f"{name} is {kind}, not a regular file; {hint}")


def _too_big(name: str, limit: int) -> InvalidParameterError:
    return InvalidParameterError(f"{name} is larger than {size(limit)}; llmcli reads files of up to {size(limit)} here")


def line_text(number: int, line: bytes | str) -> str:
    what = f"line {number} of stdin"
    return decode_text(line, what) if isinstance(line, bytes) else check_text(line, what)


def _no_nul(text: str, what: str) -> str:
    if "\0" in text:
        raise InvalidParameterError(f"{what} contains NUL bytes, so it looks like a binary file; pass text")
    return text
