"""OpenAI's wire format, both ways: a request body (a dict from JSON) -> a checked Job, and the
pieces of the answer -> the dicts OpenAI returns. No HTTP and no model here (openai_endpoints.py has those).

    chat_job(body), completion_job(body)    every field checked into a Job holding the generation's
                                            decode.Request; a mistake is ApiError(400, ...)
    chat_response / chat_chunk              chat.completion and chat.completion.chunk objects
    completion_response / completion_chunk  text_completion objects (the legacy endpoint)

Defaults are OpenAI's, not llama.cpp's: temperature 1, top_p 1, no top-k / min-p, and the legacy
completions endpoint stops at 16 tokens unless max_tokens says otherwise; `serve`'s flags replace
them (Defaults), and a request's own values win over both.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache

from ..decode.constrained import from_grammar, from_json_schema
from ..decode.request import Request, RequestError
from ..decode.sampling_plain import MAX_SEED, SamplingParams
from ..errors import GrammarError, InvalidParameterError
from ..formats.tools import parse_tools

MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_TOP_LOGPROBS = 20
MAX_N = 16  # choices per request (each is a row of the engine; OpenAI allows 128)
COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions (chat has none: until the context is full)
JSON_OBJECT = '{"type": "object"}'  # response_format json_object: any JSON object
CACHED_GRAMMARS = 64  # distinct schemas and grammars kept compiled (clients send the same ones again)
# How a request's checks name its fields (decode.Request's spelling), and the field an error names as `param`
SPELLING = {"stop": "stop", "grammar": "response_format or grammar", "tools": "tools", "tool_choice": "tool_choice",
            "logprobs": "top_logprobs", "max_tokens": "max_tokens", "think": "chat_template_kwargs.enable_thinking",
            "reasoning_budget": "reasoning_budget", "reasoning_format": "reasoning_format",
            "reasoning_effort": "reasoning_effort"}
PARAMS = {"grammar": "response_format", "logprobs": "top_logprobs"}


class ApiError(Exception):
    """An answer other than 200, in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}  # HTTP headers the answer carries (Retry-After, Allow)
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Defaults:
    """What `serve`'s flags set for the requests that leave it out (a request's own values win)."""

    sampling: dict = field(default_factory=dict)  # request field (temperature, top_p, seed, ...) -> value
    max_tokens: int | None = None  # both endpoints (else chat: the context; completions: 16)
    system: str | None = None  # chat: a system message for conversations that have none
    grammar: object = None  # constrained.Grammar (--json-schema, --grammar) for requests that ask for no format
    think: bool | None = None  # a reasoning model thinks or not (--think/--no-think), unless the request says
    reasoning_budget: int | None = None  # its thinking tokens at most (--reasoning-budget), unless the request says


@dataclass
class Job:
    """What one HTTP request asks for, checked: the generation (a decode.Request, the same value
    `run`, `chat` and `batch` build) and how to answer. Exactly one of `messages` (chat) and
    `prompt` is set."""

    request: Request
    stream: bool
    include_usage: bool
    model: str | None
    messages: list[dict] | None = None  # [{"role", "content": str, ...}]: system/user/assistant/tool
    prompt: str | list[int] | None = None  # raw text, or token ids
    n: int = 1  # choices, each sampled on its own
    template_kwargs: dict = field(default_factory=dict)  # chat_template_kwargs: more variables for the template


# ------------------------------------------------------------------------------ requests


