"""A command's start with Python's cyclic garbage collector paused.

Importing torch and loading a model make hundreds of thousands of objects that live to the end of
the process; collecting as they came spent a tenth of a short `llmcli run` on them (figures in
docs/performance-choices.md). entry() pauses the collector; once a command has its model, `opening()`
freezes what exists (no later collection looks at it again) and resumes collecting, so a long chat
or server collects as usual. `pull` and `quantize`, long without a model, resume before their
work; list, show and rm end quickly.

    with opening(err) as progress:          # download bars on stderr at a terminal
        rt = open_model(flags, progress)    # runtime.open_model
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


def pause() -> None:
    gc.disable()


def resume() -> None:
    """What exists now lives on: out of every later collection; collect what comes from here on."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


@contextmanager
def opening(err=None) -> Iterator:
    """While a command opens its model: the download progress callback to give runtime.open_model
    (None when stderr is not a terminal); afterwards the collector resumes (the start is over)."""
    from .progress import download_progress

    try:
        with download_progress(err) as progress:
            yield progress
    finally:
        resume()
