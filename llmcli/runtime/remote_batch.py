"""BatchEngine's face over HTTP, for `llmcli batch --api`: up to `rows` requests in flight at once,
each a thread waiting on one chat completion; the server batches them. BatchRunner drives it as it
drives the local engine (submit, step, cancel, busy, waiting), so its retries, resume and fallback
are the same code.

    engine = rt.batch_engine(8)
    engine.submit(Sequence(prompt, request, constraint, tag=job))
    for seq, chunk in engine.step(): ...     blocks until at least one answer is back; each chunk is a
                                             whole answer (finish_reason set)
"""

from __future__ import annotations

import queue
import threading
from collections import deque

from ..decode.stream import output_limit


class RemoteBatchEngine:
    def __init__(self, rt, rows: int, max_len: int):
        if rows < 1:
            raise ValueError("rows must be at least 1")
        self.rt, self.rows, self.max_len = rt, rows, max_len
        self.prompt_cache = None  # (the server's own)
        self.waiting: deque = deque()
        self.running: set = set()  # sequences whose request is in flight
        self.cancelled: set = set()
        self.done: queue.Queue = queue.Queue()  # (sequence, Chunk or the exception its thread met)
        self.lock = threading.Lock()
        self.failure: BaseException | None = None  # a request's: raised by step() once nothing is in flight
        self.steps = 0  # step() calls that returned answers
        self.row_steps = 0  # requests in flight over those calls (their mean: how many ran together)

    def submit(self, seq) -> None:
        if self.rt.context_known:  # PromptTooLongError now, as the local engine says it (an estimate here)
            output_limit(len(seq.prompt), self.max_len, seq.request.max_tokens)
        with self.lock:
            self.waiting.append(seq)

    def cancel(self, seq) -> None:
        with self.lock:
            self.cancelled.add(seq)
            if seq in self.waiting:
                self.waiting.remove(seq)

    @property
    def busy(self) -> bool:
        with self.lock:
            return bool(self.waiting or self.running or self.failure is not None)

    def step(self) -> list:
        """Send what waits while fewer than `rows` are in flight, then wait for answers: those back so
        far (those of failed requests left out). A failure of the server or the connection
        (RemoteError) stops the sending; it is raised here once the requests in flight are back and
        handed over (written: a resume skips them)."""
        with self.lock:
            while self.failure is None and self.waiting and len(self.running) < self.rows:
                seq = self.waiting.popleft()
                self.running.add(seq)
                threading.Thread(target=self._ask, args=(seq,), daemon=True).start()
            in_flight = len(self.running)
        if not in_flight:
            if self.failure is not None:
                failure, self.failure = self.failure, None
                self.waiting.clear()
                raise failure
            return []
        answers = [self.done.get()]
        while True:
            try:
                answers.append(self.done.get_nowait())
            except queue.Empty:
                break
        events = []
        with self.lock:
            for seq, outcome in answers:
                self.running.discard(seq)
                if seq in self.cancelled:
                    self.cancelled.discard(seq)
                elif isinstance(outcome, BaseException):
                    self.failure = self.failure or outcome
                else:
                    events.append((seq, outcome))
        self.steps += 1
        self.row_steps += in_flight
        return events

    def _ask(self, seq) -> None:
        try:
            self.done.put((seq, self.rt.complete(seq.prompt, seq.request)))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread, raised there
            self.done.put((seq, e))
