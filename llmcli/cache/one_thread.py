"""Copies between KV rows on the calling thread alone.

Such a copy (a finished request's row moved, a prompt's entry kept or restored: 100k-600k values)
is big enough for torch to share it among its OpenMP threads. Those then spin for a while after it,
on the cores where the native decode step's own threads (native/team.h) run the next step: an
8-row batch of SmolLM2 on 2 cores made 815 t/s with the copies shared, 905 with them on one thread
(in one process, alternated, AMD EPYC Zen 4). A copy of a few MB on one thread takes ~0.1-0.2 ms.

torch's thread count is process-wide: another thread's torch ops meanwhile run on one thread too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's ops on this thread alone inside; its thread count as it was after (~0.3 us)."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
