"""Anthropic's Messages API (`POST /v1/messages`), both ways, over the chat endpoint's machinery: a
Messages body -> the same checked openai_api.Job a chat completion makes (its messages in OpenAI's
shape, so templates and tool calls go as they go there), and the answer -> Anthropic's message object
or its stream of named events. No HTTP and no model here (anthropic_endpoints.py has those).

    messages_job(body, defaults)   system, content blocks (text, tool_use, tool_result), tools and
                                   tool_choice, stop_sequences, max_tokens (required), sampling, thinking
    message(...), StreamEvents     the message object (thinking, text, tool_use blocks); message_start,
                                   content_block_start/delta/stop, message_delta, message_stop
    error_body(ApiError)           {"type": "error", "error": {"type", "message"}}
"""

from __future__ import annotations

import json
import uuid

from . import openai_api as api
from .openai_api import ApiError

# HTTP status -> Anthropic's error type
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}


def error_body(e: ApiError) -> dict:
    kind = ERROR_TYPES.get(e.status, "invalid_request_error" if e.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def messages_job(body: dict, defaults: api.Defaults = api.Defaults()) -> api.Job:
    """A Messages request as the chat endpoint's Job; a mistake is ApiError(400) naming the field."""
    if body.get("max_tokens") is None:
        raise ApiError(400, "max_tokens is required (the most tokens to generate, e.g. 1024)", "max_tokens")
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)):
        raise ApiError(400, "stop_sequences must be a list of strings", "stop_sequences")
    if stops and len(stops) > api.MAX_STOP:
        raise ApiError(400, f"stop_sequences holds {len(stops)} strings; this server takes at most {api.MAX_STOP}",
                       "stop_sequences")
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not 0 <= temperature <= 1):
        raise ApiError(400, f"temperature must be a number from 0 to 1, got {temperature!r}", "temperature")
    chat = {"messages": _system(body.get("system")) + _messages(body.get("messages")),
            "max_tokens": body["max_tokens"], "stream": body.get("stream", False), "model": body.get("model"),
            **{k: body[k] for k in ("temperature", "top_p", "top_k") if body.get(k) is not None}}
    if stops:
        chat["stop"] = stops
    chat.update(_tools(body))
    chat.update(_thinking(body.get("thinking")))
    return api.chat_job(chat, defaults)


def _thinking(thinking) -> dict:
    """thinking {"type": "enabled", "budget_tokens": N} or {"type": "disabled"} as the chat fields of a
    reasoning model (its template's switch, a budget); absent: as the server's defaults say."""
    if thinking is None:
        return {}
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        return {"chat_template_kwargs": {"enable_thinking": False}}
    budget = thinking.get("budget_tokens") if kind == "enabled" else None
    if kind != "enabled" or isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ApiError(400, 'thinking must be {"type": "enabled", "budget_tokens": N} (N >= 1) or {"type": "disabled"}',
                       "thinking")
    return {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_budget": budget}


def _system(system) -> list[dict]:
    if system is None:
        return []
    return [{"role": "system", "content": _text(system, "system")}]


def _text(content, where: str) -> str:
    """A string, or text blocks joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
                                         for b in content):
        return "\n".join(b["text"] for b in content)
    raise ApiError(400, f"{where} must be a string or a list of text blocks", where)


def _messages(messages) -> list[dict]:
    """Anthropic's turns -> OpenAI's messages: an assistant's tool_use blocks become its tool_calls,
    a user's tool_result blocks become tool messages (before the user's own text)."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise ApiError(400, f"{where} must be an object with role user or assistant and content", where)
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise ApiError(400, f"{where}.content must be a string or a list of content blocks", f"{where}.content")
        texts, calls, results = [], [], []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                    raise ApiError(400, f"{at}: a tool_use block has a name and an input object", at)
                calls.append({"id": str(block.get("id") or f"toolu_{uuid.uuid4().hex[:24]}"), "type": "function",
                              "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
            elif kind == "tool_result" and m["role"] == "user":
                results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                                "content": _result(block.get("content", ""), at)})
            elif kind in ("thinking", "redacted_thinking") and m["role"] == "assistant":
                continue  # earlier turns' thinking: not sent back to the model
            else:
                raise ApiError(400, f"{at}: a {kind or type(block).__name__!r} block is not supported here; this server "
                                    "takes text, tool_use (assistant) and tool_result (user) blocks", at)
        if m["role"] == "assistant":
            out.append({"role": "assistant", "content": "\n".join(texts) if texts or not calls else None,
                        **({"tool_calls": calls} if calls else {})})
        else:
            out += results
            if texts or not results:
                out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _result(content, where: str) -> str:
    if isinstance(content, list):
        return _text(content, f"{where}.content")
    if not isinstance(content, str):
        raise ApiError(400, f"{where}.content must be a string or a list of text blocks", f"{where}.content")
    return content


