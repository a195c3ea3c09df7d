"""Tool (function) calling as chat templates see it: the tools a request offers (OpenAI's shape),
whether a model's template takes them and how, and how its family writes a call.

    tools = parse_tools(body["tools"], "tools")   # [Tool]; a mistake is one InvalidParameterError
    support = template_support(template)          # ToolSupport, or None: the template never reads tools
    messages, variables = support.prepare(messages, tools)   # what the template is given

A template takes tools if rendering a conversation with a tool gives other text than without it:
through the `tools` variable, as Hugging Face passes them (Qwen2.5, Qwen3, Llama 3.x), or, as
Phi-4-mini's template wants, as a JSON string under a system message's `tools`. The family's call
syntax (ToolFormat) is known from the markers its template writes; replies are read by
tool_reply.py (harmony's by harmony_calls.py), and the grammar that keeps calls valid is
decode/tool_grammar.py's (harmony's: decode/harmony_grammar.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

from ..errors import InvalidParameterError, LlmcliError
from .chat_template import render
from .prompt import Markup

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function names
MAX_TOOLS = 128  # OpenAI's limit


class ToolsUnsupportedError(LlmcliError):
    """Tools were offered to a model whose chat template does not take them."""


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict  # the JSON Schema of its arguments (an object)
    description: str | None = None

    @property
    def function(self) -> dict:
        """{"name", "description", "parameters"}: what Phi-4-mini's template lists."""
        return {"name": self.name, **({"description": self.description} if self.description else {}),
                "parameters": self.parameters}

    @property
    def definition(self) -> dict:
        """OpenAI's tool definition, as Hugging Face passes it to a template."""
        return {"type": "function", "function": self.function}


def parse_tools(value, where: str = "tools") -> list[Tool]:
    """OpenAI's `tools`: [{"type": "function", "function": {"name", "description"?, "parameters"?}}]."""
    if not isinstance(value, list) or not value:
        raise InvalidParameterError(f"{where} must be a non-empty list of {{\"type\": \"function\", \"function\": "
                                    "{\"name\", \"parameters\"}} objects")
    if len(value) > MAX_TOOLS:
        raise InvalidParameterError(f"{where} holds {len(value)} tools; the limit is {MAX_TOOLS}")
    tools: list[Tool] = []
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(item, dict) or item.get("type", "function") != "function" or not isinstance(item.get("function"), dict):
            raise InvalidParameterError(f"{at} must be {{\"type\": \"function\", \"function\": {{...}}}}")
        fn = item["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise InvalidParameterError(f"{at}.function.name must be 1 to 64 letters, digits, _ or -, got {name!r}")
        if any(t.name == name for t in tools):
            raise InvalidParameterError(f"{at}.function.name {name!r} is given twice")
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidParameterError(f"{at}.function.description must be a string")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise InvalidParameterError(f"{at}.function.parameters must be a JSON Schema of an object (its arguments)")
        tools.append(Tool(name, {"type": "object", **params}, description))
    return tools


# ------------------------------------------------------------------------------ families


@dataclass(frozen=True)
class ToolFormat:
    """How a model family writes tool calls in its reply."""

    name: str
    opener: str | None  # the text (a token of the family's vocabulary) that opens the calls
    closer: str | None  # the text that closes each call (or the list of calls)
    args_key: str  # the arguments' key in a call's JSON: "arguments" or "parameters"
    listed: bool = False  # the calls are one JSON array between opener and closer
    at_start: bool = False  # a call may also open the reply as bare JSON, `{"name": ...`
    one_call: bool = False  # the family writes one call per reply (its template refuses more)
    harmony: bool = False  # a call is a harmony message addressed to=functions.NAME (gpt-oss); the fields above unused

    def call_json(self, name: str, arguments) -> str:
        """One call as the family writes its JSON (key order and spacing as its templates do)."""
        return json.dumps({"name": name, self.args_key: arguments}, ensure_ascii=False)

    def written(self, calls: list[tuple[str, object]]) -> list[tuple[str, bool]]:
        """Markup pieces for calls in a past message, for a template that does not write them itself."""
        bodies = [self.call_json(n, a) for n, a in calls]
        if self.listed:
            return [(self.opener, True), ("[" + ", ".join(bodies) + "]", False), (self.closer, True)]
        if self.opener is None or self.at_start:
            return [(bodies[0], False)]
        pieces: list[tuple[str, bool]] = []
        for i, body in enumerate(bodies):
            pieces += [("\n" if i else "", False), (self.opener, True), ("\n" + body + "\n", False), (self.closer, True)]
        return pieces


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", "arguments")  # Qwen2.5, Qwen3, Hermes 2/3
LLAMA3 = ToolFormat("llama3", "<|python_tag|>", None, "parameters", at_start=True, one_call=True)  # Llama 3.1-3.3
PHI4 = ToolFormat("phi4", "<|tool_call|>", "<|/tool_call|>", "arguments", listed=True)  # Phi-4-mini
# gpt-oss: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`, and
# <|call|> ends the reply: one call per reply
HARMONY = ToolFormat("harmony", None, None, "arguments", one_call=True, harmony=True)
FORMATS = (HERMES, LLAMA3, PHI4, HARMONY)
KNOWN = ("Qwen2.5/Qwen3/Hermes (<tool_call>), Llama 3.x ({\"name\": ..., \"parameters\": ...}), Phi-4-mini "
         "(<|tool_call|>), gpt-oss (harmony's to=functions.NAME)")


def _family(template: str, in_system: bool) -> ToolFormat | None:
    if "<tool_call>" in template:
        return HERMES
    if "<|python_tag|>" in template or '"parameters": dictionary of argument name' in template:
        return LLAMA3
    if in_system and "<|tool|>" in template:
        return PHI4
    if "<|call|>" in template and "<|channel|>commentary" in template:  # harmony: calls go to commentary
        return HARMONY
    return None


# ------------------------------------------------------------------------------ templates

_PROBE = Tool("llmcli_probe", {"type": "object", "properties": {"x": {"type": "string"}}}, "a probe")
_USER = {"role": "user", "content": "Hi"}
PHI_SYSTEM = "You are a helpful assistant with some tools."  # Phi-4-mini's model card, for a request without one


@dataclass(frozen=True)
class ToolSupport:
    """How one template takes tools."""

    format: ToolFormat | None  # None: it takes tools, in a call syntax llmcli does not know
    in_system: bool  # tools go in a system message's "tools" (a JSON string), not the `tools` variable
    writes_calls: bool  # it writes an assistant message's tool_calls itself (else llmcli writes them)

    def prepare(self, messages: list[dict], tools: list[Tool] | None) -> tuple[list[dict], dict]:
        """The messages and template variables for a conversation (OpenAI's shape, checked) offering
        `tools` (None: none offered; past calls are still rendered)."""
        out = [self._message(m) for m in (_one_call_each(messages) if self.format is HARMONY else messages)]
        if not tools:
            return out, {}
        if not self.in_system:
            return out, {"tools": [t.definition for t in tools]}
        listing = json.dumps([t.function for t in tools], ensure_ascii=False)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "tools": listing}
        else:
            out.insert(0, {"role": "system", "content": PHI_SYSTEM, "tools": listing})
        return out, {}

    def _message(self, m: dict) -> dict:
        calls = m.get("tool_calls")
        if not calls:
            return m
        if self.writes_calls or self.format is None:
            return m
        pairs = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
        rest = {k: v for k, v in m.items() if k != "tool_calls"}
        return {**rest, "content": Markup(((m.get("content") or "", False), *self.format.written(pairs)))}


