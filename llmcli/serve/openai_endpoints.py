"""OpenAI's endpoints (openai_api.py and embeddings_api.py make their objects) and the server's own:

    GET  /models, /models/{id}       the models loaded, with the memory each holds (model_card)
    GET  /health, /metrics           the engine's figures; Prometheus' text
    POST /chat/completions, /completions   prepared in a worker thread, decoded in the engine; whole or SSE
    POST /embeddings                 on the embedding thread, one request at a time (embed(), ollama's too)
"""

from __future__ import annotations

import asyncio

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..errors import PromptTooLongError
from . import embeddings_api
from . import openai_api as api
from .admission import parse_body
from .answers import collected, failure
from .asgi import EventStream, json_response, unless_gone
from .metrics import prometheus
from .models import Served
from .openai_api import ApiError
from .streams import chat_events, completion_events


class OpenAIEndpoints:
    def __init__(self, server):
        """`server`: an http.Server, whose parts these endpoints use."""
        self.admission, self.prepare, self.models = server.admission, server.prepare, server.models
        self.defaults, self.write_s = server.defaults, server.timeouts.write
        self.embedding_worker = server.embedding_worker  # one thread: one embeddings request at a time
        self.on_demand, self.model_id, self.limit = server.on_demand, server.model_id, server.limit
        self.counts = server.counts

    async def list_models(self, request: Request) -> Response:
        """The models loaded now (the one served, without on-demand loading), with their memory."""
        return json_response(200, {"object": "list", "data": [model_card(s) for s in self.models.loaded()]})

    async def show_model(self, request: Request) -> Response:
        name = request.path_params["name"]
        found = [s for s in self.models.loaded() if name == s.name or name in s.aliases]
        if not found:
            return failure(self.models._not_served(name), request)
        return json_response(200, model_card(found[0]))

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

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, self._chat_request, "messages", "chatcmpl", chat_events,
                                    api.chat_response)

    async def completion(self, request: Request) -> Response:
        return await self._generate(request, self._completion_request, "prompt", "cmpl", completion_events,
                                    api.completion_response)

    async def _generate(self, request: Request, prepare, param: str, id_prefix: str, events, response) -> Response:
        """A chat or completion request: prepared in a worker thread, decoded in the engine, answered
        whole or as a stream of `events`."""
        try:
            with self.admission.admitted():
                job, reqs, choices = await run_in_threadpool(prepare, await self.admission.read_body(request))
                run = self.admission.submit(reqs, param)
            head = api.head(id_prefix, reqs[0].owner.name)
            if job.stream:
                return EventStream(events(run, job, head, choices, request), run, request, self.write_s)
            await collected(run, choices, request)
            return json_response(200, response(head, [c.body() for c in choices], [c.last.stats for c in choices]))
        except Exception as e:
            return failure(e, request)

    def _chat_request(self, data: bytes):
        job = api.chat_job(parse_body(data), self.defaults)
        return (job, *self.prepare.chat(job))

    def _completion_request(self, data: bytes):
        job = api.completion_job(parse_body(data), self.defaults)
        return (job, *self.prepare.completion(job))

    async def embeddings(self, request: Request) -> Response:
        try:
            job, vectors, tokens, name = await self.embed(request)
            return json_response(200, embeddings_api.embeddings_response(name, vectors, tokens, job.base64))
        except Exception as e:
            return failure(e, request)

    async def embed(self, request: Request, translate=None):
        """(job, vectors, tokens, the model's name) of an embeddings request; `translate`: another
        API's body -> OpenAI's."""
        with self.admission.admitted():
            job, ids, served = await run_in_threadpool(self._embedding_request, await self.admission.read_body(request),
                                                       translate)
            try:
                work = asyncio.wrap_future(self.embedding_worker.submit(served.embedder.embed, ids))
                vectors = await unless_gone(request.receive, work)
            finally:
                self.models.release(served)
        tokens = sum(map(len, ids))
        request.state.note = f"{len(ids)} inputs, {tokens} tokens"
        return job, vectors, tokens, served.name

    def _embedding_request(self, data: bytes, translate=None):
        """(job, each input's token ids, the model held: release it once embedded)."""
        body = parse_body(data)
        job = embeddings_api.embedding_job(translate(body) if translate else body)
        served = self.models.hold(job.model)
        try:
            return (job, _embedding_ids(job, served), served)
        except BaseException:
            self.models.release(served)
            raise


def _embedding_ids(job, served: Served) -> list[list[int]]:
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


def model_card(served: Served) -> dict:
    """OpenAI's model object, and what llmcli adds: the memory it holds, when it unloads."""
    plan = getattr(served.rt, "plan", None)
    memory = plan.taken_bytes if plan is not None else served.rt.loaded.weights_bytes
    return {"id": served.name, "object": "model", "created": int(served.loaded_at), "owned_by": "llmcli",
            "llmcli": {"file": served.rt.loaded.path.name, "memory_bytes": int(memory),
                       "expires_at": served.expires_at, "busy": served.busy}}


def context_tokens(served: Served) -> int:
    """Tokens a request may hold, prompt and answer: a row of the model's engine."""
    return served.loop.engine.max_len if served.loop is not None else served.rt.ctx_size
