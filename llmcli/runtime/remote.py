"""A remote engine: Runtime's face for `run`, `chat`, `batch` and `bench` (`--api URL`), answered by
an OpenAI-compatible server (vLLM, llama-server, another `llmcli serve`) over HTTP.

    rt = open_remote("http://127.0.0.1:8000/v1", key=None, model=None)   GET /models: the model, checked
    ids = rt.prompt_ids(messages)            a RemotePrompt: the messages (the server applies its template)
    for chunk in rt.generate(ids, request, rt.new_cache()): ...          a streamed chat completion

The request value maps onto the chat body (sampling, max_tokens, stop, seed, a JSON schema as
response_format, a regex or grammar as llama.cpp's `grammar`, thinking as chat_template_kwargs), and
the answer's deltas, finish_reason and usage come back as decode.stream Chunks and Stats, with the
time to first token and tokens/s measured here. `--raw` goes to /completions as plain text. Tools
go as OpenAI's `tools`; the calls that come back are handed to the CallReader that run and chat
read local replies with (as Hermes-style text, marked by the OPENER token), which checks each call's
arguments against its tool. What cannot go over the wire (token ids, beams, guesses, logprobs, a
context shift) is refused before anything is sent (check_request).
"""

from __future__ import annotations

import json
import time
from contextlib import closing
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Iterator

from ..decode.request import Request
from ..decode.stream import Chunk, Generation, Stats
from ..errors import InvalidParameterError
from ..formats.chat_template import plain_prompt
from ..formats.tool_reply import CallReader
from ..formats.tools import HERMES
from .loaded import LoadedModel
from .remote_http import Endpoint, RemoteError

NO_TOKEN = -1  # Chunk.tokens of a streamed delta: one token's place (the server sends text, not ids)
OPENER = -2  # Chunk.tokens of the chunk that carries the server's tool calls (CallReader's opener)
# what stands for the grammar of the calls where a message names it (incomplete_message)
TOOL_CALLS = SimpleNamespace(kind="tools", what="the tool call")
CHARS_PER_TOKEN = 4  # a prompt's length in tokens, estimated (English text through a BPE vocabulary)
UNKNOWN_CONTEXT = 1 << 20  # the server's context when neither it nor --ctx-size says: the server decides
# GET /models card fields that name the context (vLLM's, llama-server's, others')
CONTEXT_FIELDS = ("max_model_len", "context_length", "context_window", "n_ctx")


