"""The server's ASGI app: each path and method -> its endpoint, inside the outer layers.

    app(server)   # AccessLog(cors(optional_v1(require_key(Starlette(routes)))))

Paths are matched without /v1 and without a trailing slash (asgi.optional_v1); the key check and
CORS are there only when the server has a key or origins. A path or method no route takes gets a
404 or 405 in OpenAI's error shape, or ollama's under /api/.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import ollama_api as ollama
from .access import cors, require_key
from .anthropic_endpoints import AnthropicEndpoints
from .answers import failure
from .asgi import AccessLog, optional_v1
from .ollama_endpoints import OllamaEndpoints
from .openai_api import ApiError
from .openai_endpoints import OpenAIEndpoints
from .responses_endpoints import ResponsesEndpoints


def app(server):
    """`server`: an http.Server (its parts, its api_key and cors_origins, its request counts)."""
    openai, anthropic, responses = OpenAIEndpoints(server), AnthropicEndpoints(server), ResponsesEndpoints(server)
    ollama_api = OllamaEndpoints(server, openai)  # (its /api/embed embeds through openai's)
    routes = [Route("/", ollama_api.running, methods=["GET", "HEAD"]),
              Route("/models", openai.list_models, methods=["GET"]),
              Route("/models/{name:path}", openai.show_model, methods=["GET"]),
              Route("/health", openai.health, methods=["GET"]), Route("/metrics", openai.metrics, methods=["GET"]),
              Route("/chat/completions", openai.chat, methods=["POST"]),
              Route("/completions", openai.completion, methods=["POST"]),
              Route("/embeddings", openai.embeddings, methods=["POST"]),
              Route("/messages", anthropic.messages, methods=["POST"]),
              Route("/messages/count_tokens", anthropic.count_tokens, methods=["POST"]),
              Route("/responses", responses.responses, methods=["POST"]),
              Route("/responses/{id}", responses.stored_response, methods=["GET", "DELETE"]),
              *(Route(f"/api/{name}", getattr(ollama_api, name), methods=[method]) for name, method in (
                  ("chat", "POST"), ("generate", "POST"), ("embed", "POST"), ("embeddings", "POST"),
                  ("show", "POST"), ("tags", "GET"), ("ps", "GET"), ("version", "GET")))]
    asgi = Starlette(routes=routes, exception_handlers={HTTPException: _routing_error})
    if server.api_key:
        asgi = require_key(asgi, server.api_key)
    asgi = optional_v1(asgi)
    if server.cors_origins:
        asgi = cors(asgi, list(server.cors_origins))
    return AccessLog(asgi, server.counts)


async def _routing_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's router found no endpoint (404) or not this method (405)."""
    method, path = request.method, request.scope.get("llmcli.path", request.url.path)
    shape = ollama.error_body if path.startswith("/api/") else None
    if exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        return failure(ApiError(405, f"{path} takes {allow}, not {method}", code="method_not_allowed",
                                headers={"Allow": allow}), request, shape)
    if exc.status_code == 404:
        return failure(ApiError(404, f"no such endpoint: {method} {path}", code="not_found"), request, shape)
    return failure(ApiError(exc.status_code, exc.detail), request, shape)
