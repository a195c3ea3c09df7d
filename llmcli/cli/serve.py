"""`llmcli serve MODEL`: the OpenAI-compatible server (serve/http.py) on 127.0.0.1, one line per
request on stderr with -v, stopped by Ctrl-C or SIGTERM. Sampling flags, --system, --json-schema,
--grammar and -n set what requests that leave those out get; --api-key and --cors say who may
use it."""

from __future__ import annotations

import ipaddress
import logging
import re
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import InvalidParameterError
from .options import (CacheRam, ChatTemplateFile, Device, Dtype, Offline, Quant, RegistryFile, Threads,
                      cache_ram_bytes, check_text_options, check_thinks, model_flags, read_chat_template,
                      read_grammar, report_plan, stderr_console)
from .signals import Terminated

DEFAULT_PORT = 8080
OLLAMA_PORT = 11434  # ollama's: `serve --ollama` listens there, where ollama's tools look for it
DEFAULT_CTX = 4096  # per request when -c is not given: the KV cache holds rows x this many tokens
DEFAULT_TIMEOUT = 30.0  # seconds; llama-server's --timeout is 600, which lets a slow client hold a connection long
QUEUE_PER_ROW = 8  # serve/http.py's default (not imported here: the help text is built before the server loads)
POOLINGS = ("mean", "cls", "last", "max")
ORIGIN = re.compile(r"https?://[^/\s:]+(:[0-9]{1,5})?")  # a browser origin: scheme, host, port; no path


def _default(flag: str, kind, what: str):
    """A flag that sets a request field's default (run's spelling, OpenAI's default when absent)."""
    return Annotated[Optional[kind], typer.Option(flag, help=f"Default {what} for requests that send none.",
                                                  show_default=False, rich_help_panel="Request defaults")]


Temp = _default("--temp", float, "temperature (OpenAI's: 1)")
TopK = _default("--top-k", int, "top_k (0: off)")
TopP = _default("--top-p", float, "top_p (OpenAI's: 1)")
MinP = _default("--min-p", float, "min_p (0: off)")
RepeatPenalty = _default("--repeat-penalty", float, "repeat_penalty (1: off)")
RepeatLastN = _default("--repeat-last-n", int, "repeat_last_n (64)")
PresencePenalty = _default("--presence-penalty", float, "presence_penalty (0)")
FrequencyPenalty = _default("--frequency-penalty", float, "frequency_penalty (0)")
Seed = Annotated[Optional[int], typer.Option("--seed", "-s", help="Default seed for requests that send none (choice i of n uses seed + i).", show_default=False, rich_help_panel="Request defaults")]
MaxTokens = Annotated[Optional[int], typer.Option("--max-tokens", "-n", help="Default max_tokens for requests that send none (else chat: until the context is full; completions: 16).", show_default=False, rich_help_panel="Request defaults")]
System = Annotated[Optional[str], typer.Option("--system", help="A system prompt for chat requests that have no system message.", show_default=False, rich_help_panel="Request defaults")]
ApiKey = Annotated[Optional[str], typer.Option("--api-key", envvar="LLMCLI_API_KEY", help="Require Authorization: Bearer KEY of every request but /health (the openai client sends its api_key so); 401 otherwise. The environment variable keeps the key out of the process list.", show_default=False)]
Cors = Annotated[Optional[list[str]], typer.Option("--cors", help="Let web pages from this origin (https://example.org, repeatable, or * for any) call the server from a browser; off by default.", show_default=False)]