def chat_job(body: dict, defaults: Defaults = Defaults()) -> Job:
    _refuse(body, _CHAT_UNSUPPORTED)
    messages = _messages(body.get("messages"))
    if defaults.system is not None and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": defaults.system})
    logprobs = None
    if _bool(body, "logprobs"):
        logprobs = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, 0)
    elif body.get("top_logprobs") is not None:
        raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    max_tokens = _integer(body, "max_completion_tokens", 1, None, None)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1, None, defaults.max_tokens)
    schema, grammar = _response_format(body.get("response_format")), _grammar_field(body)
    if schema is not None and grammar is not None:
        raise ApiError(400, "response_format and grammar exclude each other; send one", "grammar")
    tools = _tools(body)
    asks_no_format = schema is None and grammar is None and not tools and body.get("response_format") is None
    grammar = defaults.grammar if asks_no_format else _schema(schema) if schema is not None else _grammar(grammar)
    kwargs = _template_kwargs(body)
    request = _request(_params(body, defaults), max_tokens, _stop(body), grammar, logprobs, body, **tools,
                       **_reasoning(body, kwargs, defaults))
    return Job(request, *_streaming(body), _model(body), messages=messages, n=_integer(body, "n", 1, MAX_N, 1),
               template_kwargs=kwargs)


def completion_job(body: dict, defaults: Defaults = Defaults()) -> Job:
    _refuse(body, _COMPLETION_UNSUPPORTED)
    max_tokens = _integer(body, "max_tokens", 1, None, defaults.max_tokens or COMPLETIONS_MAX_TOKENS)
    grammar = _grammar_field(body)
    grammar = defaults.grammar if grammar is None else _grammar(grammar)
    request = _request(_params(body, defaults), max_tokens, _stop(body), grammar,
                       _integer(body, "logprobs", 0, MAX_TOP_LOGPROBS, None), body)
    return Job(request, *_streaming(body), _model(body), prompt=_prompt(body.get("prompt")),
               n=_integer(body, "n", 1, MAX_N, 1))


def _request(params: SamplingParams, max_tokens, stop, grammar, logprobs, body: dict, **fields) -> Request:
    """The generation asked for, checked as every front end's is; a clash is a 400 naming its field."""
    try:
        return Request(params, max_tokens, stop, grammar=grammar, logprobs=logprobs,
                       cache_prompt=_bool(body, "cache_prompt", default=True), spelling=SPELLING, **fields)
    except RequestError as e:
        raise ApiError(400, str(e), PARAMS.get(e.field, e.field)) from None
    except InvalidParameterError as e:
        raise ApiError(400, str(e)) from None


@lru_cache(maxsize=CACHED_GRAMMARS)
def _schema(text: str):
    """response_format's schema, checked and compiled once per distinct text."""
    try:
        return from_json_schema(text, "response_format's schema")
    except GrammarError as e:
        raise ApiError(400, str(e), "response_format") from None


@lru_cache(maxsize=CACHED_GRAMMARS)
def _grammar(text: str | None):
    """llama.cpp's `grammar` field (GBNF or Lark), checked and compiled once per distinct text."""
    if text is None:
        return None
    try:
        return from_grammar(text, "grammar")
    except GrammarError as e:
        raise ApiError(400, str(e), "grammar") from None


