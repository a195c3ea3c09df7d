"""Download progress for the command line: a Rich bar per file on stderr (bytes, speed, ETA), and one
for quantizing at load (bytes of weights read), shown once that has taken more than a moment.

Library code reports `progress(label, done, total)`; this turns those calls into bars, and into
nothing when stderr is not a terminal (pipes and logs stay clean).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from ..hub.store import ProgressFn
from ..quant import QUANTIZING

QUANTIZING_SHOWN_AFTER = 0.5  # seconds: a small model quantizes at load without a flash of a bar


@contextmanager
def download_progress(console: Console | None = None) -> Iterator[ProgressFn | None]:
    """Yields the callback to hand to `runtime.open_model` / `fetch.pull`; None when stderr is not a TTY."""
    from huggingface_hub.utils import logging as hub_logging

    hub_logging.set_verbosity_error()  # its retry warnings would break the one-line error contract
    console = console or Console(stderr=True, highlight=False)
    if not console.is_terminal:
        yield None
        return
    bars = Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=console)
    tasks: dict[str, int] = {}
    first_seen: dict[str, float] = {}
    lock = threading.Lock()

    def report(label: str, done: int, total: int | None) -> None:
        with lock:
            if label.startswith(QUANTIZING) and label not in tasks:
                if time.monotonic() - first_seen.setdefault(label, time.monotonic()) < QUANTIZING_SHOWN_AFTER:
                    return
            if not tasks:
                bars.start()  # only once something downloads: a cached model shows nothing
            if label not in tasks:
                tasks[label] = bars.add_task(label, total=total)
            bars.update(tasks[label], completed=done, total=total)

    try:
        yield report
    finally:
        if tasks:
            bars.stop()