def serve(
    models: Annotated[Optional[list[str]], typer.Argument(help="The model to serve (as for `llmcli run`). None: any model a request names, loaded on demand; several: these loaded now, any other on demand.", show_default=False)] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on. The server has no authentication: "
                                      "anything that can reach it can use it, so keep 127.0.0.1 unless the network is yours.")] = "127.0.0.1",
    port: Annotated[Optional[int], typer.Option("--port", help=f"Port to listen on (default {DEFAULT_PORT}; {OLLAMA_PORT} with --ollama; 0: any free port).", show_default=False)] = None,
    ollama: Annotated[bool, typer.Option("--ollama", help=f"Listen on ollama's port, {OLLAMA_PORT}, unless --port says otherwise, for tools that look for ollama there. ollama's API (/api/chat, /api/generate, /api/tags, ...) is served on any port.")] = False,
    rows: Annotated[int, typer.Option("--rows", help="Requests decoded together (continuous batching); more wait for a free row.")] = 8,
    queue: Annotated[Optional[int], typer.Option("--queue", help=f"Requests that may wait for a free row (default: {QUEUE_PER_ROW} x --rows). One more than --rows + --queue gets 503 with Retry-After.", show_default=False)] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a client has to send a request's headers (also how long an idle keep-alive connection stays open) and then its body, and to take each part of an answer; a slower one gets 408 or is closed.")] = DEFAULT_TIMEOUT,
    ctx_size: Annotated[Optional[int], typer.Option("--ctx-size", "-c", help=f"Tokens per request, prompt and answer (default: the model's context, at most {DEFAULT_CTX}). The KV cache holds --rows x this many tokens.", show_default=False)] = None,
    device: Device = "auto", dtype: Dtype = "auto", threads: Threads = None, quant: Quant = None,
    registry: RegistryFile = None, offline: Offline = False, chat_template_file: ChatTemplateFile = None,
    cache_ram: CacheRam = None,
    pooling: Annotated[Optional[str], typer.Option("--pooling", help="How /v1/embeddings pools: mean | cls | last | max. An embedding model uses its own unless given; a text-generation model embeds only with it (e.g. last, as llama-server's --embeddings --pooling last).", show_default=False)] = None,
    temp: Temp = None, top_k: TopK = None, top_p: TopP = None, min_p: MinP = None,
    repeat_penalty: RepeatPenalty = None, repeat_last_n: RepeatLastN = None,
    presence_penalty: PresencePenalty = None, frequency_penalty: FrequencyPenalty = None, seed: Seed = None,
    max_tokens: MaxTokens = None, system: System = None,
    json_schema: Annotated[Optional[Path], typer.Option("--json-schema", help="Requests that ask for no format (response_format, grammar, tools) get output valid under this JSON Schema file.", show_default=False, rich_help_panel="Request defaults")] = None,
    grammar: Annotated[Optional[Path], typer.Option("--grammar", help="Requests that ask for no format get output in this grammar (GBNF or Lark, as run's --grammar).", show_default=False, rich_help_panel="Request defaults")] = None,
    think: Annotated[Optional[bool], typer.Option("--think/--no-think", help="A reasoning model thinks before it answers, or not, for requests that do not say (chat_template_kwargs.enable_thinking).", show_default=False, rich_help_panel="Request defaults")] = None,
    reasoning_budget: Annotated[Optional[int], typer.Option("--reasoning-budget", help="Most thinking tokens of a reasoning model, for requests that do not say (reasoning_budget); 0: no thinking.", show_default=False, rich_help_panel="Request defaults")] = None,
    api_key: ApiKey = None, cors: Cors = None,
    models_max: Annotated[int, typer.Option("--models-max", help="Models loaded at once when they load on demand (no MODEL or several); the least recently used idle one makes room.")] = 3,
    keep_alive: Annotated[Optional[str], typer.Option("--keep-alive", help="How long a model loaded on demand stays after its last request: 30s, 5m, 1h, 0 (at once) or -1 (for good); default 5m. Given, it applies to the models named on the command line too.", show_default=False)] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="One line per request on stderr, and the memory plan.")] = False,
):
    """Serve MODEL over HTTP with OpenAI's API (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, /metrics), Anthropic's (/v1/messages) and ollama's (/api/chat, /api/generate, /api/tags, ...); with no MODEL or several, any model a request names."""
    from ..decode.request import Request
    from ..runtime.lean import open_lean
    from ..serve.http import Server
    from ..serve.listener import Timeouts, bind
    from .startup import opening

    if not 1 <= rows <= 256:
        raise InvalidParameterError(f"--rows must be from 1 to 256, got {rows}")
    if queue is not None and not 0 <= queue <= 100_000:
        raise InvalidParameterError(f"--queue must be from 0 to 100000, got {queue}")
    if not 0.1 <= timeout <= 3600:  # also refuses nan
        raise InvalidParameterError(f"--timeout must be from 0.1 to 3600 seconds, got {timeout}")
    if port is None:
        port = OLLAMA_PORT if ollama else DEFAULT_PORT
    if not 0 <= port <= 65535:
        raise InvalidParameterError(f"--port must be from 0 to 65535, got {port}")
    if ctx_size is not None and ctx_size < 2:
        raise InvalidParameterError(f"--ctx-size must be at least 2, got {ctx_size}")
    models = list(models or [])
    if len(set(models)) != len(models):
        raise InvalidParameterError("a model is named twice; name each once")
    if not 1 <= models_max <= 64:
        raise InvalidParameterError(f"--models-max must be from 1 to 64, got {models_max}")
    idle = DEFAULT_KEEP_ALIVE if keep_alive is None else _seconds(keep_alive)
    prompt_cache = cache_ram_bytes(cache_ram)
    if pooling is not None and pooling not in POOLINGS:
        raise InvalidParameterError(f"--pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    defaults = _defaults(dict(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                              repeat_last_n=repeat_last_n, presence_penalty=presence_penalty,
                              frequency_penalty=frequency_penalty, seed=seed),
                         max_tokens, system, read_grammar(json_schema, None, grammar), think, reasoning_budget)
    if api_key is not None and not api_key.strip():
        raise InvalidParameterError("--api-key (or LLMCLI_API_KEY) is empty; give a key, or leave it out")
    origins = _origins(cors or [])
    template = read_chat_template(chat_template_file)
    err = stderr_console()
    if not _loopback(host) and not api_key:
        print(f"warning: --host {host} lets other machines reach this server, which has no authentication "
              "(--api-key)", file=sys.stderr)
    listener = bind(host, port)  # a busy port fails now, before the model loads
    flags = model_flags(models[0] if models else "", device=device, dtype=dtype, threads=threads,
                        ctx_size=ctx_size, quant=quant, registry=registry, offline=offline, rows=rows,
                        ctx_cap=DEFAULT_CTX, allow_encoder=True, chat_template=template)
    asked = Request(think=think, reasoning_budget=reasoning_budget)

    def open_one(name: str, progress=None):
        """(the torch-free path where it runs the model: runtime/lean.py)"""
        rt = open_lean(flags.with_(model=name), None, progress)
        if rt is None:
            from ..runtime.runtime import open_model

            rt = open_model(flags.with_(model=name), progress)
        return rt

    def on_disk() -> list[tuple]:
        """The downloaded models (`llmcli list`'s) a request may name."""
        from ..hub.catalog import downloaded
        from ..hub.fetch import registry_for
        from ..hub.store import Store

        store = Store.default()
        return [(d.name, d.path, d.size) for d in downloaded(store, registry_for(store, registry))]

    def resolve(name: str) -> str:
        from ..hub import fetch

        return str(fetch.locate(name, registry_file=registry, offline=offline).path)

    try:
        opened = []
        with opening(err) as progress:
            for name in models:
                opened.append((name, open_one(name, progress)))
        for _, rt in opened:
            report_plan(err, rt, verbose)
            check_thinks(rt, asked)
        first = opened[0] if opened else (None, None)
        on_demand = {} if len(models) == 1 else dict(
            more=tuple(opened[1:]), open_model=open_one, resolve=resolve, on_disk=on_disk, models_max=models_max,
            keep_alive=None if idle < 0 else idle, kept=None if keep_alive is None or idle < 0 else idle)
        server = Server(first[1], listener, model_id=first[0], rows=rows, queue=queue,
                        timeouts=Timeouts(head=timeout, body=timeout, write=timeout), defaults=defaults,
                        api_key=api_key, cors_origins=origins, pooling=pooling, prompt_cache=prompt_cache, **on_demand)
    except BaseException:
        listener.close()
        raise
    _log_to_stderr(verbose)
    if verbose and first[1] is not None:
        err.print(_details(first[1], server), markup=False, style="dim")
    what = models[0] if len(models) == 1 else (
        f"models on demand ({', '.join(models) + ' loaded; ' if models else ''}at most {models_max} at once)")
    try:  # a signal as the banner is written stops the server as cleanly as one later
        also = f"; ollama's API at {server.url.removesuffix('/v1')}/api" if ollama else ""
        err.print(f"serving {what} on {server.url} ({_capacity(server)}){also}", markup=False)
        server.serve_forever()
    except (KeyboardInterrupt, Terminated) as e:  # the usual way to stop a server: exit 0
        why = "Ctrl-C" if isinstance(e, KeyboardInterrupt) else signal.Signals(e.signum).name
        server.close()
        err.print(f"stopped ({why})", markup=False)