def _tools(body: dict) -> dict:
    """tools [{name, description, input_schema}] and tool_choice {type: auto|any|tool|none} in OpenAI's shape."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    out = {}
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise ApiError(400, "tools must be a list of {name, description, input_schema} objects", "tools")
        out["tools"] = [{"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description", ""),
            "parameters": t.get("input_schema", {"type": "object"})}} for t in tools]
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind not in ("auto", "any", "tool", "none") or (kind == "tool" and not isinstance(choice.get("name"), str)):
            raise ApiError(400, 'tool_choice must be {"type": "auto"}, {"type": "any"}, {"type": "none"} or '
                                '{"type": "tool", "name": ...}', "tool_choice")
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or \
            {"type": "function", "function": {"name": choice["name"]}}
        if choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    return out


# ------------------------------------------------------------------------------ answers


def new_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def stop_reason(choice) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished chat choice (serve/choices.py's ChatChoice)."""
    last = choice.last
    if choice.calls:
        return "tool_use", None
    if last.finish_reason == "length":
        return "max_tokens", None
    return ("stop_sequence", last.stop) if last.stop is not None else ("end_turn", None)


def tool_use(call) -> dict:
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": call.name, "input": json.loads(call.json())}


def usage(stats) -> dict:
    return {"input_tokens": stats.prompt_tokens, "output_tokens": stats.completion_tokens,
            "cache_read_input_tokens": stats.cached_tokens}


def message(msg_id: str, model: str, choice) -> dict:
    """The whole answer: a reasoning model's thinking, its text, then tool_use blocks."""
    text, thought = "".join(choice.pieces), "".join(choice.thoughts)
    blocks = [{"type": "thinking", "thinking": thought, "signature": ""}] if thought else []
    blocks += [{"type": "text", "text": text}] if text.strip() or not choice.calls else []
    blocks += [tool_use(c) for c in choice.calls]
    reason, sequence = stop_reason(choice)
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage(choice.last.stats)}


class StreamEvents:
    """Anthropic's named events for one streamed choice: a text block opened at the first text and
    closed before any tool_use block, each call a block of its own (its input as one JSON delta)."""

    def __init__(self, msg_id: str, model: str, prompt_tokens: int):
        self.msg_id, self.model, self.prompt_tokens = msg_id, model, prompt_tokens
        self.index, self.text_open, self.thinking_open = 0, False, False

    def start(self) -> list[tuple[str, dict]]:
        empty = {"id": self.msg_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                 "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}}
        return [("message_start", {"type": "message_start", "message": empty}), ("ping", {"type": "ping"})]

    def thinking(self, text: str) -> list[tuple[str, dict]]:
        out = []
        if not self.thinking_open:
            out.append(("content_block_start", {"type": "content_block_start", "index": self.index,
                                                "content_block": {"type": "thinking", "thinking": "", "signature": ""}}))
            self.thinking_open = True
        out.append(("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                            "delta": {"type": "thinking_delta", "thinking": text}}))
        return out

    def text(self, text: str) -> list[tuple[str, dict]]:
        out = self._close_thinking()
        if not self.text_open:
            out.append(("content_block_start", {"type": "content_block_start", "index": self.index,
                                                "content_block": {"type": "text", "text": ""}}))
            self.text_open = True
        out.append(("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                            "delta": {"type": "text_delta", "text": text}}))
        return out

    def call(self, call) -> list[tuple[str, dict]]:
        out = self._close_thinking() + self._close_text()
        block = tool_use(call)
        out += [("content_block_start", {"type": "content_block_start", "index": self.index,
                                         "content_block": {**block, "input": {}}}),
                ("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                         "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}}),
                ("content_block_stop", {"type": "content_block_stop", "index": self.index})]
        self.index += 1
        return out

    def finish(self, choice) -> list[tuple[str, dict]]:
        reason, sequence = stop_reason(choice)
        return self._close_thinking() + self._close_text() + [
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                               "usage": {"output_tokens": choice.last.stats.completion_tokens}}),
            ("message_stop", {"type": "message_stop"})]

    def _close_thinking(self) -> list[tuple[str, dict]]:
        """(Anthropic's thinking blocks end with a signature; this server signs nothing: an empty one)"""
        if not self.thinking_open:
            return []
        self.thinking_open = False
        self.index += 1
        return [("content_block_delta", {"type": "content_block_delta", "index": self.index - 1,
                                          "delta": {"type": "signature_delta", "signature": ""}}),
                ("content_block_stop", {"type": "content_block_stop", "index": self.index - 1})]

    def _close_text(self) -> list[tuple[str, dict]]:
        if not self.text_open:
            return []
        self.text_open = False
        self.index += 1
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index - 1})]
