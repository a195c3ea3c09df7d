"""The command line: parse flags, pick consoles, print. Nothing else lives here.

stdout carries only the answer (or one JSON object); everything else goes to stderr. Errors a user
can cause end in one line, `error: ...`, and a non-zero exit; `--debug` shows the traceback.

Each command is a plain function in a module of its own (run.py, chat.py, ...), registered on the
app here, as the `hf` CLI does: nothing in llmcli imports this package.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import warnings

# numpy's BLAS threads would spin beside the decode step's own; llmcli multiplies with its kernels
# (or torch's), never numpy's BLAS (set before anything imports numpy)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import typer  # noqa: E402

from .. import notices
from ..errors import LlmcliError, LlmcliWarning
from . import batch, bench, chat, embed, models, quant, run, serve, startup
from .signals import Terminated, install_signal_handlers, stopped

app = typer.Typer(
    name="llmcli",
    help="Run large language models locally, quantized, on CUDA, MPS or CPU.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root():
    """Run large language models locally, quantized, on CUDA, MPS or CPU."""


for command, name in ((run.run, "run"), (batch.batch, "batch"), (bench.bench, "bench"), (chat.chat, "chat"), (embed.embed, "embed"),
                      (models.pull, "pull"), (models.list_models, "list"), (models.show, "show"), (models.rm, "rm"),
                      (quant.quantize, "quantize"), (quant.perplexity, "perplexity"), (serve.serve, "serve")):
    app.command(name)(command)


def _click_exceptions():
    try:  # typer >= 0.20 vendors its own copy of click
        from typer._click import exceptions
    except ImportError:
        from click import exceptions
    return exceptions


def _show_warning(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, LlmcliWarning):  # one line, like errors
        print(f"warning: {message}", file=sys.stderr)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = warnings.showwarning


def entry() -> None:
    """The `llmcli` command: main(), then an exit without the interpreter's teardown, which spent a
    tenth of a short `llmcli run` freeing torch's modules and the model's tensors. atexit
    handlers still run and the streams are flushed first; every file was written (atomically) before.
    The garbage collector waits while the command starts (startup.py)."""
    startup.pause()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    if isinstance(code, str):  # sys.exit("message"): Python prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    import atexit

    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader went away: nothing more to say
        pass
    except OSError as e:  # the output could not be written (a full disk): say so, and fail
        os.write(2, f"error: the output could not be written ({e.strerror})\n".encode())
        code = code or 1
    os._exit(code or 0)


def main(argv: list[str] | None = None) -> None:
    """Runs the app and turns every user error into one line and an exit code (SystemExit)."""
    install_signal_handlers()
    warnings.showwarning = _show_warning
    notices.notify = lambda message: print(f"note: {message}", file=sys.stderr, flush=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("LLMCLI_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    command = typer.main.get_command(app)
    click_errors = _click_exceptions()
    try:
        code = command.main(args=argv, prog_name="llmcli", standalone_mode=False)
        if code == 130:  # typer turns a KeyboardInterrupt into a silent return of 130
            stopped("interrupted (Ctrl-C)", 130)
        if isinstance(code, int) and code:  # without standalone mode, click returns `typer.Exit(code)`'s code
            sys.exit(code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except click_errors.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError" and e.ctx is not None:
            print(e.ctx.get_help())
            sys.exit(0)
        if debug:
            raise
        where = f"{e.ctx.command_path} --help" if e.ctx else "llmcli --help"
        print(f"error: {e.format_message()} (see `{where}`)", file=sys.stderr)
        sys.exit(2)
    except click_errors.ClickException as e:
        print(f"error: {e.format_message()}", file=sys.stderr)
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        stopped("interrupted (Ctrl-C)", 130)
    except Terminated as e:
        stopped(f"terminated ({signal.Signals(e.signum).name})", 128 + e.signum)
    except LlmcliError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except BrokenPipeError:
        _reader_gone()
    except OSError as e:  # what no command turned into an LlmcliError: most often stdout on a full disk
        if debug:
            raise
        where = f" ({e.filename})" if e.filename else " writing the output" if e.errno in _WRITE_ERRORS else ""
        print(f"error: {e.strerror or e}{where}; free some space or check where the output goes"
              if e.errno in _WRITE_ERRORS else f"error: {e.strerror or e}{where}", file=sys.stderr)
        sys.exit(1)
    except SystemExit:
        if type(sys.stdout).__name__ == "PacifyFlushWrapper":  # click's answer to EPIPE: exit 1
            _reader_gone()
        raise
    sys.exit(code if isinstance(code, int) else 0)


_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


def _reader_gone() -> None:
    """The reader of stdout went away (`| head`): stop quietly with 0, without a second error at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
