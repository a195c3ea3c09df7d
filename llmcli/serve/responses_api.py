"""OpenAI's Responses API (`POST /v1/responses`), both ways, over the chat endpoint's machinery: a
Responses body -> the same checked openai_api.Job a chat completion makes (its input items as chat
messages, so templates and tool calls go as they go there), and the answer -> a response object or
its stream of named events. No HTTP and no model here (responses_endpoints.py has those).

    responses_job(body, defaults, store)  input (a string or items: messages, function_call,
                                          function_call_output, reasoning), instructions, function
                                          tools, tool_choice, text.format, reasoning, max_output_tokens,
                                          sampling, previous_response_id (from `store`), store
    Answer(turn, model, store)            the response object (whole()), or its named events (start,
                                          thinking, text, call, finish); stores it unless store: false
    Store                                 the responses kept for previous_response_id and GET, bounded (LRU)
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from . import openai_api as api
from .openai_api import ApiError

KEPT_RESPONSES = 256  # stored responses (previous_response_id, GET); the least recently used go first
KEPT_BYTES = 64 << 20  # ... and at most about this much JSON among them (a long conversation counts whole)
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")  # OpenAI's reasoning.effort values
# chat fields a Responses body may carry as they are (OpenAI's sampling, llama.cpp's and vLLM's extras)
PASSED = ("temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "repeat_last_n", "presence_penalty",
          "frequency_penalty", "parallel_tool_calls", "cache_prompt", "chat_template_kwargs", "reasoning_format",
          "reasoning_budget")
# a chat field an error names -> the Responses field the client sent
FIELDS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}
UNSUPPORTED = {
    "background": (lambda v: bool(v), "background responses are not supported by this server; leave background out"),
    "conversation": (lambda v: True, "conversations are not supported by this server; continue with "
                                     "previous_response_id or send the whole input"),
    "prompt": (lambda v: True, "stored prompt templates are not supported by this server; send instructions and input"),
}


@dataclass
class Turn:
    """One request's side of the response: its id, the request fields a response object repeats,
    and the conversation up to this answer (previous items and this input, as Responses items)."""

    id: str
    created_at: int
    echo: dict
    items: list[dict]
    store: bool


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


# ------------------------------------------------------------------------------ requests


def responses_job(body: dict, defaults: api.Defaults = api.Defaults(), store: "Store | None" = None
                  ) -> tuple[api.Job, Turn]:
    """A Responses request as the chat endpoint's Job and its Turn; a mistake is ApiError(400) naming
    the field, an unknown previous_response_id a 404."""
    for key, (asks, why) in UNSUPPORTED.items():
        if body.get(key) is not None and asks(body[key]):
            raise ApiError(400, why, key)
    stored = _bool(body, "store", True)
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise ApiError(400, "previous_response_id must be a string (a response's id)", "previous_response_id")
    items = (store.items(previous) if store is not None and previous else []) + _input(body.get("input"))
    if previous and store is None:
        raise ApiError(404, f"no stored response {previous!r}", "previous_response_id", "previous_response_not_found")
    chat = {"messages": _instructions(body.get("instructions")) + _messages(items), "stream": _bool(body, "stream"),
            "model": body.get("model"), **{k: body[k] for k in PASSED if body.get(k) is not None}}
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, f"max_output_tokens must be a whole number of at least 1, got {max_tokens!r}",
                           "max_output_tokens")
        chat["max_tokens"] = max_tokens
    chat.update(_tools(body))
    chat.update(_format(body.get("text")))
    chat.update(_reasoning(body.get("reasoning"), chat))
    try:
        job = api.chat_job(chat, defaults)
    except ApiError as e:  # name the field as this API spells it
        e.param = FIELDS.get(e.param, e.param)
        raise
    sampling = job.request.sampling
    echo = {"instructions": body.get("instructions"), "tools": body.get("tools") or [],
            "tool_choice": body.get("tool_choice") or "auto", "parallel_tool_calls": job.request.parallel_tool_calls,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "max_output_tokens": max_tokens,
            "text": body.get("text") or {"format": {"type": "text"}},
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
            "previous_response_id": previous, "store": stored, "metadata": body.get("metadata") or {},
            "truncation": "disabled", "user": body.get("user")}
    return job, Turn(new_id("resp"), int(time.time()), echo, items, stored)


def _bool(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{key} must be true or false, got {value!r}", key)
    return default if value is None else value


def _instructions(instructions) -> list[dict]:
    if instructions is None:
        return []
    if not isinstance(instructions, str):
        raise ApiError(400, "instructions must be a string (the system message)", "instructions")
    return [{"role": "system", "content": instructions}]


def _input(value) -> list[dict]:
    """`input` as a list of checked items: a string is one user message."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "input must be a string or a non-empty list of items (messages, function_call, "
                            "function_call_output)", "input")
    return [_item(item, f"input[{i}]") for i, item in enumerate(value)]


