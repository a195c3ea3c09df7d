"""A command's start with Python's cyclic garbage collector paused.

Importing torch and loading a model make ~350,000 objects that live to the end of the process;
collecting as they came (~540 collections, three of them over everything) took 0.18 s of a 2-second
`llmcli run smollm2 "hi" -n 16` (Intel Xeon, 2 cores). entry() pauses the collector; once a
command has its model, `open_model` here freezes what exists (no later collection looks at it
again) and resumes collecting, so a long chat or server collects as usual. `pull` and `quantize`,
long without a model opened here, resume before their work; list, show and rm end quickly.
"""

from __future__ import annotations

import gc


def pause() -> None:
    gc.disable()


def resume() -> None:
    """What exists now lives on: out of every later collection; collect what comes from here on."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def open_model(flags, progress=None, **changes):
    """runtime.open_model, then the collector resumed (the start is over)."""
    from ..runtime.runtime import open_model as open_runtime

    try:
        return open_runtime(flags, progress, **changes)
    finally:
        resume()
