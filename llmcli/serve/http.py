"""`llmcli serve`: an OpenAI-compatible HTTP server over one model, a Starlette app on uvicorn.

    GET  /v1/models, /v1/models/{id}, /health          (the /v1 prefix may be left out)
    POST /v1/chat/completions, /v1/completions         (JSON, or server-sent events with "stream")
    POST /v1/embeddings                                (embeddings_api.py; an embedding model serves only this)

Requests are coroutines on one event loop (listener.py runs uvicorn). Reading JSON, the chat
template and tokenizing run in worker threads; the model runs in the one engine thread
(engine_loop.py), which decodes every running request together and hands each request its chunks
through the event loop, so that no request blocks another. Embeddings run on a thread of their own,
one request at a time, each request's inputs several at a time. Limits, each answered in OpenAI's
error shape:
- `rows` requests run, `queue` more wait for a row; one more gets 503 with Retry-After;
- a body over MAX_BODY: 413; not JSON, nested deeper than json_input's cap, or holding a lone
  surrogate: 400; a body slower than Timeouts.body: 408;
- a client that goes away cancels its request (its row is freed at the next step); one that stops
  reading a stream for Timeouts.write is cut off the same way.

    server = Server(runtime, bind("127.0.0.1", 8080), model_id="smollm2")
    server.serve_forever()        # or start() in a thread; close() stops both
"""

from __future__ import annotations

import asyncio
import math
import statistics
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import lru_cache

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..decode.batched import Request as EngineRequest
from ..decode.constrained import GrammarCompiler, from_json_schema
from ..decode.generate import Logprobs
from ..errors import GrammarError, PromptTooLongError
from ..json_input import load_json
from ..runtime.embedder import NoPoolingError
from . import embeddings_api
from . import openai_api as api
from .asgi import (AccessLog, ClientGone, EngineRun, EventStream, Silence, as_api_error, collect, json_response,
                   optional_v1, unless_gone)
from .engine_loop import EngineLoop
from .listener import HttpServer, Timeouts
from .openai_api import ApiError

MAX_BODY = 8 << 20  # bytes; a larger request body is refused with 413 (json_input caps its depth too)
QUEUE_PER_ROW = 8  # the default queue: this many waiting requests per row (64 at 8 rows)


