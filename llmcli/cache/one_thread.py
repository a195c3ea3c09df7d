"""Copies between KV rows on the calling thread alone.

Such a copy (a finished request's row moved, a prompt's entry kept or restored: 100k-600k values)
is big enough for torch to share it among its OpenMP threads. Those then spin for a while after it,
on the cores where the native decode step's own threads (native/src/team.h) run the next step, and
an 8-row batch lost a tenth of its throughput to them (docs/performance-choices.md). A copy of a few MB on
one thread is short beside a step.

torch's thread count is process-wide: another thread's torch ops meanwhile run on one thread too.
Scopes may overlap (a server's threads): the count goes back when the last one ends.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_lock = threading.Lock()
_inside = 0  # scopes open now
_before = 1  # the count when the first of them opened


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's ops on one thread inside; its thread count as it was once no scope is open."""
    global _inside, _before
    with _lock:
        if _inside == 0:
            _before = torch.get_num_threads()
            if _before > 1:
                torch.set_num_threads(1)
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0 and _before > 1:
                torch.set_num_threads(_before)
