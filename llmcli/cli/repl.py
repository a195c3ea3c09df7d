"""`llmcli chat`: the REPL. Read a line, run a slash command or send a message, stream the reply.

At a terminal: prompt_toolkit line editing (history kept in the llmcli home, arrow keys, Ctrl-R
search, bracketed paste so a pasted block is one message), `\"\"\"` opens and closes a multi-line
message, Ctrl-C stops a reply and keeps the session, Ctrl-D or /bye leaves, and the terminal mode
is restored however the session ends. Not a terminal: one message per line from stdin (or all of
stdin with --single) and nothing but the replies on stdout.

The logic lives in llmcli/chat/ (session.py, commands.py, conversation.py); this file is the
terminal I/O around it.
"""

from __future__ import annotations

import signal
import sys
import time
from contextlib import closing, contextmanager
from pathlib import Path

from .. import text_input
from ..chat.commands import MessageAssembler, Outcome, run_command, take
from ..chat.conversation import ConversationFileError
from ..chat.session import ChatSession
from ..errors import LlmcliError

PROMPT, CONTINUATION = ">>> ", "... "


def history_path() -> Path:
    from ..hub.store import default_home

    return default_home() / "chat_history"


# ------------------------------------------------------------------------------------ output

class Ui:
    """Replies go to stdout; everything else (notices, stats, errors, command output) to stderr."""

    def __init__(self, interactive: bool, render: bool = False):
        from rich.console import Console

        self.interactive = interactive
        self.render = render and interactive and sys.stdout.isatty()
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)
        self.failures = 0  # commands and messages refused (piped chat exits 1 if any)

    def note(self, text: str, style: str = "dim") -> None:
        self.err.print(text, style=style if self.interactive else None, markup=False)

    def error(self, text: str) -> None:
        self.err.print(f"error: {text}", style="red" if self.interactive else None, markup=False)

    def writer(self):
        return MarkdownWriter() if self.render else PlainWriter()


# control characters a model could emit (ESC starts terminal commands); kept: tab, newline
_CONTROLS = {c: None for c in [*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f, *range(0x80, 0xa0)]}


class PlainWriter:
    def __init__(self):
        self.tty = sys.stdout.isatty()

    def write(self, text: str) -> None:
        sys.stdout.write(text.translate(_CONTROLS) if self.tty else text)
        sys.stdout.flush()

    def end(self) -> None:
        sys.stdout.write("\n")
        sys.stdout.flush()


class MarkdownWriter:
    """--render: the reply re-rendered as Markdown while it streams (a few times a second)."""

    def __init__(self):
        from rich.console import Console
        from rich.live import Live

        self.text, self.shown_at = "", 0.0
        self.live = Live(console=Console(), auto_refresh=False, vertical_overflow="visible")
        self.live.start()

    def write(self, text: str) -> None:
        self.text += text
        if time.perf_counter() - self.shown_at > 0.1:
            self._show()

    def _show(self) -> None:
        from rich.markdown import Markdown

        self.live.update(Markdown(self.text), refresh=True)
        self.shown_at = time.perf_counter()

    def end(self) -> None:
        self._show()
        self.live.stop()


def banner(session: ChatSession) -> str:
    rt = session.rt
    p = rt.placement
    return (f"{rt.loaded.name} · {rt.loaded.weights_type} · {p.device} {str(p.dtype).removeprefix('torch.')} · "
            f"context {rt.ctx_size} · loaded in {rt.loaded.load_seconds:.1f} s · /? for help, Ctrl-D to leave")


def dropped_notice(dropped: list[dict], ctx_size: int) -> str:
    turns = sum(1 for m in dropped if m["role"] == "user") or 1
    first = next((m["content"] for m in dropped if m["role"] == "user"), dropped[0]["content"])
    first = " ".join(first.split())
    quote = first if len(first) <= 40 else first[:40] + "…"
    return (f"dropped the oldest {turns} turn{'s' if turns > 1 else ''} ({len(dropped)} messages, from \"{quote}\") "
            f"to fit the context of {ctx_size} tokens; the system prompt stays, /save keeps everything")


def thinking_note(turn) -> str:
    """The last reply's thinking, collapsed to its start on one line."""
    first = " ".join(turn.reasoning.split())
    tokens = f", {turn.stats.reasoning_tokens} tokens" if turn.stats is not None else ""
    return f"▸ thought: {first[:60]}{'…' if len(first) > 60 else ''} ({len(turn.reasoning)} characters{tokens}; /show thinking)"


