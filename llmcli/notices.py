"""The few things library code must tell the person at the terminal while it works (a kernel
build that takes a minute). Library code calls `say`; the CLI sets `notify` (stderr); without
it, nothing is shown. Imports nothing, so that the CLI can set it without loading torch."""

from __future__ import annotations

notify = None  # callable(message: str)


def say(message: str) -> None:
    if notify is not None:
        notify(message)
