"""A running request's answer when it is not a stream: every choice collected while the client
stays, or the error, in OpenAI's shape or another API's; and the access log's note on it.

    await collected(run, choices, request)       # then the endpoint answers json_response(200, ...)
    return failure(e, request, ollama.error_body)
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from .asgi import ClientGone, Silence, as_api_error, collect, json_response, unless_gone


async def collected(run, choices: list, request: Request) -> None:
    """Every choice's chunks, waited for while the client stays (the answer then goes whole)."""
    try:
        await unless_gone(request.receive, collect(run, choices))
    finally:
        run.close()
    request.state.note = usage_note(choices)


def failure(e: Exception, request: Request, shape=None) -> Response:
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


def usage_note(choices: list) -> str:
    """The access log's note on a finished request: "12+34 tokens, stop"."""
    stats = [c.last.stats for c in choices]
    finish = ", ".join(c.finish_reason for c in choices)
    return f"{stats[0].prompt_tokens}+{sum(s.completion_tokens for s in stats)} tokens, {finish}"