def _template_kwargs(body: dict) -> dict:
    """chat_template_kwargs (vLLM's and llama-server's): variables for the chat template, e.g.
    {"enable_thinking": false}; JSON-like values only."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise ApiError(400, "chat_template_kwargs must be an object of template variables", "chat_template_kwargs")
    if any(k in ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token") for k in kwargs):
        raise ApiError(400, "chat_template_kwargs may not set messages, tools, add_generation_prompt or the "
                            "special tokens", "chat_template_kwargs")
    return kwargs


def _reasoning(body: dict, kwargs: dict, defaults: Defaults = Defaults()) -> dict:
    """The thinking a request asks for: reasoning_format (none: the tags stay in content),
    reasoning_budget (llama-server's; -1: no limit), reasoning_effort (gpt-oss), and the switch
    chat_template_kwargs.enable_thinking (which the template reads as it is)."""
    fmt = body.get("reasoning_format")
    if fmt is not None and not isinstance(fmt, str):
        raise ApiError(400, "reasoning_format must be a string: auto, deepseek or none", "reasoning_format")
    budget = _integer(body, "reasoning_budget", -1, None, defaults.reasoning_budget)
    think = kwargs.get("enable_thinking", defaults.think)
    effort = body.get("reasoning_effort")
    if effort is None and isinstance(body.get("reasoning"), dict):  # the Responses API's shape
        effort = body["reasoning"].get("effort")
    if effort == "minimal":  # OpenAI's lowest; gpt-oss knows low, medium, high
        effort = "low"
    return {"reasoning_format": fmt or "auto", "reasoning_budget": None if budget in (None, -1) else budget,
            "think": think if isinstance(think, bool) else None, "reasoning_effort": effort}


def _tools(body: dict) -> dict:
    """`tools`, `tool_choice` and `parallel_tool_calls` as the request's fields (tool_choice "none":
    no tools offered); the request checks how they combine with the rest."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(400, 'tool_choice must be "none", "auto", "required" or {"type": "function", '
                                '"function": {"name": ...}}', "tool_choice")
        choice = fn["name"]
    elif choice not in (None, "none", "auto", "required"):
        raise ApiError(400, f'tool_choice must be "none", "auto", "required" or a function, got {choice!r}', "tool_choice")
    if body.get("tools") is None:
        return {} if choice in (None, "none") else {"tool_choice": choice}
    try:
        tools = parse_tools(body["tools"])
    except InvalidParameterError as e:
        raise ApiError(400, str(e), "tools") from None
    if choice == "none":
        return {}
    return {"tools": tuple(tools), "tool_choice": choice or "auto",
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False}


# field -> (is it asking for something this server does not do?, what to say)
_CHAT_UNSUPPORTED = {
    "functions": (lambda v: bool(v), "functions (deprecated by OpenAI) are not supported; send them as tools"),
    "logit_bias": (lambda v: bool(v), "logit_bias is not supported by this server"),
    "audio": (lambda v: True, "audio output is not supported by this server"),
    "modalities": (lambda v: any(m != "text" for m in (v if isinstance(v, list) else [v])), "only the text modality is supported"),
    "prediction": (lambda v: True, "predicted outputs are not supported by this server"),
}
_COMPLETION_UNSUPPORTED = {
    "best_of": (lambda v: v != 1, "best_of must be 1: this server does not rank choices (n gives several)"),
    "echo": (lambda v: bool(v), "echo is not supported by this server"),
    "suffix": (lambda v: bool(v), "suffix (insertion) is not supported by this server"),
    "logit_bias": _CHAT_UNSUPPORTED["logit_bias"],
}


def _refuse(body: dict, unsupported: dict) -> None:
    """400 for a field that would change the answer in a way this server cannot honour (unknown
    fields are ignored, as llama.cpp and vLLM do: clients add their own)."""
    for key, (asks, why) in unsupported.items():
        if body.get(key) is not None and asks(body[key]):
            raise ApiError(400, why, key)


def _params(body: dict, defaults: Defaults = Defaults()) -> SamplingParams:
    d = defaults.sampling
    top_p = _number(body, "top_p", 0, 1, d.get("top_p", 1.0))
    top_k = _integer(body, "top_k", 0, None, d.get("top_k", 0))
    if top_p == 0:  # the smallest set of tokens reaching probability 0: the most likely one
        top_p, top_k = 1.0, 1
    seed = _integer(body, "seed", -1, MAX_SEED, d.get("seed", -1))
    try:
        return SamplingParams(
            temperature=_number(body, "temperature", 0, 2, d.get("temperature", 1.0)), top_k=top_k, top_p=top_p,
            min_p=_number(body, "min_p", 0, 0.999999, d.get("min_p", 0.0)),
            repeat_penalty=_number(body, "repeat_penalty", 1e-6, None, d.get("repeat_penalty", 1.0)),
            repeat_last_n=_integer(body, "repeat_last_n", -1, None, d.get("repeat_last_n", 64)),
            presence_penalty=_number(body, "presence_penalty", -2, 2, d.get("presence_penalty", 0.0)),
            frequency_penalty=_number(body, "frequency_penalty", -2, 2, d.get("frequency_penalty", 0.0)), seed=seed)
    except InvalidParameterError as e:  # the ranges above should catch everything first
        raise ApiError(400, str(e)) from None


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP:
        raise ApiError(400, f"stop takes at most {MAX_STOP} sequences, got {len(stops)}", "stop")
    return tuple(s for s in stops if s)


