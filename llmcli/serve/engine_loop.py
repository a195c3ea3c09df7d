"""The one thread that runs the model for a server: BatchEngine.step() while there is work, asleep
on a Condition when there is none. Other threads submit and cancel; each request's chunks go to
the `deliver` function it was submitted with (kept as the request's `tag`), called from the engine
thread, in order, ending with a chunk that has a finish_reason, or with an ApiError when the
engine fails or the loop stops. `deliver` must not block: the HTTP side hands the item to its
event loop (call_soon_threadsafe) and returns.

    loop = EngineLoop(engine)
    loop.submit(req, deliver)  # PromptTooLongError at once; else deliver(chunk) for each chunk
    loop.cancel(req)         # the client went away: its row is freed at the next step
    loop.close()             # stop; every unfinished request receives an ApiError (503)
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from ..decode.batched import BatchEngine, Request
from .openai_api import ApiError

log = logging.getLogger("llmcli.server")


class EngineLoop:
    def __init__(self, engine: BatchEngine):
        self.engine = engine
        self.wake = threading.Condition()
        self.live: set[Request] = set()  # submitted and not finished (guarded by `wake`)
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="llmcli-engine", daemon=True)
        self.thread.start()

    def submit(self, req: Request, deliver: Callable[[object], None]) -> None:
        req.tag = deliver
        with self.wake:
            if self.stopping:
                raise ApiError(503, "the server is shutting down")
            self.engine.submit(req)  # raises PromptTooLongError before anything is queued
            self.live.add(req)
            self.wake.notify()

    def cancel(self, req: Request) -> None:
        self.engine.cancel(req)
        with self.wake:
            self.live.discard(req)
            self.wake.notify()

    def close(self, timeout: float = 10.0) -> None:
        with self.wake:
            self.stopping = True
            self.wake.notify()
        self.thread.join(timeout)  # a step in progress ends first
        self._fail_all(ApiError(503, "the server is shutting down"))

    @property
    def in_flight(self) -> int:
        """Requests submitted and not finished: running, or waiting for a row."""
        return len(self.live)

    @property
    def stats(self) -> dict:
        e = self.engine
        return {"rows": e.rows, "ctx_size": e.max_len, "running": len(e.running), "waiting": len(e.waiting),
                "steps": e.steps, "mean_batch": round(e.row_steps / e.steps, 3) if e.steps else 0.0,
                "prompt_cache": e.prompt_cache.stats if e.prompt_cache is not None else None}

    def _run(self) -> None:
        while True:
            with self.wake:
                while not self.stopping and not self.engine.busy:
                    self.wake.wait()
                if self.stopping:
                    return
            try:
                events = self.engine.step()
            except Exception as e:  # a bug or out of memory: fail what is in flight, keep serving
                log.error("the engine failed: %s; %d request(s) ended with an error", e, len(self.live),
                          exc_info=log.isEnabledFor(logging.DEBUG))
                self._fail_all(ApiError(500, f"the engine failed: {e}"))
                continue
            finished = []
            for req, chunk in events:
                req.tag(chunk)
                if chunk.finish_reason is not None:
                    finished.append(req)
            if finished:
                with self.wake:
                    self.live.difference_update(finished)

    def _fail_all(self, error: ApiError) -> None:
        with self.wake:
            gone, self.live = self.live, set()
        for req in gone:
            self.engine.cancel(req)  # dropped at the next step, if there is one
            req.tag(error)
