"""Who may use the server: an API key (`--api-key`) and the browser origins CORS lets in (`--cors`),
as ASGI layers around the app.

    app = cors(require_key(app, "sk-..."), ["https://example.org"])

- require_key: every request but OPEN_PATHS (the health check) must carry `Authorization: Bearer
  KEY` (what the openai client sends) or `x-api-key: KEY` (Anthropic's); else 401 in OpenAI's error
  shape (Anthropic's on /v1/messages, ollama's on /api/). Keys are compared in
  constant time.
- cors: off unless origins are given ("*": any). Starlette's CORSMiddleware answers preflight
  requests itself, before the key is asked for (browsers send none with them), and adds the
  headers to every answer, 401s included, so that a page can read why it was refused.
"""

from __future__ import annotations

import hmac

from starlette.middleware.cors import CORSMiddleware

from .anthropic_api import error_body
from .asgi import json_response
from .openai_api import ApiError

OPEN_PATHS = {"/health"}  # after optional_v1 (so /v1/health too)


def require_key(app, key: str):
    expected = f"Bearer {key}".encode()

    async def checked(scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"")
        anthropic = headers.get(b"x-api-key")  # (Anthropic's clients send the key so)
        if hmac.compare_digest(given, expected) or (anthropic is not None and hmac.compare_digest(anthropic, key.encode())):
            return await app(scope, receive, send)
        why = ("no API key: send Authorization: Bearer KEY" if not given and anthropic is None else
               "the API key is not this server's: send Authorization: Bearer KEY")
        extra = {"WWW-Authenticate": "Bearer"}
        if headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers:
            extra["Connection"] = "close"  # its body is not read: the connection cannot go on
        state = scope.setdefault("state", {})
        state["note"] = why.split(":")[0]
        err = ApiError(401, f"{why} (or x-api-key: KEY; the key given to llmcli serve with --api-key or LLMCLI_API_KEY)",
                       code="invalid_api_key")
        body = (error_body(err) if scope["path"].startswith("/messages") else
                {"error": err.message} if scope["path"].startswith("/api/") else err.body())  # (ollama's shape)
        answer = json_response(401, body, extra)
        await answer(scope, receive, send)

    return checked


def cors(app, origins: list[str]):
    """Starlette's CORS layer for `origins` ("*" among them: any origin)."""
    return CORSMiddleware(app, allow_origins=["*"] if "*" in origins else list(origins),
                          allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                          expose_headers=["Retry-After"], max_age=600)