def after_reply_notes(session: ChatSession) -> tuple[str, str | None, bool]:
    """(stats line, why the reply ended early or None, whether that must be said even when piped:
    a reply cut by a full context is, a reply cut at the max-tokens the user asked for is not)."""
    turn, ctx = session.last, session.ctx_size
    if turn.finish == "interrupted":
        return (f"interrupted after {turn.tokens} tokens · context {turn.context_used}/{ctx} · "
                "the partial reply is kept (/regen for a new one)"), None, False
    s = turn.stats
    stats = (f"{s.completion_tokens} tokens · first token {s.ttft_s:.2f} s · {s.decode_tps:.1f} tokens/s · "
             f"context {turn.context_used}/{ctx}")
    if turn.finish != "length":
        return stats, None, False
    if turn.stopped_by == "max_tokens":
        return stats, (f"the reply stopped at max-tokens ({session.conv.max_tokens}); "
                       "/set parameter max-tokens N for longer replies"), False
    return stats, (f"warning: the context ({ctx} tokens) filled: the reply stops after {s.completion_tokens} tokens; "
                   "older turns will be dropped next turn (or restart with a larger --ctx-size)"), True


# ------------------------------------------------------------------------------- interrupts

class _Interrupt:
    """SIGINT while a reply streams: the first press asks the stream to stop at the next token (the
    REPL checks between tokens and closes the generator); a press before any token has arrived, or
    a second press, raises KeyboardInterrupt at once."""

    def __init__(self):
        self.requested = False
        self.streaming = False

    def __call__(self, signum, frame):
        if self.streaming and not self.requested:
            self.requested = True
            return
        raise KeyboardInterrupt


@contextmanager
def _sigint_stops_reply():
    handler = _Interrupt()
    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread (e.g. tests calling in): Ctrl-C keeps its default
        previous = None
    try:
        yield handler
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def stream_reply(session: ChatSession, ui: Ui, dropped: list[dict]) -> None:
    if dropped:
        ui.note(dropped_notice(dropped, session.ctx_size), style="yellow")
    if session.thinks and ui.interactive:
        ui.note("thinking…")
    writer, wrote = None, False
    with _sigint_stops_reply() as interrupt:
        try:
            with closing(session.reply()) as pieces:
                writer = ui.writer()
                for piece in pieces:
                    writer.write(piece)
                    wrote = True
                    interrupt.streaming = True
                    if interrupt.requested:
                        break
        except KeyboardInterrupt:
            pass
        finally:
            calls = session.calls_json()  # with --tools: the reply's calls, one JSON line after its text
            if writer is not None and (wrote or calls is None or isinstance(writer, MarkdownWriter)):
                writer.end()
            if calls is not None:
                sys.stdout.write(calls + "\n")
                sys.stdout.flush()
    stats, why, always = after_reply_notes(session)
    if session.last.reasoning and ui.interactive:  # collapsed: /show thinking opens it
        ui.note(thinking_note(session.last))
    if ui.interactive:
        ui.note(stats)
    if why and (ui.interactive or always):
        ui.note(why, style="yellow")
    session.check_reply()  # with --json-schema/--regex/--grammar: a cut reply is an error


# ------------------------------------------------------------------------------------- loop

def handle(session: ChatSession, ui: Ui, kind: str, text: str, confirm) -> bool:
    """Carry out one command or message; False when the session should end."""
    try:
        if kind == "message":
            stream_reply(session, ui, session.add_user(text))
            return True
        outcome = run_command(session, text)
        if outcome.confirm:
            outcome = outcome.then() if confirm(outcome.confirm) else Outcome("not loaded")
        if outcome.say:
            ui.note(outcome.say, style="")
        if outcome.exit:
            return False
        if outcome.regen:
            stream_reply(session, ui, session.take_back_reply())
        elif outcome.send is not None:
            stream_reply(session, ui, session.add_user(outcome.send))
        elif outcome.tool_result is not None:
            dropped, ready = session.add_tool_result(outcome.tool_result)
            if ready:  # every call of the last reply has its result: the model goes on
                stream_reply(session, ui, dropped)
            else:
                ui.note("result taken; the last reply made more calls: answer the next with /tool")
    except LlmcliError as e:
        ui.error(str(e))
        ui.failures += 1
    return True


def run(session: ChatSession, *, render: bool = False, single: bool = False, check_model: bool = False) -> int:
    """The whole chat; returns the exit code."""
    interactive = sys.stdin.isatty()
    ui = Ui(interactive, render)
    if interactive:  # (cli_chat refuses --single at a terminal)
        return _interactive(session, ui, check_model)
    if check_model:
        _refuse_other_model(session)
    if single:
        text = text_input.read_stdin()
        if not text.strip():
            raise LlmcliError("stdin was empty; pipe a message in")
        stream_reply(session, ui, session.add_user(text))
        return 0
    assembler = MessageAssembler()
    for number, raw in text_input.stdin_lines():
        try:
            line = text_input.line_text(number, raw)
        except LlmcliError as e:  # refused like a bad command: the session goes on, the exit code says so
            ui.error(str(e))
            ui.failures += 1
            continue
        taken = take(assembler, line.rstrip("\r\n"))
        if taken and not handle(session, ui, *taken, lambda question: _no_confirm(ui, question)):
            break
    return 1 if ui.failures else 0