DEFAULT_KEEP_ALIVE = 300.0  # seconds a model loaded on demand stays idle (ollama's 5m)
_UNITS = {"s": 1, "m": 60, "h": 3600}


def _seconds(text: str) -> float:
    """30s, 5m, 1h, a number of seconds, or -1 (for good)."""
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * _UNITS[t[-1]] if t and t[-1] in _UNITS else float(t)
    except ValueError:
        value = float("nan")
    if not (value == -1 or 0 <= value <= 7 * 86400):
        raise InvalidParameterError(f"--keep-alive must be a duration such as 30s, 5m or 1h, 0 or -1, got {text!r}")
    return value


def _capacity(server) -> str:
    """What the banner says the server does: rows of tokens, and embeddings if it makes them."""
    e = server.embedder
    embeds = f"embeddings: {e.dimensions} dimensions, {e.pooling.mode} pooling" if e is not None else ""
    if server.loop is None:
        return embeds or f"{server.rows} rows a model"
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


def _defaults(sampling: dict, max_tokens: int | None, system: str | None, grammar, think: bool | None = None,
              reasoning_budget: int | None = None):
    """openai_api.Defaults from the flags given (checked as run checks them)."""
    from ..decode.request import Request
    from ..decode.sampling_plain import SamplingParams
    from ..serve.openai_api import Defaults

    given = {k: v for k, v in sampling.items() if v is not None}
    # InvalidParameterError naming the flag, as for run
    Request(SamplingParams(**given), max_tokens, think=think, reasoning_budget=reasoning_budget)
    check_text_options(system)
    return Defaults(given, max_tokens, system, grammar, think, reasoning_budget)


def _origins(origins: list[str]) -> tuple[str, ...]:
    for origin in origins:
        if origin != "*" and not ORIGIN.fullmatch(origin):
            raise InvalidParameterError(f"--cors takes an origin such as https://example.org (scheme, host and port, "
                                        f"no path) or *, got {origin!r}")
    return tuple(origins)


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
    errors; its protocol's warnings (a malformed request: listener.py logs the 400) are not shown."""
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
