"""ollama's API (`/api/...`), both ways, over the chat and completion endpoints' machinery: an ollama
body -> the same checked openai_api.Job a chat completion (or, for `raw` generate, a completion)
makes, and the answer -> ollama's objects, whole or as NDJSON lines. No HTTP here (ollama_endpoints.py has it);
`describe` reads the runtime's facts for /api/tags, /api/ps and /api/show.

    chat_job(body, defaults)                /api/chat: messages (ollama's tool_calls, tool_name,
                                            thinking), tools, format, think, options -> a Job; None
                                            for a load request (no messages)
    generate_job(body, defaults)            /api/generate: prompt + system through the chat template,
                                            or raw; None for a load request (no prompt)
    check_context(body, context)            options.num_ctx against the model's context (known once
                                            the request's model is)
    Answer                                  the streamed lines and the whole object, with ollama's
                                            done_reason and durations (nanoseconds)
    embed_body / embeddings_body            /api/embed and /api/embeddings as the embeddings body
    error_body(ApiError)                    {"error": message}

A request's options left out take serve's defaults (its flags, else OpenAI's), as every endpoint of
this server does; ollama's per-model Modelfile parameters do not exist here.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache

from ..decode.constrained import from_json_schema
from ..errors import GrammarError
from ..formats.tools import ToolsUnsupportedError
from ..runtime.embedder import floats
from . import openai_api as api
from .choices import ChatChoice
from .openai_api import ApiError

NEVER = "9999-12-31T23:59:59Z"  # /api/ps expires_at: the model stays until the server stops

# ollama's option -> the chat body's field it sets (the same checks as there)
OPTIONS = {"num_predict": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
           "min_p": "min_p", "seed": "seed", "stop": "stop", "repeat_penalty": "repeat_penalty",
           "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty"}
# options that would change the answer in a way this server cannot honour: refused, never ignored
# (the others, num_thread, num_gpu, num_batch, use_mmap, ..., say how ollama runs, not what it answers)
REFUSED = {"mirostat": lambda v: v not in (None, 0), "typical_p": lambda v: v not in (None, 1, 1.0),
           "tfs_z": lambda v: v not in (None, 1, 1.0)}
# the chat endpoint's words in its error messages -> the ollama request's (longest first)
WORDS = [("response_format or grammar", "format"), ("response_format", "format"), ("max_tokens", "options.num_predict"),
         *((ours, f"options.{theirs}") for theirs, ours in OPTIONS.items() if ours != "max_tokens"),
         ("chat_template_kwargs.enable_thinking", "think"), ("reasoning_effort", "think")]


def error_body(e: ApiError) -> dict:
    return {"error": e.message}


def renamed(e: ApiError) -> ApiError:
    """The chat endpoint's error in the ollama request's words (max_tokens -> options.num_predict)."""
    message = e.message
    for ours, theirs in WORDS:
        message = re.sub(rf"(?<![\w.]){re.escape(ours)}(?!\w)", theirs, message)
    return ApiError(e.status, message, e.param, e.code, headers=e.headers)


def model_name(body: dict) -> str | None:
    """The request's model; ollama's implicit tag `:latest` is the name without it."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "model must be a string", "model")
    return model.removesuffix(":latest") if model else model


# ------------------------------------------------------------------------------ requests


def chat_job(body: dict, defaults: api.Defaults) -> api.Job | None:
    """/api/chat as the chat endpoint's Job; None: no messages (ollama's way to load a model)."""
    messages = body.get("messages")
    if messages is None or messages == []:
        _common(body)  # (checked all the same)
        return None
    chat = {"messages": _messages(messages), **_common(body)}
    if body.get("tools"):
        chat["tools"] = body["tools"]  # OpenAI's shape already: {type: function, function: {name, ...}}
    return _checked(api.chat_job, chat, defaults)


