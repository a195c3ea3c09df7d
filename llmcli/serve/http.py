"""`llmcli serve`: an OpenAI-compatible HTTP server over one model, on the standard library.

    GET  /v1/models, /v1/models/{id}, /health
    POST /v1/chat/completions, /v1/completions      (JSON, or server-sent events with "stream")

A thread per connection (ThreadingHTTPServer) parses the request (openai_api.py), tokenizes it,
submits a batched.Request and waits on the request's queue, writing JSON at the end or one SSE
event per chunk; one engine thread (engine_loop.py) decodes every running request together.
A client that goes away (a write fails, or its socket reads EOF while it waits) cancels its
request, which frees its row at the next step. HTTP/1.1 with keep-alive; streams are chunked.

    server = Server(runtime, bind("127.0.0.1", 8080), model_id="smollm2")
    server.serve_forever()        # or start() in a thread; close() stops both
"""

from __future__ import annotations

import errno
import json
import logging
import queue
import select
import socket
import socketserver
import sys
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from ..decode.batched import Request
from ..decode.constrained import GrammarCompiler, from_json_schema
from ..decode.generate import Logprobs
from ..errors import GrammarError, LlmcliError, PromptTooLongError, ServeError
from . import openai_api as api
from .engine_loop import EngineLoop
from .openai_api import ApiError

log = logging.getLogger("llmcli.server")

MAX_BODY = 8 << 20  # bytes; a larger request body is refused with 413
POLL_S = 0.25  # how often a handler waiting for tokens checks that its client is still there
IDLE_S = 300  # an idle keep-alive connection (or a stalled client) is closed after this long


class ClientGone(Exception):
    """The client closed its connection while its request was running."""


class Listener(ThreadingHTTPServer):
    """The listening socket, bound at once (so a busy port fails before a model loads)."""
    daemon_threads = True
    block_on_close = False
    app: "Server | None" = None

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)  # not HTTPServer's: its getfqdn() may wait on DNS
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):  # a client going away is no error
            log.error("error serving %s: %s", client_address[0], exc, exc_info=log.isEnabledFor(logging.DEBUG))


class _Listener6(Listener):
    address_family = socket.AF_INET6


def bind(host: str = "127.0.0.1", port: int = 8080) -> Listener:
    """Listen on host:port (port 0: a free one); ServeError when that cannot be done."""
    cls = _Listener6 if ":" in host else Listener
    try:
        return cls((host, port), _Handler)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ServeError(f"port {port} is in use; pass --port") from None
        raise ServeError(f"cannot listen on {host}:{port} ({e.strerror or e}); pass another --host or --port") from None


