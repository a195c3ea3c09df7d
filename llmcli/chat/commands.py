"""What the REPL does with a line, apart from the terminal: lines become messages (triple-quoted
blocks included) or slash commands (ollama and llama.cpp names); a command acts on the session and returns
an Outcome for chat.py to carry out. Bad input raises an LlmcliError whose one line says what to
do, and the session goes on.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ..decode.sampling_plain import PARAMETER_NAMES, parse_parameter
from .. import text_input
from ..errors import InvalidParameterError, LlmcliError
from . import conversation
from .session import ChatSession

COMMANDS = [  # (name, arguments, what it does)
    ("/?", "", "show this help (also /help)"),
    ("/help", "", "show this help"),
    ("/bye", "", "leave (also /exit, Ctrl-D)"),
    ("/exit", "", "leave"),
    ("/clear", "", "forget the conversation, keep the system prompt"),
    ("/set", "parameter <name> <value>", "change a parameter: " + ", ".join(PARAMETER_NAMES) + ", max-tokens, stop"),
    ("/set", "system <text>", "change the system prompt"),
    ("/set", "think on|off", "a reasoning model thinks before it answers, or not"),
    ("/show", "[info|parameters|system|template|thinking]", "the model, the parameters, the context in use; "
              "thinking: the last reply's"),
    ("/save", "<file>", "save the conversation as JSON"),
    ("/load", "<file>", "load a conversation saved with /save"),
    ("/regen", "", "forget the last reply and generate it again"),
    ("/read", "<file>", "send a text file's contents as a message"),
    ("/stats", "", "timings of the last reply and of the session"),
    ("/tool", "<result>", "with --tools: answer the last reply's next tool call with this result"),
]
FENCE = '"""'  # opens and closes a message of several lines
NAMES = tuple(dict.fromkeys(name for name, _, _ in COMMANDS))
SHOW_SECTIONS = ("info", "parameters", "system", "template", "thinking")


class CommandError(LlmcliError):
    """A slash command that is unknown or used wrongly."""


@dataclass
class Outcome:
    say: str = ""  # for the person at the terminal (stderr when stdout is piped)
    exit: bool = False
    send: str | None = None  # a message to send now (/read)
    tool_result: str | None = None  # a tool call's result to send now (/tool)
    regen: bool = False  # generate the last reply again
    confirm: str | None = None  # a yes/no question; on yes, carry out `then()`
    then: Callable[[], "Outcome"] | None = None


def is_command(line: str) -> bool:
    return line.startswith("/")


class MessageAssembler:
    """Lines in, messages out. A line starting with \"\"\" opens a multi-line message and a line
    ending with \"\"\" closes it (ollama); any other line is a message by itself."""

    def __init__(self):
        self.lines: list[str] | None = None  # the open multi-line message, if any

    @property
    def open(self) -> bool:
        return self.lines is not None

    def reset(self) -> None:
        self.lines = None

    def feed(self, line: str) -> str | None:
        """The finished message, or None while a multi-line message is open (or the line is blank)."""
        if self.lines is None:
            if not line.lstrip().startswith(FENCE):
                return line if line.strip() else None
            line = line.lstrip()[len(FENCE):]
            if line.rstrip().endswith(FENCE) and line.strip() != "":
                return line.rstrip()[: -len(FENCE)] or None  # """one line"""
            self.lines = [line] if line.strip() else []
            return None
        if line.rstrip().endswith(FENCE):
            self.lines.append(line.rstrip()[: -len(FENCE)])
            text, self.lines = "\n".join(self.lines).strip("\n"), None
            return text if text.strip() else None
        self.lines.append(line)
        return None


def take(assembler: MessageAssembler, line: str) -> tuple[str, str] | None:
    """("command", line) for a slash command typed outside a multi-line message, ("message", text)
    for a finished message, None while a message is still open or the line is blank."""
    if not assembler.open and is_command(line.strip()) and "\n" not in line.strip():
        return "command", line.strip()
    text = assembler.feed(line)
    return ("message", text) if text is not None else None