class Server:
    def __init__(self, rt, sock, *, model_id: str, rows: int = 8, max_len: int | None = None,
                 queue: int | None = None, timeouts: Timeouts = Timeouts(), pooling: str | None = None,
                 prompt_cache: int | None = None):
        """`rt` a runtime.Runtime, `sock` from bind(); `rows` requests decoded together, each up to
        `max_len` tokens (default: rt.ctx_size), and `queue` more waiting for a row (default
        QUEUE_PER_ROW x rows); the KV cache holds rows x max_len tokens. /v1/embeddings answers with
        the model's own pooling, or `pooling` (mean, cls, last, max): a text-generation model that
        declares none embeds only with it. An embedding model (rt.generates False) serves only that.
        `prompt_cache`: bytes of finished requests' KV kept for later prompts that start the same way
        (None: Runtime.prompt_cache_budget(); 0: none)."""
        self.rt, self.sock, self.model_id, self.timeouts = rt, sock, model_id, timeouts
        self.names = {model_id, rt.loaded.name, rt.loaded.path.name, ""}  # what a request's "model" may say
        self.created = int(time.time())
        self.limit = rows + (QUEUE_PER_ROW * rows if queue is None else queue)  # running + waiting
        self.loop = EngineLoop(rt.batch_engine(rows, max_len, prompt_cache)) if rt.generates else None
        try:
            self.embedder = rt.embedder(pooling)
        except NoPoolingError:  # a text-generation model: /v1/embeddings says how to start the server
            self.embedder = None
        self._embedding = ThreadPoolExecutor(1, thread_name_prefix="llmcli-embed")  # one request at a time
        self._accepting = 0  # requests admitted and not yet in the engine (body, tokenizing); event loop only
        self._durations: deque[float] = deque(maxlen=32)  # seconds recent requests took in a row
        self._compiler = None
        self._compiler_lock = threading.Lock()
        self.http = HttpServer(self.app(), sock, timeouts, on_stop=self._stop)

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    def serve_forever(self) -> None:
        """In the main thread: SIGINT and SIGTERM stop it cleanly, then reach the caller as usual."""
        self.http.run()

    def start(self) -> "Server":
        """Serve from a background thread (tests, embedding)."""
        self.http.start()
        return self

    def close(self) -> None:
        self.http.stop()
        self._stop()  # again, if the server never ran: every unfinished request gets a 503
        self.sock.close()

    def _stop(self) -> None:
        if self.loop is not None:
            self.loop.close()
        self._embedding.shutdown(wait=False, cancel_futures=True)

    def app(self):
        routes = [Route("/models", self.models, methods=["GET"]), Route("/models/{name:path}", self.model, methods=["GET"]),
                  Route("/health", self.health, methods=["GET"]), Route("/chat/completions", self.chat, methods=["POST"]),
                  Route("/completions", self.completion, methods=["POST"]),
                  Route("/embeddings", self.embeddings, methods=["POST"])]
        return AccessLog(optional_v1(Starlette(routes=routes, exception_handlers={HTTPException: _routing_error})))

    # ------------------------------------------------------------------ endpoints

    async def models(self, request: Request) -> Response:
        return json_response(200, {"object": "list", "data": [self._card()]})

    async def model(self, request: Request) -> Response:
        try:
            self._check_model(request.path_params["name"])
        except ApiError as e:
            return _failure(e, request)
        return json_response(200, self._card())

    async def health(self, request: Request) -> Response:
        stats = self.loop.stats if self.loop is not None else {"embeddings_only": True}
        return json_response(200, {"status": "ok", "model": self.model_id, **stats, "max_requests": self.limit})

    def _card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "llmcli"}

    async def chat(self, request: Request) -> Response:
        try:
            self._check_generates()
            with self._admitted():
                job, req, cursor = await run_in_threadpool(self._chat_request, await self._read_body(request))
                run = self._submit(req, "messages")
            head = api.head("chatcmpl", self.model_id)
            if job.stream:
                return EventStream(self._chat_events(run, job, head, cursor, request), run, request, self.timeouts.write)
            try:
                text, entries, last = await unless_gone(request.receive, collect(run, cursor.chat if cursor else None))
            finally:
                run.close()
            request.state.note = _note(last)
            return json_response(200, api.chat_response(head, text, last.finish_reason, last.stats,
                                                        entries if cursor else None, last.stopped_by))
        except Exception as e:
            return _failure(e, request)

    async def completion(self, request: Request) -> Response:
        try:
            self._check_generates()
            with self._admitted():
                data = await self._read_body(request)
                job, req, cursor, offset = await run_in_threadpool(self._completion_request, data)
                run = self._submit(req, "prompt")
            head = api.head("cmpl", self.model_id)
            if job.stream:
                return EventStream(self._completion_events(run, job, head, cursor, offset, request), run, request,
                                    self.timeouts.write)
            legacy = _LegacyCursor(cursor, offset) if cursor else None
            try:
                text, parts, last = await unless_gone(request.receive, collect(run, legacy))
            finally:
                run.close()
            request.state.note = _note(last)
            return json_response(200, api.completion_response(head, text, last.finish_reason, last.stats,
                                                              api.merge_legacy(parts) if cursor else None,
                                                              last.stopped_by))
        except Exception as e:
            return _failure(e, request)

    async def embeddings(self, request: Request) -> Response:
        try:
            if self.embedder is None:
                raise ApiError(400, f"{self.model_id} is a text-generation model whose files declare no pooling, so this "
                                    "server does not embed; start it with --pooling last (or mean) to embed with the "
                                    "model's last hidden states", code="model_not_supported")
            with self._admitted():
                job, ids = await run_in_threadpool(self._embedding_request, await self._read_body(request))
                work = asyncio.wrap_future(self._embedding.submit(self.embedder.embed, ids))
                vectors = await unless_gone(request.receive, work)
            tokens = sum(map(len, ids))
            request.state.note = f"{len(ids)} inputs, {tokens} tokens"
            return json_response(200, embeddings_api.embeddings_response(self.model_id, vectors, tokens, job.base64))
        except Exception as e:
            return _failure(e, request)

    def _embedding_request(self, data: bytes):
        job = embeddings_api.embedding_job(_parse(data))
        self._check_model(job.model)
        e = self.embedder
        if job.dimensions is not None and job.dimensions != e.dimensions:
            raise ApiError(400, f"this model makes {e.dimensions}-dimensional vectors and was not trained to be cut "
                                f"shorter; leave dimensions out or set it to {e.dimensions}", "dimensions")
        vocab, ids = self.rt.loaded.args.vocab_size, []
        for i, item in enumerate(job.inputs):
            what = f"input[{i}]"
            try:
                if isinstance(item, str):
                    ids.append(e.ids(item, job.truncate, what))
                elif max(item) >= vocab:
                    raise ApiError(400, f"{what} has token id {max(item)}, outside the vocabulary (0..{vocab - 1})", what)
                else:
                    ids.append(e.frame(item, job.truncate, what))
            except PromptTooLongError as err:
                raise ApiError(400, str(err), what, "context_length_exceeded") from None
        return job, ids

    def _check_generates(self) -> None:
        if self.loop is None:
            raise ApiError(400, f"{self.model_id} is an embedding model: this server answers /v1/embeddings, not chat "
                                "or completions", "model", "model_not_supported")

    async def _chat_events(self, run, job: api.Job, head: dict, cursor, request: Request):
        """The chat stream's objects: the role, the text as it comes (held-back text, a stop's
        prefix, waits), the finish reason, and with include_usage a last usage-only chunk."""
        usage = job.include_usage
        yield api.chat_chunk(head, {"role": "assistant", "content": ""}, with_usage=usage)
        entries = []
        async for chunk in run:
            entries += cursor.chat(chunk) if cursor else []
            if chunk.text or (chunk.finish_reason and entries):
                yield api.chat_chunk(head, {"content": chunk.text}, logprobs=entries if cursor else None, with_usage=usage)
                entries = []
        yield api.chat_chunk(head, {}, chunk.finish_reason, with_usage=usage, stopped_by=chunk.stopped_by)
        if usage:
            yield api.chat_chunk(head, None, stats=chunk.stats, with_usage=True)
        request.state.note = _note(chunk)

    async def _completion_events(self, run, job: api.Job, head: dict, cursor, offset: int, request: Request):
        sent = 0  # characters streamed so far
        async for chunk in run:
            lp = cursor.legacy(chunk, offset + sent) if cursor else None
            if chunk.text or chunk.finish_reason or (lp and lp["tokens"]):
                yield api.completion_chunk(head, chunk.text, chunk.finish_reason, lp, with_usage=job.include_usage,
                                           stopped_by=chunk.stopped_by)
            sent += len(chunk.text)
        if job.include_usage:
            yield api.completion_chunk(head, None, stats=chunk.stats, with_usage=True)
        request.state.note = _note(chunk)

    # ------------------------------------------------------------------ a request's way in (slow parts: worker threads)

    @contextmanager
    def _admitted(self):
        """Room for one more request, or 503 (before its body is read: the connection then closes)."""
        busy = self._accepting + (self.loop.in_flight if self.loop is not None else 0)
        if busy >= self.limit:
            raise ApiError(503, f"the server is busy: {busy} requests are running or waiting for a row, as many "
                                "as it takes (--rows + --queue); retry later", code="server_busy",
                           headers={"Retry-After": str(self._retry_after())})
        self._accepting += 1
        try:
            yield
        finally:
            self._accepting -= 1

    def _retry_after(self) -> int:
        """Seconds until a place is likely free: with every row busy, one frees every
        (a request's time in its row) / rows seconds."""
        if not self._durations or self.loop is None:
            return 1
        return max(1, min(60, math.ceil(statistics.median(self._durations) / self.loop.engine.rows)))

    async def _read_body(self, request: Request) -> bytes:
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
            await asyncio.wait_for(read(), self.timeouts.body)
        except asyncio.TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {self.timeouts.body:g} s",
                           code="request_timeout") from None
        except ClientDisconnect:
            raise ClientGone from None
        request.state.body_read = True
        return bytes(body)

    def _chat_request(self, data: bytes):
        job = api.chat_job(_parse(data))
        self._check_model(job.model)
        req = self._request(job, self.rt.prompt_ids(job.messages), "messages")
        return job, req, self._cursor(req)

    def _completion_request(self, data: bytes):
        job = api.completion_job(_parse(data))
        self._check_model(job.model)
        tok = self.rt.loaded.tokenizer
        ids = tok.encode(job.prompt) if isinstance(job.prompt, str) else job.prompt
        req = self._request(job, ids, "prompt")
        offset = len(job.prompt if isinstance(job.prompt, str) else tok.decode(ids))  # text_offset counts from here
        return job, req, self._cursor(req), offset

    def _cursor(self, req: EngineRequest):
        return api.LogprobCursor(req.logprobs, self.rt.loaded.tokenizer) if req.logprobs is not None else None

    def _check_model(self, name: str | None) -> None:
        if name is not None and name not in self.names:
            raise ApiError(404, f"the model {name!r} is not served here; this server serves {self.model_id!r} "
                                "(see GET /v1/models)", "model", "model_not_found")

    def _request(self, job: api.Job, ids: list[int], param: str) -> EngineRequest:
        if not ids:
            raise ApiError(400, f"the {param} is empty", param)
        vocab = self.rt.loaded.args.vocab_size
        if max(ids) >= vocab:
            raise ApiError(400, f"token id {max(ids)} is outside the vocabulary (0..{vocab - 1})", param)
        constraint = None
        if job.schema is not None:
            try:
                constraint = self.compiler().constraint(_grammar(job.schema))
            except GrammarError as e:
                raise ApiError(400, str(e), "response_format") from None
        recorder = Logprobs(job.logprobs) if job.logprobs is not None else None
        return EngineRequest(ids, job.params, job.max_tokens, job.stop, constraint, recorder)

    def compiler(self):
        """The grammar compiler for this model's tokenizer, built on first use (about a second)."""
        with self._compiler_lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(self.rt.loaded.tokenizer)
            return self._compiler

    def _submit(self, req: EngineRequest, param: str) -> EngineRun:
        return EngineRun(self.loop, req, param, self._durations.append)