def generate_job(body: dict, defaults: api.Defaults) -> api.Job | None:
    """/api/generate: `prompt` (with `system`) through the chat template, or `raw` as it is; None:
    no prompt (ollama's way to load a model)."""
    for key, why in (("template", "a template override is not supported: the model's own chat template is used "
                                  "(serve --chat-template-file replaces it for every request)"),
                     ("suffix", "suffix (fill-in-the-middle) is not supported by this server"),
                     ("context", "context (the token ids of an earlier answer) is not supported; send the "
                                 "conversation to /api/chat instead")):
        if body.get(key):
            raise ApiError(400, why, key)
    _no_images(body.get("images"), "images")
    prompt, system = body.get("prompt"), body.get("system")
    for key, value in (("prompt", prompt), ("system", system)):
        if value is not None and not isinstance(value, str):
            raise ApiError(400, f"{key} must be a string", key)
    common = _common(body)
    if not prompt:
        return None
    if _bool(body, "raw"):
        return _raw(prompt, common, defaults)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return _checked(api.chat_job, {"messages": messages, **common}, defaults)


def _raw(prompt: str, common: dict, defaults: api.Defaults) -> api.Job:
    """A raw prompt: no template, no thinking switch; format still constrains the answer."""
    fmt = common.pop("response_format", None)
    common.pop("chat_template_kwargs", None)
    common.pop("reasoning_effort", None)
    if common.pop("logprobs", False):  # (the completions endpoint's logprobs: how many alternatives)
        common["logprobs"] = common.pop("top_logprobs", 0)
    job = _checked(api.completion_job, {"prompt": prompt, **common}, defaults)
    changes = {}
    if "max_tokens" not in common and defaults.max_tokens is None:
        changes["max_tokens"] = None  # until the context is full, as chat (completions would stop at 16)
    if fmt is not None:
        changes["grammar"] = _schema(api.JSON_OBJECT if fmt["type"] == "json_object" else
                                     json.dumps(fmt["json_schema"]["schema"]))
    if changes:
        job.request = job.request.with_(api.SPELLING, **changes)
    return job


def _checked(make, body: dict, defaults: api.Defaults) -> api.Job:
    try:
        return make(body, defaults)
    except ApiError as e:
        raise renamed(e) from None


def _common(body: dict) -> dict:
    """What chat and generate share, as the chat body's fields: model, stream (ollama's default:
    true), options, format, think, logprobs and top_logprobs (keep_alive: keep_alive())."""
    out = {"model": model_name(body), "stream": _bool(body, "stream", True), **_options(body.get("options"))}
    fmt = _format(body.get("format"))
    if fmt is not None:
        out["response_format"] = fmt
    out.update(_think(body.get("think")))
    if _bool(body, "logprobs"):
        out["logprobs"] = True
        if body.get("top_logprobs") is not None:
            out["top_logprobs"] = body["top_logprobs"]
    keep_alive(body)  # (checked here; the endpoint applies it)
    return out


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def keep_alive(body: dict) -> float | None | str:
    """keep_alive as the seconds the model stays idle after this request: None (a negative
    duration: for good), "same" (not given); "5m", "1h30m", "30s" or a number of seconds."""
    keep = body.get("keep_alive")
    if keep is None:
        return "same"
    seconds = None
    if not isinstance(keep, bool) and isinstance(keep, (int, float)):
        seconds = float(keep)
    elif isinstance(keep, str):
        parts = re.findall(r"(-?[0-9.]+)(ms|s|m|h)", keep.strip())
        if parts and "".join(n + u for n, u in parts) == keep.strip():
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
        elif re.fullmatch(r"-?[0-9]+", keep.strip()):
            seconds = float(keep)
    if seconds is None or seconds != seconds:
        raise ApiError(400, f"keep_alive must be a duration such as \"5m\" or a number of seconds, got {keep!r}",
                       "keep_alive")
    return None if seconds < 0 else seconds


def _options(options) -> dict:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ApiError(400, "options must be an object (num_predict, temperature, top_k, ...)", "options")
    for key, asks in REFUSED.items():
        if asks(options.get(key)):
            raise ApiError(400, f"options.{key} is not supported by this server; leave it out", f"options.{key}")
    num_ctx = options.get("num_ctx")
    if num_ctx is not None and (isinstance(num_ctx, bool) or not isinstance(num_ctx, int) or num_ctx < 1):
        raise ApiError(400, f"options.num_ctx must be a whole number of at least 1, got {num_ctx!r}", "options.num_ctx")
    out = {ours: options[theirs] for theirs, ours in OPTIONS.items() if options.get(theirs) is not None}
    if out.get("max_tokens") in (-1, -2):  # ollama's "no limit" and "fill the context": until the context is full
        del out["max_tokens"]
    return out