def help_text() -> str:
    width = max(len(f"{n} {a}".strip()) for n, a, _ in COMMANDS)
    lines = [f"  {f'{n} {a}'.strip():<{width}}  {what}" for n, a, what in COMMANDS]
    return "\n".join(["Commands:", *lines,
                      'Type """ to start and end a message of several lines; pasted text arrives as one message.',
                      "Ctrl-C stops a reply; Ctrl-D or /bye leaves."])


def run_command(session: ChatSession, line: str) -> Outcome:
    name, _, rest = line.strip().partition(" ")
    rest = rest.strip()
    handler = _HANDLERS.get(name.lower())
    if handler is None:
        raise CommandError(f"unknown command {name}; the commands are {', '.join(NAMES)}")
    return handler(session, rest)


# ---------------------------------------------------------------------------------- handlers

def _help(session, rest):
    return Outcome(help_text())


def _bye(session, rest):
    return Outcome(exit=True)


def _clear(session, rest):
    n = len(session.conv.messages)
    session.conv.clear()
    kept = "; the system prompt stays" if session.conv.system else ""
    return Outcome(f"forgot the conversation ({n} messages){kept}")


def _set(session, rest):
    what, _, value = rest.partition(" ")
    value = value.strip()
    if what == "system":
        if not value:
            raise CommandError("/set system needs the text of the system prompt")
        session.conv.system = value
        return Outcome("system prompt set")
    if what == "parameter":
        name, _, raw = value.partition(" ")
        if not name or not raw.strip():
            raise CommandError("usage: /set parameter <name> <value>, e.g. /set parameter temp 0.7")
        return Outcome(set_parameter(session.conv, name, raw.strip()))
    if what == "think":
        if value.lower() not in ("on", "off"):
            raise CommandError("usage: /set think on|off")
        return Outcome(session.set_think(value.lower() == "on"))
    raise CommandError("usage: /set parameter <name> <value>, /set system <text> or /set think on|off")


_MAX_TOKENS_NAMES = ("max-tokens", "n", "num-predict", "predict", "n-predict")


def set_parameter(conv: conversation.Conversation, name: str, raw: str) -> str:
    """Validate and apply one parameter; returns what is now set."""
    key = name.strip().lstrip("-").replace("_", "-").lower()
    if key in _MAX_TOKENS_NAMES:
        try:
            n = int(raw)
        except ValueError:
            raise InvalidParameterError(f"max-tokens needs a whole number (-1 = no limit), got {raw!r}") from None
        conv.max_tokens = None if n == -1 else conversation.check_max_tokens(n)
        return f"max-tokens {conv.max_tokens or 'unlimited'}"
    if key == "stop":
        stops = () if raw.lower() == "none" else tuple(s for s in shlex.split(raw) if s)
        conv.stop = stops
        return "stop " + (" ".join(shlex.quote(s) for s in stops) or "none")
    if key in ("ctx-size", "c", "num-ctx"):
        raise InvalidParameterError("the context size is fixed for a session; restart with --ctx-size N")
    key = "temp" if key == "temperature" else key
    if key not in PARAMETER_NAMES:
        raise InvalidParameterError(f"unknown parameter {name!r}; known: {', '.join(PARAMETER_NAMES)}, max-tokens, stop")
    conv.params = parse_parameter(conv.params, key, raw)
    return f"{key} {raw}"


def parameters_text(conv: conversation.Conversation) -> str:
    p = asdict(conv.params)
    shown = {"temp": p["temperature"], **{n: p[n.replace("-", "_")] for n in PARAMETER_NAMES if n != "temp"}}
    shown["max-tokens"] = conv.max_tokens or "unlimited"
    shown["stop"] = " ".join(shlex.quote(s) for s in conv.stop) or "none"
    return " · ".join(f"{k} {v}" for k, v in shown.items())