def _item(item, at: str) -> dict:
    kind = item.get("type", "message") if isinstance(item, dict) else None
    if kind == "message":
        if item.get("role") not in ("user", "assistant", "system", "developer"):
            raise ApiError(400, f"{at} must be a message with role user, assistant, system or developer", f"{at}.role")
        return {"type": "message", "role": item["role"], "content": _text(item.get("content"), f"{at}.content")}
    if kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise ApiError(400, f"{at}: a function_call item has call_id, name and arguments (a JSON string)",
                               f"{at}.{key}")
        return {"type": "function_call", **{k: item[k] for k in ("call_id", "name", "arguments")}}
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise ApiError(400, f"{at}: a function_call_output item has the call_id of its call", f"{at}.call_id")
        return {"type": "function_call_output", "call_id": item["call_id"],
                "output": _text(item.get("output"), f"{at}.output")}
    if kind == "reasoning":  # earlier thinking: for templates that render it (gpt-oss's, with its calls)
        parts = [p for key in ("content", "summary") if isinstance(item.get(key), list) for p in item[key]]
        return {"type": "reasoning", "text": "".join(p.get("text", "") for p in parts if isinstance(p, dict))}
    if kind == "item_reference":
        raise ApiError(400, f"{at}: item references are not supported; send the item itself or previous_response_id", at)
    raise ApiError(400, f"{at}: a {kind or type(item).__name__!r} item is not supported here; this server takes "
                        "message, function_call, function_call_output and reasoning items", at)


def _text(content, where: str) -> str:
    """A string, or text parts (input_text, output_text) joined by newlines."""
    return api.text_parts(content, where, ("input_text", "output_text", "text"), "text parts (input_text, output_text)")


def _messages(items: list[dict]) -> list[dict]:
    """Responses items -> chat messages: function_call items join the assistant message before them
    (as its tool_calls), function_call_output items become tool messages, and reasoning goes with
    the next assistant message as its reasoning_content."""
    out, thought = [], ""
    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            thought += item["text"]
            continue
        if kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
        else:
            out.append({"role": item["role"], "content": item["content"]})
        if thought and out[-1]["role"] == "assistant":
            out[-1]["reasoning_content"], thought = thought, ""
    return out


def _tools(body: dict) -> dict:
    """Responses' flat function tools {type, name, description, parameters} and tool_choice in the
    chat shape."""
    tools, choice, out = body.get("tools"), body.get("tool_choice"), {}
    if tools is not None:
        if not isinstance(tools, list):
            raise ApiError(400, "tools must be a list of {type: function, name, description, parameters}", "tools")
        out["tools"] = []
        for i, t in enumerate(tools):
            kind = t.get("type") if isinstance(t, dict) else None
            if kind != "function":
                raise ApiError(400, f"tools[{i}]: a {kind or type(t).__name__!r} tool is not supported here; this "
                                    "server runs function tools", "tools")
            fn = t["function"] if isinstance(t.get("function"), dict) else {  # (the chat shape, sent by mistake)
                k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
            out["tools"].append({"type": "function", "function": fn})
    if choice is not None:
        if isinstance(choice, dict):
            if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
                raise ApiError(400, 'tool_choice must be "none", "auto", "required" or {"type": "function", '
                                    '"name": ...}', "tool_choice")
            choice = {"type": "function", "function": {"name": choice["name"]}}
        out["tool_choice"] = choice
    return out


def _format(text) -> dict:
    """text.format: {type: text}, {type: json_object} or {type: json_schema, name, schema, strict}."""
    if text is None:
        return {}
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(text, dict) or (fmt is not None and not isinstance(fmt, dict)):
        raise ApiError(400, 'text must be {"format": {"type": "text" | "json_object" | "json_schema", ...}}', "text")
    if fmt is None or fmt.get("type") == "text":
        return {}
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise ApiError(400, "text.format json_schema needs a schema (a JSON Schema object)", "text.format")
        return {"response_format": {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt["schema"]}}}
    return {"response_format": fmt}  # json_object, or a type the chat check refuses by name


def _reasoning(reasoning, chat: dict) -> dict:
    """reasoning {effort}: gpt-oss's effort (OpenAI's none turns a reasoning model's thinking off,
    minimal is low and xhigh high, as the templates know three)."""
    if reasoning is None:
        return {}
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if not isinstance(reasoning, dict) or (effort is not None and effort not in EFFORTS):
        raise ApiError(400, f"reasoning must be {{\"effort\": ...}} with effort one of {', '.join(EFFORTS)}", "reasoning")
    if effort == "none":  # (the request's own chat_template_kwargs win; one that is no object, chat_job refuses)
        kwargs = chat.get("chat_template_kwargs", {})
        return {"chat_template_kwargs": {"enable_thinking": False, **kwargs}} if isinstance(kwargs, dict) else {}
    return {"reasoning_effort": {"minimal": "low", "xhigh": "high"}.get(effort, effort)} if effort else {}