def check_context(body: dict, context: int) -> None:
    """options.num_ctx larger than the model's context a request: a 400 that says the size (a
    smaller one is taken: the request's row is the server's size)."""
    options = body.get("options")
    num_ctx = options.get("num_ctx") if isinstance(options, dict) else None
    if num_ctx is not None and num_ctx > context:
        raise ApiError(400, f"options.num_ctx is {num_ctx} tokens, more than this server's context of {context} "
                            "tokens a request; ask for at most that, or restart llmcli serve with a larger "
                            "-c/--ctx-size", "options.num_ctx")


def _format(fmt) -> dict | None:
    """format "json" (any JSON) or a JSON Schema object, as the chat body's response_format."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise ApiError(400, f'format must be "json" or a JSON Schema object, got {fmt!r}', "format")


def _think(think) -> dict:
    """think true/false: a reasoning model's switch; "low", "medium", "high": on, with that effort (gpt-oss)."""
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"chat_template_kwargs": {"enable_thinking": think}}
    if think in ("low", "medium", "high"):
        return {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": think}
    raise ApiError(400, f'think must be true, false, "low", "medium" or "high", got {think!r}', "think")


def _messages(messages) -> list[dict]:
    """ollama's messages -> OpenAI's: an assistant's tool_calls ({function: {name, arguments: object}})
    with arguments as a JSON string, a tool message's tool_name as its name."""
    if not isinstance(messages, list):
        raise ApiError(400, "messages must be a list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where} must be an object with role and content", where)
        _no_images(m.get("images"), f"{where}.images")
        message = {k: m[k] for k in ("role", "content", "thinking") if m.get(k) is not None}
        message.setdefault("content", "")
        if m.get("tool_calls"):
            message["tool_calls"] = _calls(m["tool_calls"], f"{where}.tool_calls")
        if isinstance(m.get("tool_name"), str):
            message["name"] = m["tool_name"]
        out.append(message)
    return out


def _calls(calls, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise ApiError(400, f"{where} must be a list of {{function: {{name, arguments}}}} objects", where)
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(400, f"{where}[{j}] must be {{function: {{name, arguments}}}}", f"{where}[{j}]")
        args = fn.get("arguments", {})
        out.append({"id": str(call.get("id") or f"call_{j}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return out


def _no_images(images, where: str) -> None:
    if images:
        raise ApiError(400, f"{where}: this server's models read text only; images are not supported", where)


def _bool(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{key} must be true or false, got {value!r}", key)
    return default if value is None else value


@lru_cache(maxsize=api.CACHED_GRAMMARS)
def _schema(text: str):
    """A raw generate's format, compiled once per distinct schema (chat's goes through response_format)."""
    try:
        return from_json_schema(text, "format's schema")
    except GrammarError as e:
        raise ApiError(400, str(e), "format") from None


def embed_body(body: dict) -> dict:
    """/api/embed -> the embeddings endpoint's body: input (a string or strings), truncate (ollama's
    default: true, cut a text that is too long), dimensions."""
    truncate = body.get("truncate")
    return {"model": model_name(body), "input": body.get("input"), "truncate": True if truncate is None else truncate,
            **({"dimensions": body["dimensions"]} if body.get("dimensions") is not None else {})}


def embeddings_body(body: dict) -> dict:
    """The older /api/embeddings: one `prompt`."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "prompt must be a non-empty string (the text to embed)", "prompt")
    return {"model": model_name(body), "input": prompt, "truncate": True}


# ------------------------------------------------------------------------------ answers


def now() -> str:
    """ollama's timestamps: RFC 3339 in UTC."""
    return _time(time.time())


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def loaded(kind: str, model: str, reason: str = "load") -> dict:
    """The answer to a load request (no prompt or messages): the model is loaded (or, with
    keep_alive 0, unloaded: reason "unload")."""
    out = {"model": model, "created_at": now(), "done": True, "done_reason": reason}
    return {**out, **({"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""})}


def embed_response(model: str, vectors, tokens: int, started: float) -> dict:
    return {"model": model, "embeddings": [floats(v) for v in vectors], "total_duration": _ns(time.monotonic() - started),
            "load_duration": 0, "prompt_eval_count": tokens}


def embedding_response(vector) -> dict:
    """The older /api/embeddings' answer: one vector."""
    return {"embedding": floats(vector)}


class Answer:
    """One /api/chat or /api/generate answer: the lines of its stream as chunks come (push) and the
    whole object (whole); `started` (time.monotonic()) is when the request arrived."""

    def __init__(self, kind: str, model: str, started: float):
        self.kind, self.model, self.started = kind, model, started

    def _object(self, text: str = "", thinking: str = "", calls: list | None = None) -> dict:
        out = {"model": self.model, "created_at": now()}
        if self.kind == "chat":
            message = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        return out

    def push(self, choice, chunk) -> list[dict]:
        """The lines for one engine chunk (its choice pushed), the last one with done: true."""
        lines = []
        if isinstance(choice, ChatChoice):
            for delta, entries in choice.push(chunk):
                calls = [_call(c["function"]["name"], json.loads(c["function"]["arguments"]))
                         for c in delta.get("tool_calls", [])]
                if delta.get("content") or delta.get("reasoning_content") or calls or entries:
                    lines.append({**self._object(delta.get("content", ""), delta.get("reasoning_content", ""), calls),
                                  **_logprobs(entries), "done": False})
        else:
            legacy = choice.push(chunk)
            entries = _from_legacy(legacy) if legacy is not None else None
            if chunk.text or entries:
                lines.append({**self._object(chunk.text), **_logprobs(entries), "done": False})
        if chunk.finish_reason is not None:
            lines.append({**self._object(), **self.done(choice)})
        return lines

    def whole(self, choice) -> dict:
        thinking = "".join(getattr(choice, "thoughts", []))
        calls = [_call(c.name, json.loads(c.json())) for c in getattr(choice, "calls", [])]
        if choice.cursor is None:
            entries = None
        elif isinstance(choice, ChatChoice):
            entries = choice.entries
        else:
            entries = [e for part in choice.parts for e in _from_legacy(part)]
        return {**self._object("".join(choice.pieces), thinking, calls), **_logprobs(entries), **self.done(choice)}

    def done(self, choice) -> dict:
        """done_reason (ollama's: stop or length; a tool call is a stop) and the durations in nanoseconds."""
        stats = choice.last.stats
        return {"done": True, "done_reason": "length" if choice.last.finish_reason == "length" else "stop",
                "total_duration": _ns(time.monotonic() - self.started), "load_duration": 0,
                "prompt_eval_count": stats.prompt_tokens, "prompt_eval_duration": _ns(stats.prefill_s),
                "eval_count": stats.completion_tokens, "eval_duration": _ns(stats.decode_s)}


def _logprobs(entries: list[dict] | None) -> dict:
    """ollama's logprobs: OpenAI chat's entries ({token, logprob, bytes, top_logprobs}) as they are."""
    return {"logprobs": entries} if entries else {}


def _from_legacy(lp: dict) -> list[dict]:
    """The completions endpoint's parallel lists as chat's entries."""
    return [{"token": t, "logprob": p, "top_logprobs": [{"token": a, "logprob": q} for a, q in top.items()]}
            for t, p, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])]


def _call(name: str, arguments: dict) -> dict:
    return {"function": {"name": name, "arguments": arguments}}


# ------------------------------------------------------------------------------ the model, described


@dataclass
class Described:
    """What /api/tags, /api/ps and /api/show say of the model served."""

    name: str
    size: int  # the weights' bytes on disk
    digest: str
    modified_at: str
    details: dict
    context: int
    vram: bool
    memory: int = 0  # what it holds loaded: weights and KV cache
    expires_at: str = NEVER
    model_info: dict = field(default_factory=dict)
    template: str = ""
    parameters: str = ""
    capabilities: list[str] = field(default_factory=list)

    def tag(self) -> dict:
        return {"name": self.name, "model": self.name, "modified_at": self.modified_at, "size": self.size,
                "digest": self.digest, "details": self.details}

    def process(self) -> dict:
        return {**self.tag(), "size": self.memory, "expires_at": self.expires_at,
                "size_vram": self.memory if self.vram else 0, "context_length": self.context}

    def show(self) -> dict:
        return {"modelfile": "", "parameters": self.parameters, "template": self.template, "details": self.details,
                "model_info": self.model_info, "capabilities": self.capabilities, "modified_at": self.modified_at}


def describe(rt, name: str, context: int, defaults: api.Defaults, embeds: bool, memory: int,
             expires_at: float | None) -> Described:
    """A served model's facts from its runtime: files, architecture, size, what it can do, the
    memory it holds and when it unloads (wall-clock seconds; None: never). The digest is a hash of
    the model's path, size and modification time, not of its content (hashing gigabytes at each
    listing would be slow); it changes when the file does."""
    loaded, args = rt.loaded, rt.loaded.args
    arch = loaded.metadata.get("architecture") or getattr(args, "model_type", "unknown")
    count = _parameters(args)
    stat = loaded.path.stat()
    digest = hashlib.sha256(f"{loaded.path.resolve()}:{loaded.weights_bytes}:{stat.st_mtime_ns}".encode()).hexdigest()
    details = {"parent_model": "", "format": loaded.format, "family": arch, "families": [arch],
               "parameter_size": _size(count), "quantization_level": loaded.weights_type.split(" ")[0]}
    device = getattr(rt.placement, "backend", "cpu")
    return Described(name, loaded.weights_bytes, digest, _time(stat.st_mtime), details, context,
                     device not in ("cpu", None), memory, NEVER if expires_at is None else _time(expires_at),
                     _model_info(arch, args, count, loaded), loaded.chat_template or "",
                     _parameter_text(defaults, context), _capabilities(rt, embeds))


def stored_tag(name: str, path, size: int) -> dict:
    """/api/tags' entry for a model on disk, not loaded: what the file system says (its size, time
    and a digest of path, size and time, as describe's), no header read (a listing of many large
    files stays quick); details left empty but the format."""
    stat = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}:{size}:{stat.st_mtime_ns}".encode()).hexdigest()
    details = {"parent_model": "", "format": "gguf" if path.suffix == ".gguf" else "safetensors", "family": "",
               "families": [], "parameter_size": "", "quantization_level": ""}
    return {"name": name, "model": name, "modified_at": _time(stat.st_mtime), "size": size, "digest": digest,
            "details": details}


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def _parameters(args) -> int | None:
    try:
        return args.parameter_count()
    except Exception:  # (an architecture whose args do not count themselves: show leaves it out)
        return None


def _size(count: int | None) -> str:
    """ollama's parameter_size: 134.52M, 7.2B."""
    if count is None:
        return ""
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.2f}M"


def _model_info(arch: str, args, count: int | None, loaded) -> dict:
    """ollama's model_info keys (GGUF's names) for what the model's args say."""
    keys = {"context_length": "max_position_embeddings", "embedding_length": "hidden_size",
            "block_count": "num_hidden_layers", "feed_forward_length": "intermediate_size",
            "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
            "attention.key_length": "head_dim", "rope.freq_base": "rope_theta", "vocab_size": "vocab_size"}
    info = {"general.architecture": arch, "general.parameter_count": count, "general.name": loaded.metadata.get("name")}
    info.update({f"{arch}.{k}": getattr(args, v, None) for k, v in keys.items()})
    return {k: v for k, v in info.items() if v is not None}


def _parameter_text(defaults: api.Defaults, context: int) -> str:
    """The server's request defaults as ollama's parameter lines ("temperature 0.7")."""
    theirs = {ours: name for name, ours in OPTIONS.items()}
    lines = [f"num_ctx {context}"]
    lines += [f"{theirs[k]} {v}" for k, v in defaults.sampling.items() if k in theirs]
    if defaults.max_tokens is not None:
        lines.append(f"num_predict {defaults.max_tokens}")
    return "\n".join(lines)


def _capabilities(rt, embeds: bool) -> list[str]:
    out = ["completion"] if rt.generates else []
    if rt.generates:
        try:
            rt.tool_support()
            out.append("tools")
        except ToolsUnsupportedError:  # its template takes none
            pass
        if rt.reasoning_format is not None:
            out.append("thinking")
    return out + (["embedding"] if embeds else [])