def _show(session, rest):
    section = rest.lower() or "all"
    if section not in (*SHOW_SECTIONS, "all"):
        raise CommandError(f"/show takes one of {', '.join(SHOW_SECTIONS)} (or nothing for all)")
    if section == "thinking":
        turn = session.last
        if turn is None or not turn.reasoning:
            return Outcome("the last reply had no thinking" if turn is not None else "no reply yet")
        return Outcome(turn.reasoning)
    loaded, conv = session.rt.loaded, session.conv
    a = loaded.args
    parts = {
        "info": [f"model       {loaded.name} ({a.model_type}, {a.num_hidden_layers} layers, {loaded.runs_as}) "
                 f"from {loaded.path}",
                 f"device      {session.rt.placement.reason.removeprefix('device ')}",
                 f"decode      {session.decode_mode()}",
                 f"context     {session.context_used()} of {session.ctx_size} tokens in use; "
                 f"{len(conv.messages)} messages" + (f", the oldest {conv.start} no longer in the context"
                                                     if conv.start else "")],
        "parameters": [f"parameters  {parameters_text(conv)}"],
        "system": [f"system      {conv.system or '(none: the chat template default)'}"],
        "template": [loaded.chat_template or "(the model has no chat template: messages are sent as plain text)"],
    }
    keys = ("info", "parameters", "system") if section == "all" else (section,)
    return Outcome("\n".join(line for k in keys for line in parts[k]))


def _save(session, rest):
    if not rest:
        raise CommandError("/save needs a file name, e.g. /save chat.json")
    session.conv.model = session.model_info
    path = conversation.save(session.conv, rest)
    return Outcome(f"saved {len(session.conv.messages)} messages to {path}")


def _load(session, rest):
    if not rest:
        raise CommandError("/load needs a file name, e.g. /load chat.json")
    conv = conversation.load(rest)

    def adopt():
        session.conv = conv
        return Outcome(f"loaded {len(conv.messages)} messages from {rest}")

    saved_with, running = conv.model.get("name"), session.model_info["name"]
    if saved_with and saved_with != running:
        return Outcome(confirm=f"{rest} was saved with the model {saved_with!r}, not {running!r}; load it anyway?",
                       then=adopt)
    return adopt()


def _regen(session, rest):
    if session.conv.last_reply is None:
        raise CommandError("there is no reply to generate again; send a message first")
    return Outcome(regen=True)


def read_text_file(name: str) -> str:
    """/read's file: a regular text file (text_input's limits)."""
    path = Path(name).expanduser()
    try:
        text = text_input.read_text_file(path, hint="/read sends text (UTF-8) files")
    except InvalidParameterError as e:
        raise CommandError(str(e)) from None
    if not text.strip():
        raise CommandError(f"{path} is empty; nothing to send")
    return text


def _read(session, rest):
    if not rest:
        raise CommandError("/read needs a file name, e.g. /read notes.txt")
    text = read_text_file(rest)
    return Outcome(f"sending {rest} ({len(text)} characters)", send=text)


def _stats(session, rest):
    turn = session.last
    if turn is None:
        return Outcome("no reply yet")
    lines = []
    s = turn.stats
    if s is not None:
        lines.append(f"last reply  {s.completion_tokens} tokens ({turn.finish}); prompt {s.prompt_tokens} tokens, "
                     f"{s.cached_tokens} reused from the cache, {s.prefilled_tokens} prefilled at {s.prefill_tps:.1f} t/s")
        lines.append(f"            first token after {s.ttft_s * 1000:.0f} ms; decode {s.decode_tps:.1f} t/s; seed {s.seed}")
    else:
        lines.append(f"last reply  interrupted after {turn.tokens} tokens")
    lines.append(f"session     {session.replies} replies, {session.generated} tokens generated; "
                 f"context {turn.context_used} of {session.ctx_size}")
    return Outcome("\n".join(lines))


def _tool(session, rest):
    if not session.tools:
        raise CommandError("/tool answers a tool call; start the chat with --tools FILE to offer tools")
    if not rest:
        raise CommandError("usage: /tool <result>, e.g. /tool {\"temperature\": 21}")
    return Outcome(tool_result=rest)


_HANDLERS = {"/?": _help, "/help": _help, "/bye": _bye, "/exit": _bye, "/clear": _clear, "/set": _set,
             "/show": _show, "/save": _save, "/load": _load, "/regen": _regen, "/read": _read, "/stats": _stats,
             "/tool": _tool}