@dataclass(frozen=True, eq=False)
class RemotePrompt:
    """What prompt_ids returns here: the messages themselves; len() is an estimate of their tokens
    (for the REPL's context fitting and batch's catch-up room; the server counts exactly)."""

    messages: tuple
    raw: bool = False  # plain text to /completions, no chat template
    variables: dict = field(default_factory=dict)  # chat_template_kwargs

    def __len__(self) -> int:
        chars = sum(len(m.get("content") or "") for m in self.messages)
        return max(1, -(-chars // CHARS_PER_TOKEN) + 4 * len(self.messages))


class RemoteConstraint:
    """Stands where a TokenConstraint would: the server constrains; the finished text is checked here
    (run's check_constrained, batch's check_output) all the same."""

    remote = True
    reasoning = None
    mean_s = first_s = 0.0

    def is_accepting(self) -> bool:
        return True


class RemoteRuntime:
    """What `run`, `chat`, `batch` and `bench` ask of a runtime.Runtime, over HTTP."""

    remote = True
    generates = True
    native_decodes = False
    plan = None
    kv_type = None
    registry_quant = None
    reasoning_format = None  # unknown here: the server splits thinking off (reasoning_content) or not

    def __init__(self, api: Endpoint, model: str, ctx_size: int, loaded: LoadedModel, context_known: bool):
        self.api, self.model, self.ctx_size, self.loaded = api, model, ctx_size, loaded
        self.context_known = context_known  # the server or --ctx-size said it

    @property
    def placement(self):
        return self.loaded.placement

    # ------------------------------------------------------------------ Runtime's calls

    def prompt_ids(self, messages: list[dict], raw: bool = False, tools=None, request: Request | None = None,
                   variables: dict | None = None) -> RemotePrompt:
        if tools and raw:
            raise InvalidParameterError("--tools needs the chat template, which --raw leaves out; drop one")
        return RemotePrompt(tuple(dict(m) for m in messages), raw, dict(variables or {}))

    def reasoning(self, prompt, request: Request):
        return None  # (the server's)

    def grammar(self, request: Request):
        return TOOL_CALLS if request.tools else request.grammar

    def constraint(self, request: Request):
        return RemoteConstraint() if request.grammar is not None else None

    def call_reader(self, request: Request) -> CallReader | None:
        """What takes the calls out of a reply to `request`: the server's, handed over as Hermes text."""
        return CallReader(HERMES, OPENER, list(request.tools)) if request.tools else None

    def context_shift(self, messages, raw: bool = False):
        return None

    def decode_step(self, compile: bool = False, background: bool = False):
        return None

    def describe_step(self, step) -> str:
        return f"remote: the server at {self.api.url} generates"

    def new_cache(self, max_len: int | None = None, rows: int = 1):
        return None  # the server keeps its own KV (and its prompt cache)

    def prompt_cache(self, max_bytes: int | None = None):
        return None

    def generate(self, prompt: RemotePrompt, request: Request, cache=None, step=None, *, shift=None,
                 draft=None) -> Generation:
        """One streamed completion of `prompt` as `request` asks: Chunks of text (a delta each, the
        thinking apart), then a last one with finish_reason and Stats."""
        check_request(request)
        path, body = self.body(prompt, request, stream=True)
        return Generation(self._chunks(path, body, request, prompt), self.constraint(request), None)

    def complete(self, prompt: RemotePrompt, request: Request) -> Chunk:
        """One completion, not streamed: one Chunk with the whole text, finish_reason and Stats (batch)."""
        check_request(request)
        path, body = self.body(prompt, request, stream=False)
        t0 = time.perf_counter()
        answer = self.api.post(path, body)
        seconds = time.perf_counter() - t0
        choice = _choice(answer, self.api)
        text = choice.get("text") if prompt.raw else (choice.get("message") or {}).get("content")
        thought = "" if prompt.raw else _thinking(choice.get("message") or {})
        stats = _stats(answer.get("usage"), request, seconds, seconds, 0.0, None)
        finish, stopped_by = _finish(choice, request, stats)
        return Chunk(text or "", [], finish, stats, stopped_by, reasoning=thought)

    def batch_engine(self, rows: int, max_len: int | None = None, prompt_cache: int | None = None):
        from .remote_batch import RemoteBatchEngine

        return RemoteBatchEngine(self, rows, max_len or self.ctx_size)

    # ------------------------------------------------------------------ the wire

    def body(self, prompt: RemotePrompt, request: Request, stream: bool) -> tuple[str, dict]:
        """(path, JSON body) of `prompt` as `request` asks."""
        if prompt.raw:
            path, body = "/completions", {"model": self.model, "prompt": plain_prompt(list(prompt.messages))}
        else:
            path, body = "/chat/completions", {"model": self.model, "messages": list(prompt.messages)}
        body.update(request_fields(request))
        kwargs = dict(prompt.variables)
        if request.think is not None:
            kwargs["enable_thinking"] = request.think
        if kwargs and not prompt.raw:
            body["chat_template_kwargs"] = kwargs
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        return path, body

    def _chunks(self, path: str, body: dict, request: Request, prompt: RemotePrompt) -> Iterator[Chunk]:
        t0 = time.perf_counter()
        with closing(self.api.stream(path, body)) as events:  # closing this generator (Ctrl-C) hangs up
            yield from self._read(events, request, prompt, t0)

    def _read(self, events, request: Request, prompt: RemotePrompt, t0: float) -> Iterator[Chunk]:
        first = None  # when the first text (or thinking) arrived
        usage, last = None, None
        deltas = 0
        calls: dict[int, dict] = {}  # index -> {"name", "arguments"}: the tool calls, as their deltas add up
        for event in events:
            usage = event.get("usage") or usage
            choices = event.get("choices") or []
            if not choices:
                continue
            choice = choices[0]
            if prompt.raw:
                text, thought = choice.get("text") or "", ""
            else:
                delta = choice.get("delta") or {}
                text, thought = delta.get("content") or "", _thinking(delta)
                _add_calls(calls, delta.get("tool_calls"))
            if text or thought:
                deltas += 1
                if first is None:
                    first = time.perf_counter()
                yield Chunk(text, [NO_TOKEN], reasoning=thought)
            if choice.get("finish_reason"):
                last = choice
        if calls:
            yield Chunk(self._calls_text(calls, request), [OPENER])
        end = time.perf_counter()
        if last is None:
            raise RemoteError(f"the server at {self.api.url} ended the answer without a finish_reason")
        ttft = (first or end) - t0
        stats = _stats(usage, request, ttft, ttft, end - (first or end), deltas)
        finish, stopped_by = _finish(last, request, stats)
        # the tokens no delta carried (an end token, a stop text's): counted as the local chunks count them
        yield Chunk("", [NO_TOKEN] * max(0, stats.completion_tokens - deltas), finish, stats, stopped_by)

    def _calls_text(self, calls: dict[int, dict], request: Request) -> str:
        """The server's calls as Hermes writes them, for the CallReader (which checks their arguments)."""
        out = []
        for _, call in sorted(calls.items()):
            try:
                arguments = json.loads(call["arguments"] or "{}")
            except json.JSONDecodeError:
                raise RemoteError(f"the server at {self.api.url} sent a call to {call['name']} whose arguments are "
                                  f"not JSON: {call['arguments'][:80]!r}") from None
            out.append(HERMES.opener + HERMES.call_json(call["name"], arguments) + HERMES.closer)
        return "\n".join(out)


def _add_calls(calls: dict[int, dict], deltas) -> None:
    """A streamed delta's tool_calls added to `calls` (OpenAI: the name first, the arguments in pieces)."""
    for d in deltas if isinstance(deltas, list) else []:
        if not isinstance(d, dict):
            continue
        fn = d.get("function") if isinstance(d.get("function"), dict) else {}
        call = calls.setdefault(d.get("index", len(calls)), {"name": "", "arguments": ""})
        call["name"] += fn.get("name") or ""
        call["arguments"] += fn.get("arguments") or ""


def request_fields(request: Request) -> dict:
    """The request value as OpenAI's fields, with the names vLLM and llama.cpp add (top_k, min_p,
    repeat_penalty / repetition_penalty, seed, grammar); values left at "off" are not sent."""
    s = request.sampling
    out: dict = {"temperature": s.temperature, "top_p": s.top_p}
    if s.top_k > 0:
        out["top_k"] = s.top_k
    if s.min_p > 0:
        out["min_p"] = s.min_p
    if s.seed >= 0:
        out["seed"] = s.seed
    if s.presence_penalty:
        out["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        out["frequency_penalty"] = s.frequency_penalty
    if s.repeat_penalty != 1.0:  # llama.cpp's name and vLLM's
        out.update(repeat_penalty=s.repeat_penalty, repetition_penalty=s.repeat_penalty, repeat_last_n=s.repeat_last_n)
    if request.max_tokens is not None:
        out["max_tokens"] = request.max_tokens
    if request.stop:
        out["stop"] = list(request.stop)
    if request.ignore_eos:
        out["ignore_eos"] = True
    if request.reasoning_budget is not None:
        out["reasoning_budget"] = request.reasoning_budget
    if request.tools:
        choice = request.tool_choice
        out.update(tools=[t.definition for t in request.tools],
                   tool_choice=choice if choice in ("auto", "required") else {"type": "function",
                                                                               "function": {"name": choice}})
        if not request.parallel_tool_calls:
            out["parallel_tool_calls"] = False
    g = request.grammar
    if g is not None and g.kind == "json_schema":
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": g.schema}}
    elif g is not None and g.kind == "regex":  # llama.cpp's and llmcli's `grammar` (Lark), vLLM's structured_outputs
        out["grammar"] = "start: /" + g.source.replace("/", "\\/") + "/"
        out["structured_outputs"] = {"regex": g.source}
    elif g is not None:
        out["grammar"] = g.source
        out["structured_outputs"] = {"grammar": g.source}
    return out


def check_request(request: Request) -> None:
    """What a chat completion cannot carry: one error line before anything is sent."""
    for asked, what in ((request.beams > 1, "--beams"), (request.guesses is not None, "--draft and --lookup"),
                        (request.logprobs is not None, "--logprobs"), (request.context_shift, "--context-shift")):
        if asked:
            raise InvalidParameterError(f"{what} does not go to a server (--api): the server decides how it "
                                        "decodes; drop it, or run the model here without --api")


def _choice(answer: dict, api: Endpoint) -> dict:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise RemoteError(f"the server at {api.url} answered without choices")
    return choices[0]


def _thinking(message: dict) -> str:
    """A reasoning model's thinking: llama-server's and llmcli's reasoning_content, vLLM's reasoning."""
    return message.get("reasoning_content") or message.get("reasoning") or ""


def _stats(usage: dict | None, request: Request, ttft: float, prefill: float, decode: float,
           deltas: int | None) -> Stats:
    """The server's token counts (usage; without it, a token a streamed delta), timed here."""
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("completion_tokens_details") or {}
    completion = usage.get("completion_tokens")
    return Stats(prompt_tokens=int(usage.get("prompt_tokens") or 0),
                 completion_tokens=int(completion if completion is not None else deltas or 0),
                 cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
                 ttft_s=ttft, prefill_s=prefill, decode_s=decode, seed=request.sampling.seed,
                 reasoning_tokens=int(details.get("reasoning_tokens") or 0))


def _finish(choice: dict, request: Request, stats: Stats) -> tuple[str, str | None]:
    """(finish_reason as generate() says it: stop or length, which limit ended a length)."""
    reason = choice.get("finish_reason")
    if reason != "length":
        return "stop", None  # stop, tool_calls, eos (llama.cpp), abort: the answer is over
    said = choice.get("stopped_by")  # llmcli's
    if said in ("max_tokens", "context"):
        return "length", said
    cap = request.max_tokens
    return "length", "max_tokens" if cap is not None and stats.completion_tokens >= cap else "context"


# ---------------------------------------------------------------------------------- opening

def open_remote(url: str, key: str | None = None, model: str | None = None,
                ctx_size: int | None = None) -> RemoteRuntime:
    """The server at `url` and the model it serves by `model`'s name (None: its only one), from
    GET /models; the context: the model card's (vLLM's max_model_len), else `ctx_size`."""
    api = Endpoint.of(url, key)
    t0 = time.perf_counter()
    listed = api.get("/models")
    cards = [c for c in (listed.get("data") if isinstance(listed, dict) else None) or [] if isinstance(c, dict)]
    names = [str(c.get("id")) for c in cards if c.get("id") is not None]
    if model is None:
        if len(names) != 1:
            which = f"it serves {', '.join(names)}" if names else "it lists none"
            raise InvalidParameterError(f"name the model to ask the server at {url} for ({which}), "
                                        "e.g. `llmcli chat MODEL --api URL`")
        model = names[0]
    elif names and model not in names:
        raise InvalidParameterError(f"the server at {url} does not serve {model!r}; it serves {', '.join(names)}")
    card = next((c for c in cards if c.get("id") == model), {})
    served = next((card[k] for k in CONTEXT_FIELDS if isinstance(card.get(k), int) and card[k] > 0), None)
    context = served or ctx_size
    where = f"the server at {api.url}"
    placement = SimpleNamespace(device=where, dtype="", threads=0, reason=f"remote: {where} generates")
    args = SimpleNamespace(model_type="served", num_hidden_layers="?", max_position_embeddings=context)
    loaded = LoadedModel(None, SimpleNamespace(eos_ids=frozenset()), args,
                         f"(the server at {api.url} applies the model's own chat template)", api.url,
                         "remote", 0, "served", placement, time.perf_counter() - t0,
                         {"name": model, "architecture": "served"}, f"served by {api.url}")
    return RemoteRuntime(api, model, context or UNKNOWN_CONTEXT, loaded, context is not None)
