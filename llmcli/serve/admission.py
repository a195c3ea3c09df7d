"""A request's way in, each refusal an ApiError in OpenAI's shape: room for it (503 with Retry-After),
its body (413, 408), its JSON (400), the model it names held while it is prepared (ModelDispatch),
then its sequences into that model's engine.

    with admission.admitted():                      # room, or 503 before the body is read
        data = await admission.read_body(request)   # bytes, at most MAX_BODY
        job = api.chat_job(parse_body(data), defaults)      # (in a worker thread, with the next line)
        reqs, choices = prepare.chat(job)           # a ModelDispatch: holds the model, its runtime prepares
        run = admission.submit(reqs, "messages")    # an asgi.EngineRun; the model is released
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections import deque
from contextlib import contextmanager

from starlette.requests import ClientDisconnect, Request

from ..json_input import load_json
from .asgi import ClientGone, EngineRun
from .models import Models
from .openai_api import ApiError

MAX_BODY = 8 << 20  # bytes; a larger request body is refused with 413 (json_input caps its depth too)


class Admission:
    """How many requests the server takes: `limit` running or waiting (rows + queue), counted as
    those admitted and not yet in an engine plus every engine's in flight. `rows` and recent
    requests' durations say when to retry; `body_s`: how long a body may take to arrive."""

    def __init__(self, models: Models, prepare: "ModelDispatch", limit: int, rows: int, body_s: float):
        self.models, self.prepare, self.limit, self.rows, self.body_s = models, prepare, limit, rows, body_s
        self.accepting = 0  # requests admitted and not yet in the engine (body, tokenizing); event loop only
        self.durations: deque[float] = deque(maxlen=32)  # seconds recent requests took in a row

    @contextmanager
    def admitted(self):
        """Room for one more request, or 503 (before its body is read: the connection then closes)."""
        busy = self.accepting + sum(s.loop.in_flight for s in self.models.loaded() if s.loop is not None)
        if busy >= self.limit:
            raise ApiError(503, f"the server is busy: {busy} requests are running or waiting for a row, as many "
                                "as it takes (--rows + --queue); retry later", code="server_busy",
                           headers={"Retry-After": str(self.retry_after())})
        self.accepting += 1
        try:
            yield
        finally:
            self.accepting -= 1

    def retry_after(self) -> int:
        """Seconds until a place is likely free: with every row busy, one frees every
        (a request's time in its row) / rows seconds."""
        if not self.durations:
            return 1
        return max(1, min(60, math.ceil(statistics.median(self.durations) / self.rows)))

    async def read_body(self, request: Request) -> bytes:
        length = request.headers.get("content-length", "")  # h11 checked it is digits
        if length.isdigit() and int(length) > MAX_BODY:
            raise ApiError(413, f"the request body is {length} bytes; the limit is {MAX_BODY}", code="request_too_large")
        body = bytearray()

        async def read():
            async for part in request.stream():  # Content-Length or chunked
                body.extend(part)
                if len(body) > MAX_BODY:
                    raise ApiError(413, f"the request body is over the limit of {MAX_BODY} bytes", code="request_too_large")

        try:
            await asyncio.wait_for(read(), self.body_s)
        except asyncio.TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {self.body_s:g} s",
                           code="request_timeout") from None
        except ClientDisconnect:
            raise ClientGone from None
        request.state.body_read = True
        return bytes(body)

    def submit(self, reqs: list, param: str) -> EngineRun:
        """The prepared sequences into their model's engine (which then counts them as in flight)."""
        try:
            return EngineRun(reqs[0].owner.loop, reqs, param, self.durations.append)
        finally:
            self.prepare.done(reqs)


class ModelDispatch:
    """Preparer's face for the server's endpoints, over every model it serves: a request is prepared
    by the runtime of the model it names (loaded if need be), which it holds until its sequences are
    in the engine (Admission.submit calls done())."""

    def __init__(self, models: Models):
        self.models = models

    def chat(self, job) -> tuple[list, list]:
        return self._by_model(job, lambda p: p.chat(job))

    def completion(self, job) -> tuple[list, list]:
        return self._by_model(job, lambda p: p.completion(job))

    def done(self, reqs: list) -> None:
        self.models.release(reqs[0].owner)

    def _by_model(self, job, prepare) -> tuple[list, list]:
        served = self.models.hold(job.model)
        try:
            if served.loop is None:
                raise ApiError(400, f"{served.name} is an embedding model: this server answers /v1/embeddings with "
                                    "it, not chat or completions", "model", "model_not_supported")
            seqs, choices = prepare(served.prepare)
        except BaseException:
            self.models.release(served)
            raise
        for seq in seqs:
            seq.owner = served
        return seqs, choices


def parse_body(data: bytes) -> dict:
    """A request body -> its JSON object, or a 400."""
    if not data:
        raise ApiError(400, "the request has no body; send a JSON object")
    body = load_json(data, "the request body")  # InvalidParameterError: a 400
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
    return body
