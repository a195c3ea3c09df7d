"""Anthropic's Messages API (anthropic_api.py makes its objects) through the chat endpoint's machinery:

    POST /messages                   whole, or a stream of named events (StreamEvents)
    POST /messages/count_tokens      the prompt's tokens, as the template makes them; nothing runs
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from . import anthropic_api as anthropic
from .admission import parse_body
from .answers import collected, failure
from .asgi import EventStream, json_response
from .streams import block_events


class AnthropicEndpoints:
    def __init__(self, server):
        """`server`: an http.Server, whose parts these endpoints use."""
        self.admission, self.prepare = server.admission, server.prepare
        self.defaults, self.write_s = server.defaults, server.timeouts.write

    async def messages(self, request: Request) -> Response:
        try:
            with self.admission.admitted():
                job, reqs, choices = await run_in_threadpool(self._messages_request,
                                                             await self.admission.read_body(request))
                run = self.admission.submit(reqs, "messages")
            msg_id = anthropic.new_id()
            if job.stream:
                events = self._message_events(run, msg_id, reqs[0], choices[0], request)
                return EventStream(events, run, request, self.write_s, named=anthropic.error_body)
            await collected(run, choices, request)
            return json_response(200, anthropic.message(msg_id, reqs[0].owner.name, choices[0]))
        except Exception as e:
            return failure(e, request, anthropic.error_body)

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's token count of a Messages request: its prompt's tokens, as the template makes them."""
        try:
            job, reqs, _ = await run_in_threadpool(self._messages_request, await self.admission.read_body(request), True)
            self.prepare.done(reqs)  # (nothing runs: the model is free again)
            return json_response(200, {"input_tokens": len(reqs[0].prompt)})
        except Exception as e:
            return failure(e, request, anthropic.error_body)

    def _messages_request(self, data: bytes, counting: bool = False):
        body = parse_body(data)
        if counting:
            body = {**body, "max_tokens": body.get("max_tokens", 1), "stream": False}
        job = anthropic.messages_job(body, self.defaults)
        return (job, *self.prepare.chat(job))

    async def _message_events(self, run, msg_id: str, seq, choice, request: Request):
        stream = anthropic.StreamEvents(msg_id, seq.owner.name, len(seq.prompt))
        async for event in block_events(run, stream, choice, request):
            yield event
