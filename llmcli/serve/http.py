"""`llmcli serve`: an OpenAI-compatible HTTP server over one model, a Starlette app on uvicorn.

    GET  /v1/models, /v1/models/{id}, /health, /metrics (the /v1 prefix may be left out)
    POST /v1/chat/completions, /v1/completions         (JSON, or server-sent events with "stream")
    POST /v1/embeddings                                (embeddings_api.py; an embedding model serves only this)
    POST /v1/responses, GET|DELETE /v1/responses/{id}  (responses_api.py: OpenAI's Responses API)
    POST /v1/messages, /v1/messages/count_tokens       Anthropic's Messages API (anthropic_api.py)
    POST /api/chat, /api/generate, /api/embed, /api/embeddings, /api/show; GET /api/tags, /api/ps,
         /api/version, and GET / ("Ollama is running")  ollama's API (ollama_api.py; NDJSON streams)

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
from . import responses_api
from . import openai_api as api
from .access import cors, require_key
from .asgi import (AccessLog, ClientGone, EngineRun, EventStream, Silence, as_api_error, collect, json_response,
                   optional_v1, unless_gone)
from .engine_loop import EngineLoop
from .listener import HttpServer, Timeouts
from .metrics import RequestCounts, prometheus
from .models import Models, Served
from .openai_api import ApiError
from .prepare import Preparer

MAX_BODY = 8 << 20  # bytes; a larger request body is refused with 413 (json_input caps its depth too)
QUEUE_PER_ROW = 8  # the default queue: this many waiting requests per row (64 at 8 rows)


class Server:
    def __init__(self, rt, sock, *, model_id: str, rows: int = 8, max_len: int | None = None,
                 queue: int | None = None, timeouts: Timeouts = Timeouts(), defaults: api.Defaults = api.Defaults(),
                 api_key: str | None = None, cors_origins: tuple[str, ...] = (), pooling: str | None = None,
                 prompt_cache: int | None = None, more: tuple = (), open_model=None, resolve=None,
                 models_max: int = 3, keep_alive: float | None = 300.0, kept: float | None = None, on_disk=None):
        """`rt` a runtime.Runtime, `sock` from bind(); `rows` requests decoded together, each up to
        `max_len` tokens (default: rt.ctx_size), and `queue` more waiting for a row (default
        QUEUE_PER_ROW x rows); the KV cache holds rows x max_len tokens. `defaults`: what requests
        that leave a field out get (serve's flags); `api_key`: required of every request but the
        health check; `cors_origins`: the browser origins allowed ("*": any; none: CORS off).
        /v1/embeddings answers with the model's own pooling, or `pooling` (mean, cls, last, max): a
        text-generation model that declares none embeds only with it. An embedding model
        (rt.generates False) serves only that. `prompt_cache`: bytes of finished requests' KV kept for
        later prompts that start the same way (None: Runtime.prompt_cache_budget(); 0: none).
        With `open_model(name) -> runtime`, any model a request names is loaded on demand (models.py:
        at most `models_max`, idle ones unloaded after `keep_alive` seconds; `resolve(name)` says which
        file a name means); `rt` (named `model_id`, may be None) and `more` ((name, runtime) pairs) are
        loaded already and kept for `kept` seconds idle (None: for good). Without it, `rt` alone.
        `on_disk() -> [(name, path, bytes)]`: the models a request may name that are not loaded
        (downloaded ones), which /api/tags lists after the loaded ones."""
        self.sock, self.model_id, self.timeouts = sock, model_id, timeouts
        self.rows, self.max_len, self.pooling, self.prompt_cache_bytes = rows, max_len, pooling, prompt_cache
        self.created = int(time.time())
        self.limit = rows + (QUEUE_PER_ROW * rows if queue is None else queue)  # running + waiting
        self.on_demand, self.on_disk = open_model is not None, on_disk
        self.models = Models(lambda name: self.serve_model(open_model(name), name, keep_alive), on_demand=self.on_demand,
                             models_max=models_max, keep_alive=keep_alive, wait_s=timeouts.body,
                             resolve=resolve)
        for name, runtime in ([(model_id, rt)] if rt is not None else []) + list(more):
            self.models.add(self.serve_model(runtime, name, kept if self.on_demand else None))
        first = self.models.loaded()[0] if self.models.loaded() else None  # (the one model: its parts by name)
        self.rt, self.loop = (first.rt, first.loop) if first else (None, None)
        self.embedder = first.embedder if first else None
        self._embedding = ThreadPoolExecutor(1, thread_name_prefix="llmcli-embed")  # one request at a time
        self.defaults, self.api_key, self.cors_origins = defaults, api_key, tuple(cors_origins)
        self.prepare = _Dispatch(self)
        self.response_store = responses_api.Store()  # /v1/responses kept for previous_response_id (bounded)
        self.counts = RequestCounts()
        self._accepting = 0  # requests admitted and not yet in the engine (body, tokenizing); event loop only
        self._durations: deque[float] = deque(maxlen=32)  # seconds recent requests took in a row
        self.http = HttpServer(self.app(), sock, timeouts, on_stop=self._stop)

    def serve_model(self, rt, name: str, keep_alive: float | None) -> Served:
        """What serves `rt` under `name`: its engine loop (generating models), preparer and embedder."""
        loop = EngineLoop(rt.batch_engine(self.rows, self.max_len, self.prompt_cache_bytes)) if rt.generates else None
        try:
            embedder = rt.embedder(self.pooling)
        except NoPoolingError:  # a text-generation model: /v1/embeddings says how to start the server
            embedder = None
        return Served(name, rt, loop, Preparer(rt), embedder, keep_alive,
                      aliases={name, rt.loaded.name, rt.loaded.path.name})

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
        self.models.close()
        self._embedding.shutdown(wait=False, cancel_futures=True)

    def app(self):
        routes = [Route("/", self.running, methods=["GET", "HEAD"]), Route("/models", self.list_models, methods=["GET"]), Route("/models/{name:path}", self.show_model, methods=["GET"]),
                  Route("/health", self.health, methods=["GET"]), Route("/metrics", self.metrics, methods=["GET"]),
                  Route("/chat/completions", self.chat, methods=["POST"]),
                  Route("/completions", self.completion, methods=["POST"]),
                  Route("/embeddings", self.embeddings, methods=["POST"]),
                  Route("/messages", self.messages, methods=["POST"]),
                  Route("/messages/count_tokens", self.count_tokens, methods=["POST"]),
                  Route("/responses", self.responses, methods=["POST"]),
                  Route("/responses/{id}", self.stored_response, methods=["GET", "DELETE"]),
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

    async def list_models(self, request: Request) -> Response:
        """The models loaded now (the one served, without on-demand loading), with their memory."""
        return json_response(200, {"object": "list", "data": [self._card(s) for s in self.models.loaded()]})

    async def show_model(self, request: Request) -> Response:
        name = request.path_params["name"]
        found = [s for s in self.models.loaded() if name == s.name or name in s.aliases]
        if not found:
            return _failure(self.models._not_served(name), request)
        return json_response(200, self._card(found[0]))

    async def health(self, request: Request) -> Response:
        loaded = self.models.loaded()
        if not self.on_demand and loaded:
            stats = loaded[0].loop.stats if loaded[0].loop is not None else {"embeddings_only": True}
            return json_response(200, {"status": "ok", "model": self.model_id, **stats, "max_requests": self.limit})
        models = [{"model": s.name, **(s.loop.stats if s.loop is not None else {"embeddings_only": True})} for s in loaded]
        return json_response(200, {"status": "ok", "models": models, "loads": self.models.loads, "max_requests": self.limit})

    async def metrics(self, request: Request) -> Response:
        loaded = [s for s in self.models.loaded() if s.loop is not None]
        loop = loaded[0].loop if loaded else None  # (the engine's figures: the one model's, or the latest used)
        return Response(prometheus(loop.meter if loop else None, self.counts, loop), 200,
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    def _card(self, served: Served) -> dict:
        """OpenAI's model object, and what llmcli adds: the memory it holds, when it unloads."""
        plan = getattr(served.rt, "plan", None)
        memory = plan.taken_bytes if plan is not None else served.rt.loaded.weights_bytes
        return {"id": served.name, "object": "model", "created": int(served.loaded_at), "owned_by": "llmcli",
                "llmcli": {"file": served.rt.loaded.path.name, "memory_bytes": int(memory),
                           "expires_at": served.expires_at, "busy": served.busy}}

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
            with self._admitted():
                job, reqs, choices = await run_in_threadpool(prepare, await self._read_body(request))
                run = self._submit(reqs, param)
            head = api.head(id_prefix, reqs[0].owner.name)
            if job.stream:
                return EventStream(events(run, job, head, choices, request), run, request, self.timeouts.write)
            await _collected(run, choices, request)
            return json_response(200, response(head, [c.body() for c in choices], [c.last.stats for c in choices]))
        except Exception as e:
            return _failure(e, request)

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API (anthropic_api.py) through the chat endpoint's machinery."""
        try:
            with self._admitted():
                job, reqs, choices = await run_in_threadpool(self._messages_request, await self._read_body(request))
                run = self._submit(reqs, "messages")
            msg_id = anthropic.new_id()
            if job.stream:
                events = self._message_events(run, msg_id, reqs[0], choices[0], request)
                return EventStream(events, run, request, self.timeouts.write, named=anthropic.error_body)
            await _collected(run, choices, request)
            return json_response(200, anthropic.message(msg_id, reqs[0].owner.name, choices[0]))
        except Exception as e:
            return _failure(e, request, anthropic.error_body)

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's token count of a Messages request: its prompt's tokens, as the template makes them."""
        try:
            job, reqs, _ = await run_in_threadpool(self._messages_request, await self._read_body(request), True)
            self.prepare.done(reqs)  # (nothing runs: the model is free again)
            return json_response(200, {"input_tokens": len(reqs[0].prompt)})
        except Exception as e:
            return _failure(e, request, anthropic.error_body)

    def _messages_request(self, data: bytes, counting: bool = False):
        body = _parse(data)
        if counting:
            body = {**body, "max_tokens": body.get("max_tokens", 1), "stream": False}
        job = anthropic.messages_job(body, self.defaults)
        return (job, *self.prepare.chat(job))

    async def _message_events(self, run, msg_id: str, seq, choice, request: Request):
        stream = anthropic.StreamEvents(msg_id, seq.owner.name, len(seq.prompt))
        async for event in _block_events(run, stream, choice, request):
            yield event

    async def responses(self, request: Request) -> Response:
        """OpenAI's Responses API (responses_api.py) through the chat endpoint's machinery."""
        try:
            with self._admitted():
                job, turn, reqs, choices = await run_in_threadpool(self._responses_request, await self._read_body(request))
                run = self._submit(reqs, "input")
            answer = responses_api.Answer(turn, reqs[0].owner.name, self.response_store)
            if job.stream:
                events = self._response_events(run, answer, choices[0], request)
                return EventStream(events, run, request, self.timeouts.write, named=answer.error)
            await _collected(run, choices, request)
            return json_response(200, answer.whole(choices[0]))
        except Exception as e:
            return _failure(e, request)

    async def stored_response(self, request: Request) -> Response:
        """GET a stored response by its id, or DELETE it."""
        try:
            response_id = request.path_params["id"]
            if request.method == "DELETE":
                self.response_store.delete(response_id)
                return json_response(200, {"id": response_id, "object": "response", "deleted": True})
            return json_response(200, self.response_store.response(response_id))
        except Exception as e:
            return _failure(e, request)

    def _responses_request(self, data: bytes):
        job, turn = responses_api.responses_job(_parse(data), self.defaults, self.response_store)
        return (job, turn, *self.prepare.chat(job))

    async def _response_events(self, run, answer, choice, request: Request):
        async for event in _block_events(run, answer, choice, request):
            yield event

    async def embeddings(self, request: Request) -> Response:
        try:
            job, vectors, tokens, name = await self._embed(request)
            return json_response(200, embeddings_api.embeddings_response(name, vectors, tokens, job.base64))
        except Exception as e:
            return _failure(e, request)

    async def _embed(self, request: Request, translate=None):
        """(job, vectors, tokens, the model's name) of an embeddings request; `translate`: another
        API's body -> OpenAI's."""
        with self._admitted():
            job, ids, served = await run_in_threadpool(self._embedding_request, await self._read_body(request), translate)
            try:
                work = asyncio.wrap_future(self._embedding.submit(served.embedder.embed, ids))
                vectors = await unless_gone(request.receive, work)
            finally:
                self.models.release(served)
        tokens = sum(map(len, ids))
        request.state.note = f"{len(ids)} inputs, {tokens} tokens"
        return job, vectors, tokens, served.name

    def _embedding_request(self, data: bytes, translate=None):
        """(job, each input's token ids, the model held: release it once embedded)."""
        body = _parse(data)
        job = embeddings_api.embedding_job(translate(body) if translate else body)
        served = self.models.hold(job.model)
        try:
            return (job, self._embedding_ids(job, served), served)
        except BaseException:
            self.models.release(served)
            raise

    def _embedding_ids(self, job, served: Served) -> list[list[int]]:
        e = served.embedder
        if e is None:
            raise ApiError(400, f"{served.name} is a text-generation model whose files declare no pooling, so this "
                                "server does not embed; start it with --pooling last (or mean) to embed with the "
                                "model's last hidden states", code="model_not_supported")
        if job.dimensions is not None and job.dimensions != e.dimensions:
            raise ApiError(400, f"this model makes {e.dimensions}-dimensional vectors and was not trained to be cut "
                                f"shorter; leave dimensions out or set it to {e.dimensions}", "dimensions")
        vocab, ids = served.rt.loaded.args.vocab_size, []
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
        return ids

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
            with self._admitted():
                job, reqs, choices = await run_in_threadpool(self._ollama_request, await self._read_body(request), kind)
                if job is None:  # no prompt: ollama's way to load a model, or with keep_alive 0 to unload it
                    return json_response(200, ollama.loaded(kind, *reqs))
                run = self._submit(reqs, "messages" if job.messages is not None else "prompt")
            answer = ollama.Answer(kind, reqs[0].owner.name, started)
            if job.stream:
                lines = self._ollama_lines(run, answer, choices[0], request)
                return EventStream(lines, run, request, self.timeouts.write, lines=ollama.error_body)
            await _collected(run, choices, request)
            return json_response(200, answer.whole(choices[0]))
        except Exception as e:
            return _failure(e, request, ollama.error_body)

    def _ollama_request(self, data: bytes, kind: str):
        """(job, sequences, choices), or (None, the model's name, None) for a load request."""
        body = _parse(data)
        job = (ollama.chat_job if kind == "chat" else ollama.generate_job)(body, self.defaults)
        keep = ollama.keep_alive(body)
        if job is None:
            name = ollama.model_name(body)
            if keep == 0:
                return None, (self.models.unload_named(name) or name, "unload"), None
            served = self.models.hold(name)  # (loaded on demand, as any request's)
            self.models.release(served, keep)
            return None, (served.name, "load"), None
        reqs, choices = self.prepare.chat(job) if job.messages is not None else self.prepare.completion(job)
        try:
            ollama.check_context(body, self._context(reqs[0].owner))
        except BaseException:
            self.prepare.done(reqs)
            raise
        if keep != "same":
            self.models.keep(reqs[0].owner, keep)
        return job, reqs, choices

    async def _ollama_lines(self, run, answer, choice, request: Request):
        async for _, chunk in run:
            for line in answer.push(choice, chunk):
                yield line
        request.state.note = _note([choice])

    async def ollama_embed(self, request: Request) -> Response:
        started = time.monotonic()
        try:
            _, vectors, tokens, name = await self._embed(request, ollama.embed_body)
            return json_response(200, ollama.embed_response(name, vectors, tokens, started))
        except Exception as e:
            return _failure(e, request, ollama.error_body)

    async def ollama_embeddings(self, request: Request) -> Response:
        """The older endpoint: one prompt, one embedding."""
        try:
            _, vectors, _, _ = await self._embed(request, ollama.embeddings_body)
            return json_response(200, ollama.embedding_response(vectors[0]))
        except Exception as e:
            return _failure(e, request, ollama.error_body)

    async def ollama_tags(self, request: Request) -> Response:
        """The models loaded (the one served, without on-demand loading), then, on demand, those on
        disk a request may load (read from the file system: in a worker thread)."""
        loaded = self.models.loaded()
        tags = [self._described(s).tag() for s in loaded]
        if self.on_demand and self.on_disk is not None:
            names = {n for s in loaded for n in (s.name, *s.aliases)}
            found = await run_in_threadpool(self.on_disk)
            tags += [ollama.stored_tag(name, path, size) for name, path, size in found if name not in names]
        return json_response(200, {"models": tags})

    async def ollama_ps(self, request: Request) -> Response:
        return json_response(200, {"models": [self._described(s).process() for s in self.models.loaded()]})

    async def ollama_show(self, request: Request) -> Response:
        try:
            body = _parse(await self._read_body(request))
            name = ollama.model_name(body) or ollama.model_name({"model": body.get("name")})  # (older clients: name)
            with self.models.use(name) as served:
                return json_response(200, self._described(served).show())
        except Exception as e:
            return _failure(e, request, ollama.error_body)

    async def running(self, request: Request) -> Response:
        """GET / as ollama answers it: tools written for ollama ask it before anything else."""
        return Response("Ollama is running", media_type="text/plain; charset=utf-8")

    async def ollama_version(self, request: Request) -> Response:
        return json_response(200, {"version": __version__})

    def _described(self, served: Served) -> ollama.Described:
        memory = self._card(served)["llmcli"]["memory_bytes"]
        return ollama.describe(served.rt, served.name, self._context(served), self.defaults,
                               served.embedder is not None, memory, served.expires_at)

    @staticmethod
    def _context(served: Served) -> int:
        """Tokens a request may hold, prompt and answer: a row of the model's engine."""
        return served.loop.engine.max_len if served.loop is not None else served.rt.ctx_size

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
        busy = self._accepting + sum(s.loop.in_flight for s in self.models.loaded() if s.loop is not None)
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
        if not self._durations:
            return 1
        return max(1, min(60, math.ceil(statistics.median(self._durations) / self.rows)))

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
        return (job, *self.prepare.chat(job))

    def _completion_request(self, data: bytes):
        job = api.completion_job(_parse(data), self.defaults)
        return (job, *self.prepare.completion(job))

    def _submit(self, reqs: list, param: str) -> EngineRun:
        """The prepared sequences into their model's engine (which then counts them as in flight)."""
        try:
            return EngineRun(reqs[0].owner.loop, reqs, param, self._durations.append)
        finally:
            self.prepare.done(reqs)


async def _collected(run, choices: list, request: Request) -> None:
    """Every choice's chunks, waited for while the client stays (the answer then goes whole)."""
    try:
        await unless_gone(request.receive, collect(run, choices))
    finally:
        run.close()
    request.state.note = _note(choices)


async def _block_events(run, blocks, choice, request: Request):
    """A streamed choice as an API of content blocks tells it (Anthropic's StreamEvents, the Responses
    API's answer): start(), then thinking(text), text(text) and call(call) as the chunks come, and
    finish(choice) at the end."""
    for event in blocks.start():
        yield event
    async for _, chunk in run:
        sent = len(choice.calls)
        for delta, _ in choice.push(chunk):
            for event in blocks.thinking(delta["reasoning_content"]) if delta.get("reasoning_content") else ():
                yield event
            for event in blocks.text(delta["content"]) if delta.get("content") else ():
                yield event
        for call in choice.calls[sent:]:
            for event in blocks.call(call):
                yield event
        if chunk.finish_reason is not None:
            for event in blocks.finish(choice):
                yield event
    request.state.note = _note([choice])


class _Dispatch:
    """Preparer's face for the server's endpoints, over every model it serves: a request is prepared
    by the runtime of the model it names (loaded if need be), which it holds until its sequences are
    in the engine (Server._submit calls done())."""

    def __init__(self, server: "Server"):
        self.server = server

    def chat(self, job) -> tuple[list, list]:
        return self._by_model(job, lambda p: p.chat(job))

    def completion(self, job) -> tuple[list, list]:
        return self._by_model(job, lambda p: p.completion(job))

    def done(self, reqs: list) -> None:
        self.server.models.release(reqs[0].owner)

    def _by_model(self, job, prepare) -> tuple[list, list]:
        served = self.server.models.hold(job.model)
        try:
            if served.loop is None:
                raise ApiError(400, f"{served.name} is an embedding model: this server answers /v1/embeddings with "
                                    "it, not chat or completions", "model", "model_not_supported")
            seqs, choices = prepare(served.prepare)
        except BaseException:
            self.server.models.release(served)
            raise
        for seq in seqs:
            seq.owner = served
        return seqs, choices


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