class Server:
    def __init__(self, rt, listener: Listener, *, model_id: str, rows: int = 8, max_len: int | None = None):
        """`rt` a runtime.Runtime; `rows` requests decoded together, each up to `max_len` tokens
        (default: rt.ctx_size); the KV cache holds rows x max_len tokens."""
        self.rt, self.listener, self.model_id = rt, listener, model_id
        self.names = {model_id, rt.loaded.name, rt.loaded.path.name, ""}  # what a request's "model" may say
        self.created = int(time.time())
        self.loop = EngineLoop(rt.batch_engine(rows, max_len))
        self._compiler = None
        self._compiler_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        listener.app = self

    @property
    def url(self) -> str:
        host, port = self.listener.server_address[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    def serve_forever(self) -> None:
        self._thread = self._thread or threading.current_thread()
        self.listener.serve_forever(poll_interval=0.5)

    def start(self) -> "Server":
        """Serve from a background thread (tests, embedding)."""
        self._thread = threading.Thread(target=self.listener.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="llmcli-http", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:  # shutdown() waits for a serve_forever() that has run
            self.listener.shutdown()
        self.loop.close()
        self.listener.server_close()

    # ------------------------------------------------------------------ endpoints

    def routes(self) -> dict:
        return {"/models": {"GET": self.models}, "/health": {"GET": self.health},
                "/chat/completions": {"POST": self.chat}, "/completions": {"POST": self.completion}}

    def models(self, h: "_Handler", name: str | None = None) -> None:
        card = {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "llmcli"}
        if name is None:
            h.send_json(200, {"object": "list", "data": [card]})
        else:
            self._check_model(name)
            h.send_json(200, card)

    def health(self, h: "_Handler") -> None:
        h.send_json(200, {"status": "ok", "model": self.model_id, **self.loop.stats})

    def chat(self, h: "_Handler") -> None:
        job = api.chat_job(h.read_json())
        self._check_model(job.model)
        req = self._request(job, self.rt.prompt_ids(job.messages), "messages")
        head = api.head("chatcmpl", self.model_id)
        cursor = api.LogprobCursor(req.logprobs, self.rt.loaded.tokenizer) if req.logprobs is not None else None
        with self._running(req, h, "messages") as chunks:
            if not job.stream:
                pieces, entries = [], []
                for chunk in chunks:
                    pieces.append(chunk.text)
                    entries += cursor.chat(chunk) if cursor else []
                h.send_json(200, api.chat_response(head, "".join(pieces), chunk.finish_reason, chunk.stats,
                                                   entries if cursor else None))
            else:
                h.start_stream()
                h.event(api.chat_chunk(head, {"role": "assistant", "content": ""}, with_usage=job.include_usage))
                entries = []
                for chunk in chunks:
                    entries += cursor.chat(chunk) if cursor else []
                    if chunk.text or (chunk.finish_reason and entries):  # text held back (a stop's prefix) waits
                        h.event(api.chat_chunk(head, {"content": chunk.text}, logprobs=entries if cursor else None,
                                               with_usage=job.include_usage))
                        entries = []
                h.event(api.chat_chunk(head, {}, chunk.finish_reason, with_usage=job.include_usage))
                if job.include_usage:
                    h.event(api.chat_chunk(head, None, stats=chunk.stats, with_usage=True))
                h.end_stream()
        h.note = f"{chunk.stats.prompt_tokens}+{chunk.stats.completion_tokens} tokens, {chunk.finish_reason}"

    def completion(self, h: "_Handler") -> None:
        job = api.completion_job(h.read_json())
        self._check_model(job.model)
        tok = self.rt.loaded.tokenizer
        ids = tok.encode(job.prompt) if isinstance(job.prompt, str) else job.prompt
        req = self._request(job, ids, "prompt")
        head = api.head("cmpl", self.model_id)
        cursor = api.LogprobCursor(req.logprobs, tok) if req.logprobs is not None else None
        offset = len(job.prompt if isinstance(job.prompt, str) else tok.decode(ids))  # text_offset counts from here
        with self._running(req, h, "prompt") as chunks:
            if not job.stream:
                pieces, parts = [], []
                for chunk in chunks:
                    if cursor:
                        parts.append(cursor.legacy(chunk, offset))
                    pieces.append(chunk.text)
                    offset += len(chunk.text)
                h.send_json(200, api.completion_response(head, "".join(pieces), chunk.finish_reason, chunk.stats,
                                                         api.merge_legacy(parts) if cursor else None))
            else:
                h.start_stream()
                sent = 0  # characters streamed so far
                for chunk in chunks:
                    lp = cursor.legacy(chunk, offset + sent) if cursor else None
                    if chunk.text or chunk.finish_reason or (lp and lp["tokens"]):
                        h.event(api.completion_chunk(head, chunk.text, chunk.finish_reason, lp,
                                                     with_usage=job.include_usage))
                    sent += len(chunk.text)
                if job.include_usage:
                    h.event(api.completion_chunk(head, None, stats=chunk.stats, with_usage=True))
                h.end_stream()
        h.note = f"{chunk.stats.prompt_tokens}+{chunk.stats.completion_tokens} tokens, {chunk.finish_reason}"

    # ------------------------------------------------------------------ helpers

    def _check_model(self, name: str | None) -> None:
        if name is not None and name not in self.names:
            raise ApiError(404, f"the model {name!r} is not served here; this server serves {self.model_id!r} "
                                "(see GET /v1/models)", "model", "model_not_found")

    def _request(self, job: api.Job, ids: list[int], param: str) -> Request:
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
        return Request(ids, job.params, job.max_tokens, job.stop, constraint, recorder)

    def compiler(self):
        """The grammar compiler for this model's tokenizer, built on first use (about a second)."""
        with self._compiler_lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(self.rt.loaded.tokenizer)
            return self._compiler

    @contextmanager
    def _running(self, req: Request, h: "_Handler", param: str):
        """Submit `req`; yields its chunks as they come. Leaving early (an error, a client gone)
        cancels it."""
        try:
            self.loop.submit(req)
        except PromptTooLongError as e:
            raise ApiError(400, str(e), param, "context_length_exceeded") from None
        done = False

        def chunks():
            nonlocal done
            checked = time.monotonic()
            while True:
                try:
                    item = req.tag.get(timeout=POLL_S)
                except queue.Empty:
                    item = None
                if time.monotonic() - checked >= POLL_S:  # also while tokens flow: a quiet client may be gone
                    checked = time.monotonic()
                    if h.client_gone():
                        raise ClientGone
                if item is None:
                    continue
                if isinstance(item, ApiError):
                    done = True
                    raise item
                done = item.finish_reason is not None
                yield item
                if done:
                    return

        try:
            yield chunks()
        finally:
            if not done:
                self.loop.cancel(req)


@lru_cache(maxsize=64)
def _grammar(schema_text: str):
    """A response_format schema, checked and compiled once per distinct schema."""
    return from_json_schema(schema_text, "response_format's schema")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; streams use chunked transfer encoding
    server_version = "llmcli"
    timeout = IDLE_S
    server: Listener

    def do_GET(self):
        self._route()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

    def _route(self) -> None:
        t0, self.note, self.status, self.streaming, self.body_read = time.perf_counter(), "", 0, False, False
        app = self.server.app
        path = unquote(urlsplit(self.path).path).rstrip("/")
        path = path[3:] if path.startswith("/v1/") else path
        try:
            if path.startswith("/models/") and self.command == "GET":
                app.models(self, path[len("/models/"):])
                return
            methods = app.routes().get(path)
            if methods is None:
                raise ApiError(404, f"no such endpoint: {self.command} {self.path}", code="not_found")
            if self.command not in methods:
                raise ApiError(405, f"{self.path} takes {', '.join(methods)}, not {self.command}",
                               code="method_not_allowed")
            methods[self.command](self)
        except (ClientGone, ConnectionError, TimeoutError):
            self.close_connection = True
            self.note = "client went away"
        except ApiError as e:
            self.fail(e)
        except LlmcliError as e:  # a chat template that refuses the messages, a tokenizer grammars cannot use
            self.fail(ApiError(400, str(e)))
        except Exception as e:
            log.error("%s %s failed: %s", self.command, self.path, e, exc_info=log.isEnabledFor(logging.DEBUG))
            self.fail(ApiError(500, f"internal error: {e}"))
        finally:
            log.info("%s %s %s %.2f s%s%s", self.command, self.path, self.status or "-", time.perf_counter() - t0,
                     " stream" if self.streaming else "", f" ({self.note})" if self.note else "")

    def fail(self, e: ApiError) -> None:
        self.note = self.note or e.message
        try:
            if self.streaming:  # headers are out: the error goes as an event (the openai client raises it)
                self.event(e.body())
                self.end_stream()
            else:
                self.send_json(e.status, e.body(), {"Allow": "GET, POST"} if e.status == 405 else {})
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    # ------------------------------------------------------------------ reading and writing

    def read_json(self) -> dict:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise ApiError(411, "send the body with a Content-Length")
        try:
            n = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise ApiError(400, "Content-Length is not a number") from None
        if n > MAX_BODY:
            raise ApiError(413, f"the request body is {n} bytes; the limit is {MAX_BODY}", code="request_too_large")
        raw = self.rfile.read(n)
        self.body_read = True
        if not raw:
            raise ApiError(400, "the request has no body; send a JSON object")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, f"the body must be a JSON object, got {type(body).__name__}")
        return body

    def send_json(self, status: int, obj: dict, headers: dict = {}) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        if self.command == "POST" and not getattr(self, "body_read", False):  # the body is unread: this connection cannot go on
            self.close_connection = True
        self.status = status
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def start_stream(self) -> None:
        self.status, self.streaming = 200, True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def event(self, obj) -> None:
        """One SSE event (`data: ...` and a blank line) as one HTTP chunk."""
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj, ensure_ascii=False).encode("utf-8")) + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        self.event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def client_gone(self) -> bool:
        """Whether the client has closed its end: the socket reads EOF (a readable socket with data
        is a client that is still there)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def send_error(self, code, message=None, explain=None):
        """http.server's own errors (a malformed request line, an unknown method) in OpenAI's shape."""
        self.close_connection = True
        self.status = code
        try:
            self.send_json(code, ApiError(code, message or explain or "bad request").body())
        except (ConnectionError, TimeoutError):
            pass

    def log_message(self, format, *args):  # http.server writes to stderr; requests are logged in _route
        pass
