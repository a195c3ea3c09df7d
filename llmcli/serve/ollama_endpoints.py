"""ollama's API (ollama_api.py makes its objects; errors in its shape, streams as NDJSON lines):

    POST /api/chat, /api/generate    through the chat (or completion) endpoint's machinery; no prompt: load or unload
    POST /api/embed, /api/embeddings   through OpenAI's embeddings (OpenAIEndpoints.embed)
    POST /api/show; GET /api/tags, /api/ps, /api/version, and GET / ("Ollama is running")
"""

from __future__ import annotations

import time

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from .. import __version__
from . import ollama_api as ollama
from .admission import parse_body
from .answers import collected, failure
from .asgi import EventStream, json_response
from .models import Served
from .openai_endpoints import OpenAIEndpoints, context_tokens, model_card
from .streams import ollama_lines


class OllamaEndpoints:
    def __init__(self, server, openai: OpenAIEndpoints):
        """`server`: an http.Server, whose parts these endpoints use; `openai`: its OpenAI endpoints,
        which embed for /api/embed and /api/embeddings."""
        self.admission, self.prepare, self.models, self.openai = server.admission, server.prepare, server.models, openai
        self.defaults, self.write_s = server.defaults, server.timeouts.write
        self.on_demand, self.on_disk = server.on_demand, server.on_disk

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def generate(self, request: Request) -> Response:
        return await self._generate(request, "generate")

    async def _generate(self, request: Request, kind: str) -> Response:
        """/api/chat or /api/generate through the chat (or completion) endpoint's machinery; NDJSON
        lines unless stream is false."""
        started = time.monotonic()
        try:
            with self.admission.admitted():
                job, reqs, choices = await run_in_threadpool(self._request, await self.admission.read_body(request), kind)
                if job is None:  # no prompt: ollama's way to load a model, or with keep_alive 0 to unload it
                    return json_response(200, ollama.loaded(kind, *reqs))
                run = self.admission.submit(reqs, "messages" if job.messages is not None else "prompt")
            answer = ollama.Answer(kind, reqs[0].owner.name, started)
            if job.stream:
                lines = ollama_lines(run, answer, choices[0], request)
                return EventStream(lines, run, request, self.write_s, lines=ollama.error_body)
            await collected(run, choices, request)
            return json_response(200, answer.whole(choices[0]))
        except Exception as e:
            return failure(e, request, ollama.error_body)

    def _request(self, data: bytes, kind: str):
        """(job, sequences, choices), or (None, the model's name, None) for a load request."""
        body = parse_body(data)
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
            ollama.check_context(body, context_tokens(reqs[0].owner))
        except BaseException:
            self.prepare.done(reqs)
            raise
        if keep != "same":
            self.models.keep(reqs[0].owner, keep)
        return job, reqs, choices

    async def embed(self, request: Request) -> Response:
        started = time.monotonic()
        try:
            _, vectors, tokens, name = await self.openai.embed(request, ollama.embed_body)
            return json_response(200, ollama.embed_response(name, vectors, tokens, started))
        except Exception as e:
            return failure(e, request, ollama.error_body)

    async def embeddings(self, request: Request) -> Response:
        """The older endpoint: one prompt, one embedding."""
        try:
            _, vectors, _, _ = await self.openai.embed(request, ollama.embeddings_body)
            return json_response(200, ollama.embedding_response(vectors[0]))
        except Exception as e:
            return failure(e, request, ollama.error_body)

    async def tags(self, request: Request) -> Response:
        """The models loaded (the one served, without on-demand loading), then, on demand, those on
        disk a request may load (read from the file system: in a worker thread)."""
        loaded = self.models.loaded()
        tags = [self._described(s).tag() for s in loaded]
        if self.on_demand and self.on_disk is not None:
            names = {n for s in loaded for n in (s.name, *s.aliases)}
            found = await run_in_threadpool(self.on_disk)
            tags += [ollama.stored_tag(name, path, size) for name, path, size in found if name not in names]
        return json_response(200, {"models": tags})

    async def ps(self, request: Request) -> Response:
        return json_response(200, {"models": [self._described(s).process() for s in self.models.loaded()]})

    async def show(self, request: Request) -> Response:
        try:
            body = parse_body(await self.admission.read_body(request))
            name = ollama.model_name(body) or ollama.model_name({"model": body.get("name")})  # (older clients: name)
            with self.models.use(name) as served:
                return json_response(200, self._described(served).show())
        except Exception as e:
            return failure(e, request, ollama.error_body)

    async def running(self, request: Request) -> Response:
        """GET / as ollama answers it: tools written for ollama ask it before anything else."""
        return Response("Ollama is running", media_type="text/plain; charset=utf-8")

    async def version(self, request: Request) -> Response:
        return json_response(200, {"version": __version__})

    def _described(self, served: Served) -> ollama.Described:
        memory = model_card(served)["llmcli"]["memory_bytes"]
        return ollama.describe(served.rt, served.name, context_tokens(served), self.defaults,
                               served.embedder is not None, memory, served.expires_at)