# ------------------------------------------------------------------------------ answers


def usage(stats) -> dict:
    return {"input_tokens": stats.prompt_tokens, "input_tokens_details": {"cached_tokens": stats.cached_tokens},
            "output_tokens": stats.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": stats.reasoning_tokens},
            "total_tokens": stats.prompt_tokens + stats.completion_tokens}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text else [], "status": status}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def call_item(call, item_id: str | None = None, arguments: str | None = None, status: str = "completed") -> dict:
    return {"id": item_id or new_id("fc"), "type": "function_call", "call_id": new_id("call"), "name": call.name,
            "arguments": call.json() if arguments is None else arguments, "status": status}


class Answer:
    """One request's response object: whole(choice) at once, or start() / thinking() / text() /
    call() / finish(choice) as OpenAI's named events, each numbered (sequence_number). A text
    message opens at its first non-blank text (blank text before a call is no message, as whole()
    leaves it out); a reasoning model's thinking is a reasoning item before it. Finished, the
    response goes into the store unless the request said store: false."""

    def __init__(self, turn: Turn, model: str, store: "Store | None" = None):
        self.turn, self.model, self.store = turn, model, store
        self.seq, self.output = 0, []
        self.open: dict | None = None  # the reasoning or message item being streamed
        self.held = ""  # blank text not yet in a message

    def response(self, status: str, stats=None, reason: str | None = None) -> dict:
        t = self.turn
        return {"id": t.id, "object": "response", "created_at": t.created_at, "status": status, "error": None,
                "incomplete_details": {"reason": reason} if reason else None, "model": self.model,
                "output": list(self.output), "usage": usage(stats) if stats is not None else None, **t.echo}

    def whole(self, choice) -> dict:
        text, thought = "".join(choice.pieces), "".join(choice.thoughts)
        status, reason = _status(choice)
        self.output = [reasoning_item(new_id("rs"), thought)] if thought else []
        self.output += [message_item(new_id("msg"), text, status)] if text.strip() or not choice.calls else []
        self.output += [call_item(c) for c in choice.calls]
        return self._keep(self.response(status, choice.last.stats, reason))

    # ---------------------------------------------------------------- the stream

    def start(self) -> list[tuple[str, dict]]:
        empty = self.response("in_progress")
        return [self._event("response.created", response=empty), self._event("response.in_progress", response=empty)]

    def thinking(self, text: str) -> list[tuple[str, dict]]:
        out = []
        if not self._is_open("reasoning"):
            item = reasoning_item(new_id("rs"), "", "in_progress")
            out = self._close() + self._add(item, {"type": "reasoning_text", "text": ""})
        self.open["text"] += text
        return out + [self._event("response.reasoning_text.delta", **self._where(), delta=text)]

    def text(self, text: str) -> list[tuple[str, dict]]:
        out = []
        if not self._is_open("message"):
            self.held += text
            if not self.held.strip():
                return []
            text, self.held = self.held, ""
            out = self._close() + self._open_message()
        self.open["text"] += text
        return out + [self._event("response.output_text.delta", **self._where(), delta=text, logprobs=[])]

    def call(self, call) -> list[tuple[str, dict]]:
        out = self._close()
        item = call_item(call)
        arguments = item["arguments"]
        out += [self._event("response.output_item.added", output_index=len(self.output),
                            item={**item, "arguments": "", "status": "in_progress"}),
                self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=len(self.output),
                            delta=arguments),
                self._event("response.function_call_arguments.done", item_id=item["id"], output_index=len(self.output),
                            name=item["name"], arguments=arguments),
                self._event("response.output_item.done", output_index=len(self.output), item=item)]
        self.output.append(item)
        return out

    def finish(self, choice) -> list[tuple[str, dict]]:
        status, reason = _status(choice)
        out = []
        messages = self._is_open("message") or any(item["type"] == "message" for item in self.output)
        if not messages and not choice.calls:  # an answer of blank text or none: a message all the same, as whole()
            out = self._close() + self._open_message()
            if self.held:
                self.open["text"], self.held = self.held, ""
                out.append(self._event("response.output_text.delta", **self._where(), delta=self.open["text"], logprobs=[]))
        out += self._close(status)
        response = self._keep(self.response(status, choice.last.stats, reason))
        return out + [self._event("response.completed" if status == "completed" else "response.incomplete",
                                  response=response)]

    def error(self, err: ApiError) -> dict:
        """The stream's error event (the headers are out: no status code can say it)."""
        return self._event("error", code=err.code or err.type, message=err.message, param=err.param)[1]

    def _event(self, kind: str, **fields) -> tuple[str, dict]:
        self.seq += 1
        return kind, {"type": kind, "sequence_number": self.seq - 1, **fields}

    def _is_open(self, kind: str) -> bool:
        return self.open is not None and self.open["item"]["type"] == kind

    def _where(self) -> dict:
        return {"item_id": self.open["item"]["id"], "output_index": len(self.output), "content_index": 0}

    def _open_message(self) -> list[tuple[str, dict]]:
        return self._add(message_item(new_id("msg"), None, "in_progress"),
                         {"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def _add(self, item: dict, part: dict) -> list[tuple[str, dict]]:
        self.open = {"item": item, "part": part, "text": ""}
        return [self._event("response.output_item.added", output_index=len(self.output), item=item),
                self._event("response.content_part.added", **self._where(), part=part)]

    def _close(self, status: str = "completed") -> list[tuple[str, dict]]:
        """The open item's done events; it joins the output."""
        if self.open is None:
            return []
        item, text, where = self.open["item"], self.open["text"], self._where()
        if item["type"] == "reasoning":
            done, whole = [self._event("response.reasoning_text.done", **where, text=text)], reasoning_item(item["id"], text)
        else:
            done = [self._event("response.output_text.done", **where, text=text, logprobs=[])]
            whole = message_item(item["id"], text, status)
        part = whole["content"][0] if whole["content"] else {**self.open["part"], "text": text}
        done += [self._event("response.content_part.done", **where, part=part),
                 self._event("response.output_item.done", output_index=len(self.output), item=whole)]
        self.output.append(whole)
        self.open = None
        return done

    def _keep(self, response: dict) -> dict:
        if self.store is not None and self.turn.store:
            self.store.put(response, self.turn.items + [_as_input(item) for item in response["output"]])
        return response


def _status(choice) -> tuple[str, str | None]:
    """(status, incomplete_details.reason): a length finish (max_output_tokens or the context) is incomplete."""
    if choice.last.finish_reason == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None


def _as_input(item: dict) -> dict:
    """An output item as the input item the next turn of the conversation reads."""
    if item["type"] == "message":
        return {"type": "message", "role": "assistant", "content": "".join(p["text"] for p in item["content"])}
    if item["type"] == "reasoning":
        return {"type": "reasoning", "text": "".join(p["text"] for p in item["content"])}
    return {"type": "function_call", **{k: item[k] for k in ("call_id", "name", "arguments")}}


# ------------------------------------------------------------------------------ the store


class Store:
    """Finished responses by id, each with its conversation (input and output items), for
    previous_response_id and GET /v1/responses/{id}: at most `count` of them and about `size` bytes
    of their JSON, the least recently used dropped first. Used from the event loop and worker
    threads: one lock."""

    def __init__(self, count: int = KEPT_RESPONSES, size: int = KEPT_BYTES):
        self.count, self.size, self.used = count, size, 0
        self.kept: OrderedDict[str, tuple[dict, list[dict], int]] = OrderedDict()
        self.lock = threading.Lock()

    def put(self, response: dict, items: list[dict]) -> None:
        nbytes = len(json.dumps(items, ensure_ascii=False)) + len(json.dumps(response, ensure_ascii=False))
        with self.lock:
            self._drop(response["id"])
            self.kept[response["id"]] = (response, items, nbytes)
            self.used += nbytes
            while len(self.kept) > self.count or (self.used > self.size and len(self.kept) > 1):
                self._drop(next(iter(self.kept)))

    def response(self, response_id: str) -> dict:
        return self._get(response_id, None)[0]

    def items(self, response_id: str) -> list[dict]:
        return list(self._get(response_id, "previous_response_id")[1])

    def delete(self, response_id: str) -> None:
        with self.lock:
            if response_id not in self.kept:
                raise _not_found(response_id, None)
            self._drop(response_id)

    def _get(self, response_id: str, param: str | None):
        with self.lock:
            if response_id not in self.kept:
                raise _not_found(response_id, param)
            self.kept.move_to_end(response_id)
            return self.kept[response_id]

    def _drop(self, response_id: str) -> None:
        if response_id in self.kept:
            self.used -= self.kept.pop(response_id)[2]


def _not_found(response_id: str, param: str | None) -> ApiError:
    return ApiError(404, f"no stored response {response_id!r}: it was never stored (store: false), or the server "
                         f"restarted or dropped it to keep at most {KEPT_RESPONSES}; send the whole input instead",
                    param, "previous_response_not_found")
