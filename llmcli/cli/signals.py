"""SIGTERM and SIGHUP end a command as Ctrl-C does: the cleanup runs, one line says why."""

from __future__ import annotations

import signal
import sys


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised where the program is, so that the cleanup Ctrl-C runs runs too
    (`except BaseException`/`finally` in atomic_folder, atomic_write_text, downloads). Not a
    KeyboardInterrupt: chat's "Ctrl-C stops the reply" must not catch it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _terminate(signum, frame):
    for s in _STOP_SIGNALS:  # a second signal must not cut the cleanup short
        signal.signal(s, signal.SIG_IGN)
    raise Terminated(signum)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)


def install_signal_handlers() -> None:
    try:
        for s in _STOP_SIGNALS:
            if signal.getsignal(s) == signal.SIG_DFL:  # keep `nohup`'s ignored SIGHUP, and the like
                signal.signal(s, _terminate)
    except ValueError:  # not the main thread (tests calling main): leave signals alone
        pass


def stopped(what: str, code: int) -> None:
    """End on a signal: one line (the reply's line ended first at a terminal), exit 128 + signal."""
    try:
        if sys.stdout.isatty():
            sys.stdout.write("\n")
            sys.stdout.flush()
        print(f"error: {what}", file=sys.stderr)
    except (OSError, ValueError):  # the terminal may be gone (SIGHUP)
        pass
    sys.exit(code)
