"""`llmcli serve`: an OpenAI-compatible HTTP server over one model, a Starlette app on uvicorn.

    GET  /v1/models, /v1/models/{id}, /health, /metrics (the /v1 prefix may be left out)
    POST /v1/chat/completions, /v1/completions         (JSON, or server-sent events with "stream")
    POST /v1/embeddings                                (embeddings_api.py; an embedding model serves only this)
    POST /v1/messages, /v1/messages/count_tokens       Anthropic's Messages API (anthropic_api.py)
    POST /api/chat, /api/generate, /api/embed, /api/embeddings, /api/show; GET /api/tags, /api/ps,
         /api/version                                  ollama's API (ollama_api.py; NDJSON streams)

Requests are coroutines on one event loop (listener.py runs uvicorn). Reading JSON, the chat
template and tokenizing run in worker threads (prepare.py); the model runs in the one engine thread
(engine_loop.py), which decodes every running request together and hands each request its chunks
through the event loop, so that no request blocks another. A request with `n` choices is n engine
requests, decoded together. Embeddings run on a thread of their own, one request at a time, each
request's inputs several at a time. Limits, each answered in OpenAI's error shape:
- `rows` requests run, `queue` more wait for a row; one more gets 503 with Retry-After;
- a body over MAX_BODY: 413; not JSON, nested deeper than json_input's cap, or holding a lone
  surrogate: 400; a body slower than Timeouts.body: 408;
- a client that goes away cancels its request (its row is freed at the next step); one that stops
  reading a stream for Timeouts.write is cut off the same way;
- with an API key (access.py), 401 without it; CORS only for the origins given.

    server = Server(runtime, bind("127.0.0.1", 8080), model_id="smollm2")
    server.serve_forever()        # or start() in a thread; close() stops both
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from .. import __version__
from ..errors import PromptTooLongError
from ..json_input import load_json
from ..runtime.embedder import NoPoolingError
from . import anthropic_api as anthropic
from . import embeddings_api
from . import ollama_api as ollama
from . import openai_api as api
from .access import cors, require_key
from .asgi import (AccessLog, ClientGone, EngineRun, EventStream, Silence, as_api_error, collect, json_response,
                   optional_v1, unless_gone)
from .engine_loop import EngineLoop
from .listener import HttpServer, Timeouts
from .metrics import RequestCounts, prometheus
from .openai_api import ApiError
from .prepare import Preparer

MAX_BODY = 8 << 20  # bytes; a larger request body is refused with 413 (json_input caps its depth too)
QUEUE_PER_ROW = 8  # the default queue: this many waiting requests per row (64 at 8 rows)


class Server:
    def __init__(self, rt, sock, *, model_id: str, rows: int = 8, max_len: int | None = None,
                 queue: int | None = None, timeouts: Timeouts = Timeouts(), defaults: api.Defaults = api.Defaults(),
                 api_key: str | None = None, cors_origins: tuple[str, ...] = (), pooling: str | None = None,
                 prompt_cache: int | None = None):
        """`rt` a runtime.Runtime, `sock` from bind(); `rows` requests decoded together, each up to
        `max_len` tokens (default: rt.ctx_size), and `queue` more waiting for a row (default
        QUEUE_PER_ROW x rows); the KV cache holds rows x max_len tokens. `defaults`: what requests
        that leave a field out get (serve's flags); `api_key`: required of every request but the
        health check; `cors_origins`: the browser origins allowed ("*": any; none: CORS off).
        /v1/embeddings answers with the model's own pooling, or `pooling` (mean, cls, last, max): a
        text-generation model that declares none embeds only with it. An embedding model
        (rt.generates False) serves only that. `prompt_cache`: bytes of finished requests' KV kept for
        later prompts that start the same way (None: Runtime.prompt_cache_budget(); 0: none)."""
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
        self.defaults, self.api_key, self.cors_origins = defaults, api_key, tuple(cors_origins)
        self.prepare = Preparer(rt)
        self.counts = RequestCounts()
        self._accepting = 0  # requests admitted and not yet in the engine (body, tokenizing); event loop only
        self._durations: deque[float] = deque(maxlen=32)  # seconds recent requests took in a row
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
                  Route("/health", self.health, methods=["GET"]), Route("/metrics", self.metrics, methods=["GET"]),
                  Route("/chat/completions", self.chat, methods=["POST"]),
                  Route("/completions", self.completion, methods=["POST"]),
                  Route("/embeddings", self.embeddings, methods=["POST"]),
                  Route("/messages", self.messages, methods=["POST"]),
                  Route("/messages/count_tokens", self.count_tokens, methods=["POST"]),
                  *(Route(f"/api/{name}", getattr(self, f"ollama_{name}"), methods=[method]) for name, method in (
                      ("chat", "POST"), ("generate", "POST"), ("embed", "POST"), ("embeddings", "POST"),
                      ("show", "POST"), ("tags", "GET"), ("ps", "GET"), ("version", "GET")))]
        app = Starlette(routes=routes, exception_handlers={HTTPException: _routing_error})
        if self.api_key:
            app = require_key(app, self.api_key)
        app = optional_v1(app)
        if self.cors_origins:
            app = cors(app, list(self.cors_origins))
        return AccessLog(app, self.counts)

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

    async def metrics(self, request: Request) -> Response:
        return Response(prometheus(self.loop.meter if self.loop else None, self.counts, self.loop), 200,
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    def _card(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "llmcli"}

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, self._chat_request, "messages", "chatcmpl", self._chat_events,
                                    api.chat_response)

    async def completion(self, request: Request) -> Response:
        return await self._generate(request, self._completion_request, "prompt", "cmpl", self._completion_events,
                                    api.completion_response)

    async def _generate(self, request: Request, prepare, param: str, id_prefix: str, events, response) -> Response:
        """A chat or completion request: prepared in a worker thread, decoded in the engine, answered
        whole or as a stream of `events`."""
        try:
            self._check_generates()
            with self._admitted():
                job, reqs, choices = await run_in_threadpool(prepare, await self._read_body(request))
                run = self._submit(reqs, param)
            head = api.head(id_prefix, self.model_id)
            if job.stream:
                return EventStream(events(run, job, head, choices, request), run, request, self.timeouts.write)
            try:
                await unless_gone(request.receive, collect(run, choices))
            finally:
                run.close()
            request.state.note = _note(choices)
            return json_response(200, response(head, [c.body() for c in choices], [c.last.stats for c in choices]))
        except Exception as e:
            return _failure(e, request)

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API (anthropic_api.py) through the chat endpoint's machinery."""
        try:
            self._check_generates()
            with self._admitted():
                job, reqs, choices = await run_in_threadpool(self._messages_request, await self._read_body(request))
                run = self._submit(reqs, "messages")
            msg_id = anthropic.new_id()
            if job.stream:
                events = self._message_events(run, msg_id, len(reqs[0].prompt), choices[0], request)
                return EventStream(events, run, request, self.timeouts.write, named=anthropic.error_body)
            try:
                await unless_gone(request.receive, collect(run, choices))
            finally:
                run.close()
            request.state.note = _note(choices)
            return json_response(200, anthropic.message(msg_id, self.model_id, choices[0]))
        except Exception as e:
            return _failure(e, request, anthropic.error_body)

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's token count of a Messages request: its prompt's tokens, as the template makes them."""
        try:
            job, reqs, _ = await run_in_threadpool(self._messages_request, await self._read_body(request), True)
            return json_response(200, {"input_tokens": len(reqs[0].prompt)})
        except Exception as e:
            return _failure(e, request, anthropic.error_body)

    def _messages_request(self, data: bytes, counting: bool = False):
        body = _parse(data)
        if counting:
            body = {**body, "max_tokens": body.get("max_tokens", 1), "stream": False}
        job = anthropic.messages_job(body, self.defaults)
        self._check_model(job.model)
        return (job, *self.prepare.chat(job))

    async def _message_events(self, run, msg_id: str, prompt_tokens: int, choice, request: Request):
        stream = anthropic.StreamEvents(msg_id, self.model_id, prompt_tokens)
        for event in stream.start():
            yield event
        async for _, chunk in run:
            sent = len(choice.calls)
            for delta, _ in choice.push(chunk):
                if delta.get("reasoning_content"):
                    for event in stream.thinking(delta["reasoning_content"]):
                        yield event
                if delta.get("content"):
                    for event in stream.text(delta["content"]):
                        yield event
            for call in choice.calls[sent:]:
                for event in stream.call(call):
                    yield event
            if chunk.finish_reason is not None:
                for event in stream.finish(choice):
                    yield event
        request.state.note = _note([choice])

    async def embeddings(self, request: Request) -> Response:
        try:
            job, vectors, tokens = await self._embed(request)
            return json_response(200, embeddings_api.embeddings_response(self.model_id, vectors, tokens, job.base64))
        except Exception as e:
            return _failure(e, request)

    async def _embed(self, request: Request, translate=None):
        """(job, vectors, tokens) of an embeddings request; `translate`: another API's body -> OpenAI's."""
        if self.embedder is None:
            raise ApiError(400, f"{self.model_id} is a text-generation model whose files declare no pooling, so this "
                                "server does not embed; start it with --pooling last (or mean) to embed with the "
                                "model's last hidden states", code="model_not_supported")
        with self._admitted():
            job, ids = await run_in_threadpool(self._embedding_request, await self._read_body(request), translate)
            work = asyncio.wrap_future(self._embedding.submit(self.embedder.embed, ids))
            vectors = await unless_gone(request.receive, work)
        tokens = sum(map(len, ids))
        request.state.note = f"{len(ids)} inputs, {tokens} tokens"
        return job, vectors, tokens

    def _embedding_request(self, data: bytes, translate=None):
        body = _parse(data)
        job = embeddings_api.embedding_job(translate(body) if translate else body)
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

    # ------------------------------------------------------------------ ollama's API (ollama_api.py)

    async def ollama_chat(self, request: Request) -> Response:
        return await self._ollama(request, "chat")

    async def ollama_generate(self, request: Request) -> Response:
        return await self._ollama(request, "generate")

    async def _ollama(self, request: Request, kind: str) -> Response:
        """/api/chat or /api/generate through the chat (or completion) endpoint's machinery; NDJSON
        lines unless stream is false."""
        started = time.monotonic()
        try:
            self._check_generates()
            with self._admitted():
                job, reqs, choices = await run_in_threadpool(self._ollama_request, await self._read_body(request), kind)
                if job is None:  # no prompt: ollama's way to load the model, which is loaded
                    return json_response(200, ollama.loaded(kind, self.model_id))
                run = self._submit(reqs, "messages" if job.messages is not None else "prompt")
            answer = ollama.Answer(kind, self.model_id, started)
            if job.stream:
                lines = self._ollama_lines(run, answer, choices[0], request)
                return EventStream(lines, run, request, self.timeouts.write, lines=ollama.error_body)
            try:
                await unless_gone(request.receive, collect(run, choices))
            finally:
                run.close()
            request.state.note = _note(choices)
            return json_response(200, answer.whole(choices[0]))
        except Exception as e:
            return _failure(e, request, ollama.error_body)

    def _ollama_request(self, data: bytes, kind: str):
        body = _parse(data)
        self._check_model(ollama.model_name(body))
        job = (ollama.chat_job if kind == "chat" else ollama.generate_job)(body, self.defaults, self._context())
        if job is None:
            return None, [], []
        prepared = self.prepare.chat(job) if job.messages is not None else self.prepare.completion(job)
        return (job, *prepared)

    async def _ollama_lines(self, run, answer, choice, request: Request):
        async for _, chunk in run:
            for line in answer.push(choice, chunk):
                yield line
        request.state.note = _note([choice])

    async def ollama_embed(self, request: Request) -> Response:
        started = time.monotonic()
        try:
            _, vectors, tokens = await self._embed(request, ollama.embed_body)
            return json_response(200, ollama.embed_response(self.model_id, vectors, tokens, started))
        except Exception as e:
            return _failure(e, request, ollama.error_body)

    async def ollama_embeddings(self, request: Request) -> Response:
        """The older endpoint: one prompt, one embedding."""
        try:
            _, vectors, _ = await self._embed(request, ollama.embeddings_body)
            return json_response(200, ollama.embedding_response(vectors[0]))
        except Exception as e:
            return _failure(e, request, ollama.error_body)

    async def ollama_tags(self, request: Request) -> Response:
        return json_response(200, {"models": [self._described().tag()]})

    async def ollama_ps(self, request: Request) -> Response:
        return json_response(200, {"models": [self._described().process()]})

    async def ollama_show(self, request: Request) -> Response:
        try:
            body = _parse(await self._read_body(request))
            self._check_model(ollama.model_name(body) or body.get("name"))  # (older clients send name)
            return json_response(200, self._described().show())
        except Exception as e:
            return _failure(e, request, ollama.error_body)

    async def ollama_version(self, request: Request) -> Response:
        return json_response(200, {"version": __version__})

    def _described(self) -> ollama.Described:
        return ollama.describe(self.rt, self.model_id, self._context(), self.defaults, self.embedder is not None)

    def _context(self) -> int:
        """Tokens a request may hold, prompt and answer: a row of the engine."""
        return self.loop.engine.max_len if self.loop is not None else self.rt.ctx_size

    def _check_generates(self) -> None:
        if self.loop is None:
            raise ApiError(400, f"{self.model_id} is an embedding model: this server answers /v1/embeddings, not chat "
                                "or completions", "model", "model_not_supported")

    async def _chat_events(self, run, job: api.Job, head: dict, choices: list, request: Request):
        """The chat stream's objects: each choice's role, its text as it comes (held-back text, a
        stop's prefix, waits) and its tool calls, its finish reason, and with include_usage a last
        usage-only chunk."""
        usage = job.include_usage
        for c in choices:
            yield api.chat_chunk(head, {"role": "assistant", "content": ""}, with_usage=usage, index=c.index)
        async for index, chunk in run:
            choice = choices[index]
            for delta, logprobs in choice.push(chunk):
                yield api.chat_chunk(head, delta, logprobs=logprobs, with_usage=usage, index=index)
            if chunk.finish_reason is not None:
                yield api.chat_chunk(head, {}, choice.finish_reason, with_usage=usage, stopped_by=chunk.stopped_by,
                                     index=index)
        if usage:
            yield api.chat_chunk(head, None, stats=[c.last.stats for c in choices], with_usage=True)
        request.state.note = _note(choices)

    async def _completion_events(self, run, job: api.Job, head: dict, choices: list, request: Request):
        async for index, chunk in run:
            lp = choices[index].push(chunk)
            if chunk.text or chunk.finish_reason or (lp and lp["tokens"]):
                yield api.completion_chunk(head, chunk.text, chunk.finish_reason, lp, with_usage=job.include_usage,
                                           stopped_by=chunk.stopped_by, index=index)
        if job.include_usage:
            yield api.completion_chunk(head, None, stats=[c.last.stats for c in choices], with_usage=True)
        request.state.note = _note(choices)

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
        job = api.chat_job(_parse(data), self.defaults)
        self._check_model(job.model)
        return (job, *self.prepare.chat(job))

    def _completion_request(self, data: bytes):
        job = api.completion_job(_parse(data), self.defaults)
        self._check_model(job.model)
        return (job, *self.prepare.completion(job))

    def _check_model(self, name: str | None) -> None:
        if name is not None and name not in self.names:
            raise ApiError(404, f"the model {name!r} is not served here; this server serves {self.model_id!r} "
                                "(see GET /v1/models)", "model", "model_not_found")

    def _submit(self, reqs: list, param: str) -> EngineRun:
        return EngineRun(self.loop, reqs, param, self._durations.append)


async def _routing_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's router found no endpoint (404) or not this method (405)."""
    method, path = request.method, request.scope.get("llmcli.path", request.url.path)
    shape = ollama.error_body if path.startswith("/api/") else None
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        return _failure(ApiError(405, f"{path} takes {allow}, not {method}", code="method_not_allowed",
                                 headers={"Allow": allow}), request, shape)
    if exc.status_code == 404:
        return _failure(ApiError(404, f"no such endpoint: {method} {path}", code="not_found"), request, shape)
    return _failure(ApiError(exc.status_code, exc.detail), request, shape)


def _parse(data: bytes) -> dict:
    if not data:
        raise ApiError(400, "the request has no body; send a JSON object")
    body = load_json(data, "the request body")  # InvalidParameterError: a 400
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
    return body


def _failure(e: Exception, request: Request, shape=None) -> Response:
    """The error answer, in OpenAI's shape or as `shape(ApiError)` makes it (another API's)."""
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
    return json_response(err.status, shape(err) if shape else err.body(), headers)


def _note(choices: list) -> str:
    stats = [c.last.stats for c in choices]
    finish = ", ".join(c.finish_reason for c in choices)
    return f"{stats[0].prompt_tokens}+{sum(s.completion_tokens for s in stats)} tokens, {finish}"
