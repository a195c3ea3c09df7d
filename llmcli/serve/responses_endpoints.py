"""OpenAI's Responses API (responses_api.py makes its objects) through the chat endpoint's machinery:

    POST /responses                  whole, or a stream of named events; kept in the server's store
    GET|DELETE /responses/{id}       a stored response (previous_response_id continues from one)
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from . import responses_api
from .admission import parse_body
from .answers import collected, failure
from .asgi import EventStream, json_response
from .streams import block_events


class ResponsesEndpoints:
    def __init__(self, server):
        """`server`: an http.Server, whose parts these endpoints use."""
        self.admission, self.prepare, self.store = server.admission, server.prepare, server.response_store
        self.defaults, self.write_s = server.defaults, server.timeouts.write

    async def responses(self, request: Request) -> Response:
        try:
            with self.admission.admitted():
                job, turn, reqs, choices = await run_in_threadpool(self._responses_request,
                                                                   await self.admission.read_body(request))
                run = self.admission.submit(reqs, "input")
            answer = responses_api.Answer(turn, reqs[0].owner.name, self.store)
            if job.stream:
                events = self._response_events(run, answer, choices[0], request)
                return EventStream(events, run, request, self.write_s, named=answer.error)
            await collected(run, choices, request)
            return json_response(200, answer.whole(choices[0]))
        except Exception as e:
            return failure(e, request)

    async def stored_response(self, request: Request) -> Response:
        """GET a stored response by its id, or DELETE it."""
        try:
            response_id = request.path_params["id"]
            if request.method == "DELETE":
                self.store.delete(response_id)
                return json_response(200, {"id": response_id, "object": "response", "deleted": True})
            return json_response(200, self.store.response(response_id))
        except Exception as e:
            return failure(e, request)

    def _responses_request(self, data: bytes):
        job, turn = responses_api.responses_job(parse_body(data), self.defaults, self.store)
        return (job, turn, *self.prepare.chat(job))

    async def _response_events(self, run, answer, choice, request: Request):
        async for event in block_events(run, answer, choice, request):
            yield event
