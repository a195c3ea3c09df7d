"""The ASGI pieces the endpoints (*_endpoints.py) are built from, on uvicorn's event loop:

    run = EngineRun(engine_loop, reqs, "messages", on_end)  # submitted; `async for i, chunk in run`; close() cancels
    await unless_gone(receive, work)   # work, unless the client goes away first (then ClientGone)
    EventStream(events, run, request, write_s)              # server-sent events, cut if the client stops reading
    AccessLog(optional_v1(app))        # the outer layers: one log line per request; /v1/x is /x

The engine thread hands chunks to the event loop with call_soon_threadsafe: a request waiting for
its next token holds no thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from starlette.requests import Request
from starlette.responses import Response

from ..decode.batched import Sequence
from ..errors import LlmcliError, PromptTooLongError
from .engine_loop import EngineLoop
from .openai_api import ApiError

log = logging.getLogger("llmcli.server")


class ClientGone(Exception):
    """The client closed its connection, or stopped reading, while its request was running."""


class EngineRun:
    """A request's engine requests (one per choice), seen from the event loop: `async for index,
    chunk in run` until each has had its chunk with a finish_reason (an ApiError if the engine fails
    or stops); close() cancels those that did not end. The engine thread hands each chunk over with
    call_soon_threadsafe; the choices' chunks interleave as the engine makes them."""

    def __init__(self, engine_loop: EngineLoop, reqs: list[Sequence], param: str, on_end):
        self.engine_loop, self.reqs, self.on_end = engine_loop, reqs, on_end
        self.open: set[int] = set()
        self.first = None
        self.chunks: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def deliverer(index: int):
            def deliver(item) -> None:  # on the engine thread
                try:
                    loop.call_soon_threadsafe(self.chunks.put_nowait, (index, item))
                except RuntimeError:  # the event loop has stopped: nobody waits for this
                    pass
            return deliver

        for i, req in enumerate(reqs):
            try:
                engine_loop.submit(req, deliverer(i))
            except PromptTooLongError as e:
                self.close()
                raise ApiError(400, str(e), param, "context_length_exceeded") from None
            except BaseException:
                self.close()
                raise
            self.open.add(i)

    @property
    def ended(self) -> bool:
        return not self.open

    async def __aiter__(self):
        while self.open:
            index, item = await self.chunks.get()
            if isinstance(item, ApiError):
                self.close()
                raise item
            self.first = self.first or time.monotonic()
            if item.finish_reason is not None:
                self.open.discard(index)
                self.on_end(time.monotonic() - self.first)
            yield index, item

    def close(self) -> None:
        for i in sorted(self.open):
            self.engine_loop.cancel(self.reqs[i])
        self.open.clear()


async def collect(run: EngineRun, choices: list) -> list:
    """Every choice to its end: each chunk goes to its choice's push()."""
    async for index, chunk in run:
        choices[index].push(chunk)
    return choices


async def unless_gone(receive, work):
    """`await work`, unless the client goes away first (receive() says http.disconnect, which
    uvicorn reports once the connection closes): then `work` is cancelled and ClientGone raised."""
    job = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait((job, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone = watch.done() and not job.done()
        job.cancel()
        watch.cancel()
        await asyncio.gather(job, watch, return_exceptions=True)  # their cleanup runs before we go on
    if gone:
        raise ClientGone
    return job.result()


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStream(Response):
    """Server-sent events: `data: {json}` for each object `events` yields, then `data: [DONE]`. An
    error once the headers are out goes as an event (the openai client raises it). With `named`
    (an error's body as that API shapes it), the events are (name, object) pairs, each sent as
    `event: name` and its data, and no [DONE] follows (Anthropic's stream). With `lines` (the same
    for another API), each object is one line of JSON, an error too, and nothing follows (ollama's
    NDJSON stream)."""

    def __init__(self, events, run: EngineRun, request: Request, write_s: float, named=None, lines=None):
        self.events, self.run, self.request, self.write_s = events, run, request, write_s
        self.named, self.lines = named, lines
        self.status_code, self.background = 200, None

    async def __call__(self, scope, receive, send) -> None:
        async def write(data: bytes, more: bool = True) -> None:
            try:
                await asyncio.wait_for(send({"type": "http.response.body", "body": data, "more_body": more}), self.write_s)
            except asyncio.TimeoutError:  # its buffers stayed full: it stopped reading
                if "llmcli.connection" in scope:
                    scope["llmcli.connection"].abort()
                raise ClientGone from None

        async def pump() -> None:
            media = b"application/x-ndjson" if self.lines else b"text/event-stream"
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", media), (b"cache-control", b"no-cache")]})
            try:
                async for event in self.events:
                    await write(json_line(event) if self.lines else
                                sse_event(event[1], event[0]) if self.named else sse_event(event))
            except ClientGone:
                raise
            except Exception as e:
                err = as_api_error(e, self.request)
                self.request.state.note = err.message
                await write(json_line(self.lines(err)) if self.lines else
                            sse_event(self.named(err), "error") if self.named else sse_event(err.body()))
            if not self.named and not self.lines:
                await write(b"data: [DONE]\n\n")
            await write(b"", more=False)

        try:
            await unless_gone(receive, pump())
        except ClientGone:  # (after an error event, the openai client closes before [DONE]: say the error)
            self.request.state.note = getattr(self.request.state, "note", None) or "client went away"
        finally:
            await self.events.aclose()
            self.run.close()


class Silence(Response):
    """No answer: the client is gone."""

    def __init__(self):
        self.status_code, self.background = 499, None

    async def __call__(self, scope, receive, send) -> None:
        pass


class AccessLog:
    """The ASGI app's outer layer: one INFO line per request once it is answered (method, path,
    status, seconds, "stream", what happened), counted in `counts` (metrics.RequestCounts; 499:
    the client went before an answer), and a 500 in OpenAI's shape for anything that escaped the
    endpoints (logged as one line; the traceback only at DEBUG)."""

    def __init__(self, app, counts=None):
        self.app, self.counts = app, counts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, seen = time.perf_counter(), {}

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                seen["stream"] = dict(message.get("headers", [])).get(b"content-type", b"").startswith(
                    (b"text/event-stream", b"application/x-ndjson"))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as e:
            log.error("%s %s failed: %s", scope["method"], scope["path"], e, exc_info=log.isEnabledFor(logging.DEBUG))
            if "status" not in seen:
                answer = json_response(500, ApiError(500, f"internal error: {e}").body(), {"Connection": "close"})
                await answer(scope, receive, sending)
        finally:
            note = scope.get("state", {}).get("note")
            query = scope.get("query_string", b"")
            path = scope.get("llmcli.path", scope["path"]) + (f"?{query.decode('latin-1')}" if query else "")
            log.info("%s %s %s %.2f s%s%s", scope["method"], path, seen.get("status", "-"), time.perf_counter() - t0,
                     " stream" if seen.get("stream") else "", f" ({note})" if note else "")
            if self.counts is not None:
                self.counts.add(scope["path"], seen.get("status", 499))


def optional_v1(app):
    """/v1/x and /x are one endpoint, as are /x/ and /x (clients differ in what they send)."""
    async def normalized(scope, receive, send):
        if scope["type"] == "http":
            path = scope["path"].rstrip("/")
            scope = {**scope, "llmcli.path": scope["path"], "path": (path[3:] if path.startswith("/v1/") else path) or "/"}
        await app(scope, receive, send)
    return normalized


def as_api_error(e: Exception, request: Request) -> ApiError:
    """What an endpoint raised, as the answer: a user's mistake is a 400, a bug a 500 and one log line."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, LlmcliError):  # a template refusing the messages, a body json_input refuses
        return ApiError(400, str(e))
    log.error("%s %s failed: %s", request.method, request.url.path, e, exc_info=log.isEnabledFor(logging.DEBUG))
    return ApiError(500, f"internal error: {e}")


def json_response(status: int, obj: dict, headers: dict | None = None) -> Response:
    # backslashreplace: a lone surrogate (json_input refuses them in bodies) would become an escape, not a 500
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "backslashreplace")
    return Response(data, status, headers, media_type="application/json")


def sse_event(obj: dict, name: str | None = None) -> bytes:
    event = b"event: " + name.encode() + b"\n" if name else b""
    return event + b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8", "backslashreplace") + b"\n\n"


def json_line(obj: dict) -> bytes:
    """One object of an NDJSON stream (ollama's)."""
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "backslashreplace") + b"\n"