def _one_call_each(messages: list[dict]) -> list[dict]:
    """An assistant message with several calls as one message per call (gpt-oss's template renders
    only a message's first call; the content goes with the first)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") or []
        out += [m] if len(calls) < 2 else [{**m, "content": m.get("content") if i == 0 else "", "tool_calls": [c]}
                                           for i, c in enumerate(calls)]
    return out


@lru_cache(maxsize=16)
def template_support(template: str | None) -> ToolSupport | None:
    """Whether `template` takes tools (rendering with one changes its text) and how; None: it never
    reads them. Cached per template: each check renders it a few times."""
    if template is None:
        return None
    plain = render(template, [_USER])
    in_system = False
    if render(template, [_USER], tools=[_PROBE.definition]) == plain:
        system = {"role": "system", "content": "S"}
        listing = json.dumps([_PROBE.function])
        if render(template, [{**system, "tools": listing}, _USER]) == render(template, [system, _USER]):
            return None
        in_system = True
    call = {"id": "call_0", "type": "function", "function": {"name": _PROBE.name, "arguments": {"x": "y"}}}
    asked = [_USER, {"role": "assistant", "content": "", "tool_calls": [call]}]
    try:
        writes = render(template, asked) != render(template, [_USER, {"role": "assistant", "content": ""}])
    except Exception:  # noqa: BLE001 (a template that fails on a past call does not write it)
        writes = False
    return ToolSupport(_family(template, in_system), in_system, writes)


def no_tools_message(template: str | None) -> str:
    why = "this model has no chat template" if template is None else \
        "this model's chat template does not take tools (it never reads them)"
    return (f"{why}, so it cannot be offered tools; use a model whose template has a tools section "
            f"({KNOWN}), or give this one such a template with --chat-template-file")


def unknown_format_message() -> str:
    return (f"this model's chat template takes tools, but in a call syntax llmcli does not know; known: {KNOWN}")


# ------------------------------------------------------------------------------ past messages


def history(messages: list[dict], where: str = "messages") -> list[dict]:
    """OpenAI's assistant `tool_calls` (arguments as a JSON string) -> what templates read
    (Hugging Face's shape: arguments as an object); a tool message keeps its tool_call_id (and
    name), and an assistant message with calls and no content gets "" (templates add strings)."""
    from ..json_input import JsonInputError, load_json

    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if not calls:
            out.append({k: v for k, v in m.items() if k != "tool_calls"})
            continue
        at = f"{where}[{i}].tool_calls"
        if not isinstance(calls, list):
            raise InvalidParameterError(f"{at} must be a list of calls")
        converted = []
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise InvalidParameterError(f"{at}[{j}] must be {{\"id\", \"type\": \"function\", \"function\": "
                                            "{\"name\", \"arguments\"}}")
            args = fn.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    args = load_json(args or "{}", f"{at}[{j}].function.arguments")
                except JsonInputError as e:
                    raise InvalidParameterError(str(e)) from None
            converted.append({"id": str(c.get("id", f"call_{j}")), "type": "function",
                              "function": {"name": fn["name"], "arguments": args}})
        out.append({**m, "content": m.get("content") or "", "tool_calls": converted})
    return out
