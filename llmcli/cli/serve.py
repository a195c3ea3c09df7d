"""`llmcli serve MODEL`: the OpenAI-compatible server (serve/http.py) on 127.0.0.1, one line per
request on stderr with -v, stopped by Ctrl-C or SIGTERM."""

from __future__ import annotations

import ipaddress
import logging
import signal
import sys
from typing import Annotated, Optional

import typer

from ..errors import InvalidParameterError
from .options import (CacheRam, Device, Dtype, ModelArg, Offline, Quant, RegistryFile, Threads, cache_ram_bytes,
                      model_flags, report_plan, stderr_console)
from .signals import Terminated

DEFAULT_CTX = 4096  # per request when -c is not given: the KV cache holds rows x this many tokens
DEFAULT_TIMEOUT = 30.0  # seconds; llama-server's --timeout is 600, which lets a slow client hold a connection long
QUEUE_PER_ROW = 8  # serve/http.py's default (not imported here: the help text is built before the server loads)
POOLINGS = ("mean", "cls", "last", "max")


def serve(
    model: ModelArg,
    host: Annotated[str, typer.Option("--host", help="Address to listen on. The server has no authentication: "
                                      "anything that can reach it can use it, so keep 127.0.0.1 unless the network is yours.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free port).")] = 8080,
    rows: Annotated[int, typer.Option("--rows", help="Requests decoded together (continuous batching); more wait for a free row.")] = 8,
    queue: Annotated[Optional[int], typer.Option("--queue", help=f"Requests that may wait for a free row (default: {QUEUE_PER_ROW} x --rows). One more than --rows + --queue gets 503 with Retry-After.", show_default=False)] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a client has to send a request's headers (also how long an idle keep-alive connection stays open) and then its body, and to take each part of an answer; a slower one gets 408 or is closed.")] = DEFAULT_TIMEOUT,
    ctx_size: Annotated[Optional[int], typer.Option("--ctx-size", "-c", help=f"Tokens per request, prompt and answer (default: the model's context, at most {DEFAULT_CTX}). The KV cache holds --rows x this many tokens.", show_default=False)] = None,
    device: Device = "auto", dtype: Dtype = "auto", threads: Threads = None, quant: Quant = None,
    registry: RegistryFile = None, offline: Offline = False, cache_ram: CacheRam = None,
    pooling: Annotated[Optional[str], typer.Option("--pooling", help="How /v1/embeddings pools: mean | cls | last | max. An embedding model uses its own unless given; a text-generation model embeds only with it (e.g. last, as llama-server's --embeddings --pooling last).", show_default=False)] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="One line per request on stderr, and the memory plan.")] = False,
):
    """Serve MODEL over HTTP with OpenAI's API (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models)."""
    from ..runtime.runtime import open_model
    from ..serve.http import Server
    from ..serve.listener import Timeouts, bind
    from .progress import download_progress

    if not 1 <= rows <= 256:
        raise InvalidParameterError(f"--rows must be from 1 to 256, got {rows}")
    if queue is not None and not 0 <= queue <= 100_000:
        raise InvalidParameterError(f"--queue must be from 0 to 100000, got {queue}")
    if not 0.1 <= timeout <= 3600:  # also refuses nan
        raise InvalidParameterError(f"--timeout must be from 0.1 to 3600 seconds, got {timeout}")
    if not 0 <= port <= 65535:
        raise InvalidParameterError(f"--port must be from 0 to 65535, got {port}")
    if ctx_size is not None and ctx_size < 2:
        raise InvalidParameterError(f"--ctx-size must be at least 2, got {ctx_size}")
    prompt_cache = cache_ram_bytes(cache_ram)
    if pooling is not None and pooling not in POOLINGS:
        raise InvalidParameterError(f"--pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    err = stderr_console()
    if not _loopback(host):
        print(f"warning: --host {host} lets other machines reach this server, which has no authentication",
              file=sys.stderr)
    listener = bind(host, port)  # a busy port fails now, before the model loads
    try:
        with download_progress(err) as progress:
            rt = open_model(model_flags(model, device=device, dtype=dtype, threads=threads, ctx_size=ctx_size,
                                        quant=quant, registry=registry, offline=offline, rows=rows,
                                        ctx_cap=DEFAULT_CTX, allow_encoder=True), progress)
        report_plan(err, rt, verbose)
        server = Server(rt, listener, model_id=model, rows=rows, queue=queue,
                        timeouts=Timeouts(head=timeout, body=timeout, write=timeout), pooling=pooling,
                        prompt_cache=prompt_cache)
    except BaseException:
        listener.close()
        raise
    _log_to_stderr(verbose)
    if verbose:
        err.print(_details(rt, server), markup=False, style="dim")
    try:  # a signal as the banner is written stops the server as cleanly as one later
        err.print(f"serving {model} on {server.url} ({_capacity(server)})", markup=False)
        server.serve_forever()
    except (KeyboardInterrupt, Terminated) as e:  # the usual way to stop a server: exit 0
        why = "Ctrl-C" if isinstance(e, KeyboardInterrupt) else signal.Signals(e.signum).name
        server.close()
        err.print(f"stopped ({why})", markup=False)


def _capacity(server) -> str:
    """What the banner says the server does: rows of tokens, and embeddings if it makes them."""
    e = server.embedder
    embeds = f"embeddings: {e.dimensions} dimensions, {e.pooling.mode} pooling" if e is not None else ""
    if server.loop is None:
        return embeds
    engine = server.loop.engine
    return f"{engine.rows} rows of {engine.max_len} tokens" + (f"; {embeds}" if embeds else "")


def _details(rt, server) -> str:
    """The -v line under the banner: placement, cache and queue, pooling."""
    parts = [rt.placement.reason]
    if server.loop is not None:
        engine = server.loop.engine
        parts.append(f"KV cache {engine.rows} rows x {engine.max_len} tokens, {engine.cache.nbytes / 2**20:.0f} MiB")
        kept = engine.prompt_cache.max_bytes if engine.prompt_cache is not None else 0
        parts.append(f"prompt cache up to {kept / 2**20:.0f} MiB" if kept else "no prompt cache")
    parts.append(f"up to {server.limit - (server.loop.engine.rows if server.loop else 0)} more requests wait"
                 + (" for a row" if server.loop else ""))
    if server.embedder is not None:
        parts.append(f"/v1/embeddings: {server.embedder.pooling.describe()}, at most {server.embedder.max_tokens} "
                     "tokens an input")
    return "; ".join(parts)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def _log_to_stderr(verbose: bool) -> None:
    """serve/ logs through `logging`: requests at INFO (shown with -v), failures at ERROR, one line
    each (no traceback). uvicorn's own lines (startup, shutdown) are not ours to print, only its
    errors; its protocol's warnings (a malformed request: http.py logs the 400) are not shown."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    for name, level in (("llmcli.server", logging.INFO if verbose else logging.WARNING), ("uvicorn", logging.ERROR),
                        ("asyncio", logging.ERROR)):  # e.g. accept() out of file descriptors: one line, no traceback
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False
    logging.getLogger("llmcli.server.uvicorn").setLevel(logging.ERROR)  # to llmcli.server's handler


class _OneLine(logging.Formatter):
    def format(self, record):
        line = record.getMessage().split("\n", 1)[0]  # asyncio adds context lines: one line per record
        return f"error: {line}" if record.levelno >= logging.ERROR else line