def _streaming(body: dict) -> tuple[bool, bool]:
    stream = _bool(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    return stream, stream and _bool(options, "include_usage", "stream_options.include_usage")


def _model(body: dict) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "model must be a string", "model")
    return model


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def _messages(messages) -> list[dict]:
    """[{"role", "content"}]; an assistant message may carry `tool_calls` (then its content may be
    null), a tool message its `tool_call_id` (and `name`), kept for the template."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where} must be an object with role and content", where)
        role = m.get("role")
        if role not in _ROLES:
            raise ApiError(400, f"{where}.role {role!r} is not supported; use system, developer, user, assistant "
                                "or tool", f"{where}.role")
        message = {"role": _ROLES[role]}
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls:
            if not isinstance(calls, list):
                raise ApiError(400, f"{where}.tool_calls must be a list of calls", f"{where}.tool_calls")
            message["tool_calls"] = calls
        content = m.get("content")
        message["content"] = "" if content is None and calls else _content(content, f"{where}.content")
        for key in ("tool_call_id", "name") if role == "tool" else ():
            if isinstance(m.get(key), str):
                message[key] = m[key]
        thought = m.get("reasoning_content", m.get("thinking")) if role == "assistant" else None
        if isinstance(thought, str) and thought:  # for templates that render it (Qwen3's, gpt-oss's `thinking`)
            message["reasoning_content"] = message["thinking"] = thought
        out.append(message)
    return out


def _content(content, where: str) -> str:
    """A message's text: a string, or a list of text parts (joined by newlines, as vLLM does)."""
    return text_parts(content, where)


