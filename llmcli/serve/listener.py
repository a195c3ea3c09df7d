"""The HTTP/1.1 side of `llmcli serve`: a socket bound at once, and uvicorn (its h11 protocol)
serving an ASGI app on it with the limits a server open to any client needs.

    sock = bind("127.0.0.1", 8080)        # ServeError now if the port is taken (before a model loads)
    http = HttpServer(app, sock, Timeouts(), on_stop=engine_loop.close)
    http.run()                            # this thread, until SIGINT/SIGTERM (re-raised after a clean stop)
    http.start(); ...; http.stop()        # or from a thread (tests)

What a client cannot do here, whatever it sends:
- hold a connection without sending a request: its request line and headers must arrive within
  `Timeouts.head` of the connection opening or of its previous answer (an idle keep-alive
  connection closes then too); a head left half-sent gets 408 (slowloris);
- send what h11 cannot parse (a garbage request line, a negative Content-Length, broken chunks,
  headers over 64 KiB): 400 in OpenAI's error shape, and the connection closes;
- queue connections that are reset: the listen backlog is BACKLOG, not the standard library's 5.
The body's size and time limits, and a stalled reader, are the app's (admission.py, asgi.py).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import ServeError
from .openai_api import ApiError

log = logging.getLogger("llmcli.server")

BACKLOG = 2048  # connections the kernel holds before accept(): uvicorn's default
MAX_HEAD = 64 << 10  # bytes of request line and headers
STOP_S = 5  # on a stop, requests still writing after the engine stopped get this long, then are cut


@dataclass(frozen=True)
class Timeouts:
    """Seconds a client may take (the CLI's --timeout sets all three)."""

    head: float = 30.0  # to send a request line and headers, from the connection's opening or its last answer
    body: float = 30.0  # to send the body, from the end of the headers
    write: float = 30.0  # to take one chunk of the answer when it stopped reading (its buffers are full)


def bind(host: str = "127.0.0.1", port: int = 8080) -> socket.socket:
    """A socket listening on host:port (port 0: a free one); ServeError when that cannot be done."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=BACKLOG)  # SO_REUSEADDR on POSIX
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ServeError(f"port {port} is in use; pass --port") from None
        raise ServeError(f"cannot listen on {host}:{port} ({e.strerror or e}); pass another --host or --port") from None


class HttpServer:
    def __init__(self, app, sock: socket.socket, timeouts: Timeouts, on_stop: Callable[[], None]):
        """Serve the ASGI `app` on `sock`; `on_stop` runs (in a worker thread) when a stop begins,
        before waiting for the requests in flight, so that it can end them (the engine loop's close)."""
        self.sock = sock
        config = uvicorn.Config(
            app, http=partial(_Protocol, timeouts=timeouts), interface="asgi3", loop="asyncio", ws="none",
            lifespan="off", log_config=None, access_log=False, proxy_headers=False, server_header=False,
            headers=[("server", "llmcli")], backlog=BACKLOG, h11_max_incomplete_event_size=MAX_HEAD,
            timeout_keep_alive=int(timeouts.head) + 1,  # our head deadline closes idle connections first
            timeout_graceful_shutdown=STOP_S)
        self._uvicorn = _Uvicorn(config, on_stop)
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        self._uvicorn.run(sockets=[self.sock])

    def start(self, wait_s: float = 30.0) -> None:
        self._thread = threading.Thread(target=self.run, name="llmcli-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + wait_s
        while not self._uvicorn.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self, wait_s: float = 15.0) -> None:
        """From another thread: stop serving, end what is in flight, wait for it."""
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(wait_s)


class _Uvicorn(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]):
        super().__init__(config)
        self.on_stop = on_stop

    async def shutdown(self, sockets=None) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.on_stop)  # in-flight requests end now
        await super().shutdown(sockets)


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline for each request's head and 400s in OpenAI's shape.

    Each ASGI scope gets "llmcli.connection" (this object), through which the app aborts a client
    that stopped reading (abort())."""

    def __init__(self, config, server_state, app_state, _loop=None, *, timeouts: Timeouts):
        super().__init__(config, server_state, app_state, _loop)
        self.timeouts = timeouts
        self.logger = logging.getLogger("llmcli.server.uvicorn")  # the CLI shows its errors, not its warnings
        self._deadline: asyncio.TimerHandle | None = None
        self._awaited = None  # the request cycle current when the deadline was set: a new one means a head came
        app = self.app

        async def with_connection(scope, receive, send):
            scope["llmcli.connection"] = self
            await app(scope, receive, send)

        self.app = with_connection

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._expect_head()

    def on_response_complete(self) -> None:
        self._expect_head()  # first: super() may start a pipelined request's cycle at once
        super().on_response_complete()

    def connection_lost(self, exc) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def abort(self) -> None:
        """Close now, dropping what is buffered for a client that does not read it. The request's
        cycle counts as disconnected at once, so that uvicorn neither writes nor complains more."""
        if self.cycle is not None:
            self.cycle.disconnected = True
        self.transport.abort()

    def _expect_head(self) -> None:
        self._cancel_deadline()
        self._awaited = self.cycle
        self._deadline = self.loop.call_later(self.timeouts.head, self._head_overdue)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_overdue(self) -> None:
        self._deadline = None
        if self.cycle is not self._awaited or self.transport.is_closing():
            return  # a request arrived (its body and answer have their own limits)
        if self.conn.trailing_data[0]:  # part of a head came, and no more: say why before closing
            why = f"the request line and headers did not arrive within {self.timeouts.head:g} s"
            self.transport.write(_raw_answer(408, why, "request_timeout"))
            log.info("- - 408 %.2f s (%s)", self.timeouts.head, why)
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """h11 could not parse the request (uvicorn's answer is plain text)."""
        why = ("the request is not HTTP/1.1 that this server can read: its request line, a header, "
               "Content-Length or chunked framing")
        log.info("- - 400 0.00 s (malformed request)")
        self._cancel_deadline()
        try:
            self.transport.write(_raw_answer(400, why))
        finally:
            self.transport.close()


def _raw_answer(status: int, message: str, code: str | None = None) -> bytes:
    """A whole JSON error answer that closes the connection, as bytes: written past h11, whose state
    may not allow a response (no request parsed yet, or a protocol error)."""
    body = json.dumps(ApiError(status, message, code=code).body()).encode()
    return (b"HTTP/1.1 %d %s\r\nServer: llmcli\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (status, _REASONS[status], len(body), body))


_REASONS = {400: b"Bad Request", 408: b"Request Timeout"}
