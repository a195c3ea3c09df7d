"""A running request's answer as a stream: the objects asgi.EventStream sends, made from the chunks
of its asgi.EngineRun as they come, in the shape of the API asked.

    EventStream(chat_events(run, job, head, choices, request), run, request, write_s)
    EventStream(block_events(run, anthropic.StreamEvents(...), choice, request), ..., named=anthropic.error_body)
    EventStream(ollama_lines(run, answer, choice, request), ..., lines=ollama.error_body)

Each sets the access log's note once the run has ended.
"""

from __future__ import annotations

from starlette.requests import Request

from . import openai_api as api
from .answers import usage_note


async def chat_events(run, job: api.Job, head: dict, choices: list, request: Request):
    """The chat stream's objects: each choice's role, its text as it comes (held-back text, a
    stop's prefix, waits) and its tool calls, its finish reason, and with include_usage a last
    usage-only chunk."""
    usage = job.include_usage
    for c in choices:
        yield api.chat_chunk(head, {"role": "assistant", "content": ""}, with_usage=usage, index=c.index)
    async for index, chunk in run:
        choice = choices[index]
        for delta, logprobs in choice.push(chunk):
            yield api.chat_chunk(head, delta, logprobs=logprobs, with_usage=usage, index=index)
        if chunk.finish_reason is not None:
            yield api.chat_chunk(head, {}, choice.finish_reason, with_usage=usage, stopped_by=chunk.stopped_by,
                                 index=index)
    if usage:
        yield api.chat_chunk(head, None, stats=[c.last.stats for c in choices], with_usage=True)
    request.state.note = usage_note(choices)


async def completion_events(run, job: api.Job, head: dict, choices: list, request: Request):
    """The text completion stream's objects: each chunk that carries text, a finish reason or
    logprobs, and with include_usage a last usage-only chunk."""
    async for index, chunk in run:
        lp = choices[index].push(chunk)
        if chunk.text or chunk.finish_reason or (lp and lp["tokens"]):
            yield api.completion_chunk(head, chunk.text, chunk.finish_reason, lp, with_usage=job.include_usage,
                                       stopped_by=chunk.stopped_by, index=index)
    if job.include_usage:
        yield api.completion_chunk(head, None, stats=[c.last.stats for c in choices], with_usage=True)
    request.state.note = usage_note(choices)


async def block_events(run, blocks, choice, request: Request):
    """A streamed choice as an API of content blocks tells it (Anthropic's StreamEvents, the Responses
    API's answer): start(), then thinking(text), text(text) and call(call) as the chunks come, and
    finish(choice) at the end."""
    for event in blocks.start():
        yield event
    async for _, chunk in run:
        sent = len(choice.calls)
        for delta, _ in choice.push(chunk):
            for event in blocks.thinking(delta["reasoning_content"]) if delta.get("reasoning_content") else ():
                yield event
            for event in blocks.text(delta["content"]) if delta.get("content") else ():
                yield event
        for call in choice.calls[sent:]:
            for event in blocks.call(call):
                yield event
        if chunk.finish_reason is not None:
            for event in blocks.finish(choice):
                yield event
    request.state.note = usage_note([choice])


async def ollama_lines(run, answer, choice, request: Request):
    """ollama's NDJSON stream: the lines `answer` (ollama_api.Answer) makes of each chunk."""
    async for _, chunk in run:
        for line in answer.push(choice, chunk):
            yield line
    request.state.note = usage_note([choice])