def _no_confirm(ui: Ui, question: str) -> bool:
    ui.note(f"{question} no: stdin is not a terminal, so there is no one to confirm")
    return False


def _refuse_other_model(session: ChatSession) -> None:
    saved_with, running = session.conv.model.get("name"), session.model_info["name"]
    if saved_with and saved_with != running:
        raise ConversationFileError(f"the conversation was saved with the model {saved_with!r}, not {running!r}; "
                                    "chat with that model, or load it at a terminal to confirm")


class LineReader:
    """prompt_toolkit input: history file, Ctrl-R, bracketed paste; Ctrl-C clears a typed line and
    at an empty prompt raises KeyboardInterrupt; Ctrl-D at an empty prompt raises EOFError."""

    def __init__(self, ui: Ui):
        from prompt_toolkit import PromptSession, search
        from prompt_toolkit.enums import DEFAULT_BUFFER
        from prompt_toolkit.filters import has_focus, is_searching
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings
        from prompt_toolkit.output import create_output

        try:
            path = history_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
            history = FileHistory(str(path))
        except OSError as e:
            ui.note(f"history is not kept: cannot write {history_path()} ({e.strerror}); set LLMCLI_HOME", style="yellow")
            history = InMemoryHistory()
        keys = KeyBindings()

        @keys.add("c-c", filter=has_focus(DEFAULT_BUFFER))
        def _(event):
            if event.current_buffer.text:
                event.current_buffer.reset()
            else:
                event.app.exit(exception=KeyboardInterrupt, style="class:aborting")

        @keys.add("enter", filter=is_searching)
        def _(event):  # as in readline: Enter after Ctrl-R sends the line found
            search.accept_search()
            event.app.current_buffer.validate_and_handle()

        # prompts go to stderr when stdout is piped, so that stdout carries only the replies
        self.output = None if sys.stdout.isatty() else create_output(stdout=sys.stderr)
        self.session = PromptSession(history=history, key_bindings=keys, output=self.output)
        self._session_class = PromptSession

    def read(self, continuation: bool) -> str:
        return self.session.prompt(CONTINUATION if continuation else PROMPT)

    def confirm(self, question: str) -> bool:
        try:
            answer = self._session_class(output=self.output).prompt(f"{question} [y/N] ")
        except (KeyboardInterrupt, EOFError):
            return False
        return answer.strip().lower() in ("y", "yes")


def _interactive(session: ChatSession, ui: Ui, check_model: bool) -> int:
    saved_mode = _terminal_mode()
    try:
        reader = LineReader(ui)
        ui.note(banner(session))
        if check_model:
            saved_with, running = session.conv.model.get("name"), session.model_info["name"]
            if saved_with and saved_with != running and not reader.confirm(
                    f"the conversation was saved with the model {saved_with!r}, not {running!r}; load it anyway?"):
                session.conv.clear()
                ui.note("not loaded; starting an empty conversation")
        if session.conv.messages:
            ui.note(f"{len(session.conv.messages)} messages loaded")
        assembler = MessageAssembler()
        while True:
            try:
                line = reader.read(continuation=assembler.open)
            except KeyboardInterrupt:
                if assembler.open:
                    assembler.reset()
                    ui.note("multi-line message discarded")
                else:
                    ui.note("Use Ctrl-D or /bye to leave.")
                continue
            except EOFError:
                break
            try:
                taken = take(assembler, line)
                if taken and not handle(session, ui, *taken, reader.confirm):
                    break
            except KeyboardInterrupt:  # outside a reply, e.g. while saving: the session goes on
                ui.note("interrupted")
        return 0
    finally:
        _restore_terminal(saved_mode)


def _terminal_mode():
    try:
        import termios

        return termios.tcgetattr(sys.stdin.fileno())
    except (ImportError, OSError, ValueError):
        return None


def _restore_terminal(mode) -> None:
    """Whatever happened, leave the terminal as we found it: line mode, echo, a visible cursor."""
    if mode is not None:
        import termios

        try:
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, mode)
        except (OSError, termios.error):
            pass
    if sys.stdout.isatty():
        sys.stdout.write("\x1b[?25h")
        sys.stdout.flush()