class _LegacyCursor:
    """The completions endpoint's logprobs for collect: one dict per chunk, text_offset running on."""

    def __init__(self, cursor, offset: int):
        self.cursor, self.offset = cursor, offset

    def __call__(self, chunk) -> list[dict]:
        part = self.cursor.legacy(chunk, self.offset)
        self.offset += len(chunk.text)
        return [part]


async def _routing_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's router found no endpoint (404) or not this method (405)."""
    method, path = request.method, request.scope.get("llmcli.path", request.url.path)
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        return _failure(ApiError(405, f"{path} takes {allow}, not {method}", code="method_not_allowed",
                                 headers={"Allow": allow}), request)
    if exc.status_code == 404:
        return _failure(ApiError(404, f"no such endpoint: {method} {path}", code="not_found"), request)
    return _failure(ApiError(exc.status_code, exc.detail), request)


def _parse(data: bytes) -> dict:
    if not data:
        raise ApiError(400, "the request has no body; send a JSON object")
    body = load_json(data, "the request body")  # InvalidParameterError: a 400
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
    return body


def _failure(e: Exception, request: Request) -> Response:
    if isinstance(e, ClientGone):
        request.state.note = "client went away"
        return Silence()
    err = as_api_error(e, request)
    if not getattr(request.state, "note", None):
        request.state.note = err.message
    headers = dict(err.headers)
    unread = not getattr(request.state, "body_read", False) and (
        request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers)
    if unread:  # the body would be read as the next request: this connection cannot go on
        headers["Connection"] = "close"
    return json_response(err.status, err.body(), headers)


def _note(last) -> str:
    return f"{last.stats.prompt_tokens}+{last.stats.completion_tokens} tokens, {last.finish_reason}"


@lru_cache(maxsize=64)
def _grammar(schema_text: str):
    """A response_format schema, checked and compiled once per distinct schema."""
    return from_json_schema(schema_text, "response_format's schema")