def text_parts(content, where: str, kinds: tuple[str, ...] = ("text",), named: str = "text parts") -> str:
    """A string, or a list of parts of `kinds` (`named` so in the error) joined by newlines: the chat
    endpoint's content, and the Responses API's (input_text, output_text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in kinds or not isinstance(part.get("text"), str):
                raise ApiError(400, f"{where}: only {named} are supported, got {kind or type(part).__name__!r}", where)
            texts.append(part["text"])
        return "\n".join(texts)
    raise ApiError(400, f"{where} must be a string or a list of text parts", where)


def _prompt(prompt) -> str | list[int]:
    """A string or token ids; a list of one of those (OpenAI's batch form) with exactly one item."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) != 1:
            raise ApiError(400, "prompt holds several prompts; send one per request", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return prompt
    raise ApiError(400, "prompt must be a string or a list of token ids", "prompt")


def _grammar_field(body: dict) -> str | None:
    """llama.cpp's `grammar`: a GBNF grammar as llama.cpp users write them (or llguidance's Lark)."""
    grammar = body.get("grammar")
    if grammar is None or grammar == "":
        return None
    if not isinstance(grammar, str):
        raise ApiError(400, "grammar must be a string: a GBNF grammar (root ::= ...) or a Lark one", "grammar")
    return grammar


def _response_format(fmt) -> str | None:
    """The JSON Schema text the output must follow, or None (plain text)."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ApiError(400, "response_format.json_schema must be an object with a schema", "response_format")
        return json.dumps(spec["schema"])
    raise ApiError(400, f"response_format.type must be text, json_object or json_schema, got {kind!r}", "response_format")


def _number(body: dict, key: str, lo: float | None, hi: float | None, default):
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ApiError(400, f"{key} must be a number, got {value!r}", key)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ApiError(400, f"{key} must be {_range(lo, hi)}, got {value!r}", key)
    return value


def _integer(body: dict, key: str, lo: int | None, hi: int | None, default):
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key} must be a whole number, got {value!r}", key)
    return _number(body, key, lo, hi, default)


def _range(lo, hi) -> str:
    return f"from {lo} to {hi}" if lo is not None and hi is not None else f"at least {lo}"


def _bool(body: dict, key: str, name: str | None = None, default: bool = False) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{name or key} must be true or false, got {value!r}", name or key)
    return default if value is None else value


# ------------------------------------------------------------------------------ answers


def head(prefix: str, model: str) -> dict:
    """The fields every object of one answer shares (each streamed chunk repeats them)."""
    return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": model,
            "system_fingerprint": None}


def usage(stats: list) -> dict:
    """Over the choices of one request: the prompt counted once, every choice's tokens; cached_tokens:
    prompt tokens whose KV came from the prompt cache."""
    prompt, completion = stats[0].prompt_tokens, sum(s.completion_tokens for s in stats)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": stats[0].cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": sum(s.reasoning_tokens for s in stats)}}


def _stopped(stopped_by: str | None) -> dict:
    """OpenAI says "length" for both limits; llmcli adds which one ended it: max_tokens or the context."""
    return {"stopped_by": stopped_by} if stopped_by else {}


def tool_call(call, index: int | None = None) -> dict:
    """A formats.tool_reply.Call as OpenAI writes it (with its index in a streamed delta)."""
    where = {"index": index} if index is not None else {}
    return {**where, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": call.name, "arguments": call.json()}}


def chat_choice(index: int, content: str | None, finish: str, logprobs: list[dict] | None, stopped_by: str | None,
                calls: list | None = None, reasoning: str | None = None) -> dict:
    message = {"role": "assistant", "content": content, "refusal": None}
    if reasoning:  # llama-server's and vLLM's field for a reasoning model's thinking
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [tool_call(c) for c in calls]
    return {"index": index, "message": message,
            "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
            "finish_reason": finish, **_stopped(stopped_by)}


def chat_response(head: dict, choices: list[dict], stats: list) -> dict:
    return {**head, "object": "chat.completion", "choices": choices, "usage": usage(stats),
            "timings": stats[0].as_dict()}  # llama.cpp's extra (the first choice's)


def chat_chunk(head: dict, delta: dict | None, finish: str | None = None, logprobs: list[dict] | None = None,
               stats: list | None = None, with_usage: bool = False, stopped_by: str | None = None,
               index: int = 0) -> dict:
    """One streamed event; `delta` None: the usage-only chunk that ends an include_usage stream."""
    out = {**head, "object": "chat.completion.chunk", "choices": []}
    if delta is not None:
        out["choices"] = [{"index": index, "delta": delta, "finish_reason": finish,
                           "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
                           **_stopped(stopped_by)}]
    if with_usage:  # OpenAI: null on every chunk but the last, which carries it
        out["usage"] = usage(stats) if stats is not None else None
    return out


def completion_choice(index: int, text: str, finish: str, logprobs: dict | None, stopped_by: str | None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish, **_stopped(stopped_by)}


def completion_response(head: dict, choices: list[dict], stats: list) -> dict:
    return {**head, "object": "text_completion", "choices": choices, "usage": usage(stats),
            "timings": stats[0].as_dict()}


def completion_chunk(head: dict, text: str | None, finish: str | None = None, logprobs: dict | None = None,
                     stats: list | None = None, with_usage: bool = False, stopped_by: str | None = None,
                     index: int = 0) -> dict:
    out = {**head, "object": "text_completion", "choices": []}
    if text is not None:
        out["choices"] = [completion_choice(index, text, finish, logprobs, stopped_by)]
    if with_usage:
        out["usage"] = usage(stats) if stats is not None else None
    return out
