"""`llmcli serve`: an OpenAI-compatible HTTP server over one model, a Starlette app on uvicorn.

    GET  /v1/models, /v1/models/{id}, /health, /metrics (the /v1 prefix may be left out)
    POST /v1/chat/completions, /v1/completions         (JSON, or server-sent events with "stream")
    POST /v1/embeddings                                (an embedding model serves only this)
                                                       the above: openai_endpoints.py
    POST /v1/responses, GET|DELETE /v1/responses/{id}  OpenAI's Responses API (responses_endpoints.py)
    POST /v1/messages, /v1/messages/count_tokens       Anthropic's Messages API (anthropic_endpoints.py)
    POST /api/chat, /api/generate, /api/embed, /api/embeddings, /api/show; GET /api/tags, /api/ps,
         /api/version, and GET / ("Ollama is running")  ollama's API (ollama_endpoints.py; NDJSON streams)

This file holds the server: the models it serves, its limits, its start and stop. routes.py maps
each path to its endpoint; a request comes in through admission.py (room, body, its model held and
its sequences submitted) and is answered whole or as an error (answers.py) or streamed (streams.py).

Requests are coroutines on one event loop (listener.py runs uvicorn). Reading JSON, the chat
template and tokenizing run in worker threads (prepare.py); the model runs in the one engine thread
(engine_loop.py), which decodes every running request together and hands each request its chunks
through the event loop, so that no request blocks another. A request with `n` choices is n engine
requests, decoded together. Embeddings run on a thread of their own, one request at a time, each
request's inputs several at a time. Limits, each answered in OpenAI's error shape:
- `rows` requests run, `queue` more wait for a row; one more gets 503 with Retry-After;
- a body over admission.MAX_BODY: 413; not JSON, nested deeper than json_input's cap, or holding a
  lone surrogate: 400; a body slower than Timeouts.body: 408;
- a client that goes away cancels its request (its row is freed at the next step); one that stops
  reading a stream for Timeouts.write is cut off the same way;
- with an API key (access.py), 401 without it; CORS only for the origins given.

    server = Server(runtime, bind("127.0.0.1", 8080), model_id="smollm2")
    server.serve_forever()        # or start() in a thread; close() stops both
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from ..runtime.embedder import NoPoolingError
from . import openai_api as api
from . import responses_api
from .admission import Admission, ModelDispatch
from .engine_loop import EngineLoop
from .listener import HttpServer, Timeouts
from .metrics import RequestCounts
from .models import Models, Served
from .prepare import Preparer
from .routes import app

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
        self.embedding_worker = ThreadPoolExecutor(1, thread_name_prefix="llmcli-embed")  # one request at a time
        self.defaults, self.api_key, self.cors_origins = defaults, api_key, tuple(cors_origins)
        self.prepare = ModelDispatch(self.models)
        self.admission = Admission(self.models, self.prepare, self.limit, rows, timeouts.body)  # 503, 413, 408
        self.response_store = responses_api.Store()  # /v1/responses kept for previous_response_id (bounded)
        self.counts = RequestCounts()
        self.http = HttpServer(app(self), sock, timeouts, on_stop=self._stop)

    def serve_model(self, rt, name: str, keep_alive: float | None) -> Served:
        """What serves `rt` under `name`: its engine loop (generating models), preparer and embedder."""
        loop = EngineLoop(rt.batch_engine(self.rows, self.max_len, self.prompt_cache_bytes)) if rt.generates else None
        try:
            embedder = rt.embedder(self.pooling)
        except NoPoolingError:  # a text-generation model: /v1/embeddings says how to start the server
            embedder = None
        return Served(name, rt, loop, Preparer(rt), embedder, keep_alive,
                      aliases={name, rt.loaded.name, rt.loaded.path.name})

    # The first model loaded now (None: none), the one model of a server that loads none on demand:
    # its runtime, engine loop and embedder, for the banner and the tests. Looked up at each use: a
    # server that loads on demand may have unloaded the one it started with.
    @property
    def first(self) -> Served | None:
        loaded = self.models.loaded()
        return loaded[0] if loaded else None

    @property
    def rt(self):
        return self.first.rt if self.first else None

    @property
    def loop(self) -> EngineLoop | None:
        return self.first.loop if self.first else None

    @property
    def embedder(self):
        return self.first.embedder if self.first else None

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
        self.embedding_worker.shutdown(wait=False, cancel_futures=True)
