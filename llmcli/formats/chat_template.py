"""Chat templates: the model's own Jinja template, rendered in a sandbox with Hugging Face semantics.

Templates come from downloaded files, so they are untrusted code: jinja2's immutable sandbox keeps
them from reaching Python internals, and only plain JSON-like data is passed in. They are bounded
too, so that a bad one is an error rather than a hang or a machine out of memory:

- time: a watchdog thread raises an exception in the rendering thread after RENDER_SECONDS
  (CPython's PyThreadState_SetAsyncExc; it lands at the next bytecode, on any thread, and needs no
  signal). It stops loops that call nothing, e.g. nested `for` over one `range(100000)`;
- size: every way a template builds text, bytes, lists or numbers goes through template_bounds.py
  before the work is done: operators (`*`, `**`, `+`, `%`; `~` compiled to the checked join
  below), the output and `{% set %}`/macro bodies (the environment's `concat`, counted as the pieces
  come), slices, and calls and filters (their arguments, a forecast of their result's length where
  it can far exceed their inputs', and the result). All one render builds is bounded in bytes, so
  a hostile template stops long before the machine's memory does;
- depth: recursion ends in Python's RecursionError, reported like any other failure.

A long C-level operation cannot be interrupted, which is why sizes are checked before the work.
"""

from __future__ import annotations

import ctypes
import functools
import json
import threading
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import LlmcliError
from . import template_bounds as bounds

RENDER_SECONDS = 3.0  # real templates render in milliseconds


class TemplateError(LlmcliError):
    """The model's chat template failed to render (or rejected the conversation)."""


class _TimeUp(BaseException):
    """Raised into the rendering thread by the watchdog (BaseException: no `except Exception` eats it)."""


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # like HF: no HTML escaping, the options templates use
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


# ------------------------------------------------------------------------------------ bounds

class _BoundedCodeGenerator(CodeGenerator):
    def visit_Concat(self, node, frame) -> None:
        # `a ~ b` compiles to runtime.str_join, which nothing can hook; make it the checked join
        self.write("environment.concat(map(environment.to_text, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(")))")


def _bounded_filter(name: str, f):
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0  # the context jinja passes first

    @functools.wraps(f)  # keeps jinja's pass_context/pass_environment marks
    def bounded(*args, **kwargs):
        bounds.check_args(args, kwargs)
        if name in bounds.MATERIALIZED and len(args) > skip and not isinstance(args[skip], (list, tuple, Mapping)):
            args = (*args[:skip], bounds.bounded_list(args[skip]), *args[skip + 1:])
        if name not in bounds.STRUCTURAL and len(args) > skip:
            bounds.finalize(args[skip])
        bounds.forecast(bounds.FILTERS, name, args[skip:], kwargs)
        return bounds.sized(f(*args, **kwargs))
    return bounded


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, **options):
        super().__init__(finalize=bounds.finalize, **options)
        self.concat = bounds.bounded_join
        self.to_text = bounds.to_text
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        del self.globals["lipsum"]  # lipsum(n=10**6) would take minutes; no chat template uses it

    def call_binop(self, context, operator, left, right):
        bounds.check_binop(operator, left, right)
        return bounds.sized(super().call_binop(context, operator, left, right))

    def getitem(self, obj, argument):
        value = super().getitem(obj, argument)
        return bounds.sized(value) if isinstance(argument, slice) else value  # a slice is a new text or list

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own spelling)
        bounds.check_args(args, kwargs)
        inner = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        owner, name = getattr(inner, "__self__", None), getattr(inner, "__name__", None)
        if isinstance(owner, (str, bytes)):
            if name in ("format", "format_map") and isinstance(owner, str):
                bounds.check_format(owner)
            if name == "join" and args and not isinstance(args[0], (list, tuple)):
                args = (bounds.bounded_list(args[0]), *args[1:])
            bounds.forecast(bounds.METHODS, name, (owner, *args), kwargs)
            bounds.forecast_split(name, (owner, *args), kwargs)
        return bounds.sized(super().call(__context, __obj, *args, **kwargs))


# ---------------------------------------------------------------------------------- watchdog

def _raise_in(thread_id: int, exc) -> None:
    """Raise `exc` in that thread at its next bytecode; None takes back one not yet raised."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


class _Watchdog:
    """Raises _TimeUp in the calling thread after `seconds`, unless stopped first."""

    def __init__(self, seconds: float):
        self.thread_id = threading.get_ident()
        self.lock = threading.Lock()
        self.done = self.fired = False
        self.timer = threading.Timer(seconds, self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self) -> None:
        with self.lock:
            if not self.done:
                self.fired = True
                _raise_in(self.thread_id, _TimeUp)

    def stop(self) -> None:
        self.timer.cancel()
        with self.lock:
            self.done = True
            if self.fired:  # fired just as the render ended: take it back if still pending
                _raise_in(self.thread_id, None)


def _bounded(what: str, fn):
    """fn() within the time bound; every failure of the template becomes one TemplateError."""
    try:
        dog = _Watchdog(RENDER_SECONDS)
        try:
            return fn()
        finally:
            dog.stop()
    except _TimeUp:
        raise TemplateError(f"the model's chat template ran for more than {RENDER_SECONDS:g} s while {what} "
                            "(a loop that does not end?); use --raw") from None
    except bounds.TooBig as e:
        raise TemplateError(f"the model's chat template {e}; use --raw") from None
    except RecursionError:
        raise TemplateError("the model's chat template recursed too deeply; use --raw") from None
    except MemoryError:
        raise TemplateError("the model's chat template needed too much memory; use --raw") from None
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise TemplateError(f"the model's chat template does not parse (line {e.lineno}: {_one_line(e.message)}); "
                            "use --raw") from None
    except jinja2.exceptions.SecurityError as e:
        raise TemplateError(f"the model's chat template tried something unsafe ({_one_line(e)}); use --raw") from None
    except jinja2.exceptions.TemplateError as e:
        raise TemplateError(f"the model's chat template refused this conversation: {_one_line(e)}") from None
    except Exception as e:  # a template is code: 1/0, 'a' + 1, ... are its bugs, not ours
        raise TemplateError(f"the model's chat template failed ({type(e).__name__}: {_one_line(e)}); use --raw") from None


def _one_line(e) -> str:
    return " ".join(str(e).split())[:300]


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (Hugging Face's mark of the assistant's tokens for
    training, in SmolLM3's template): the body as it is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _Generation])
    env.filters["tojson"] = _bounded_filter("tojson", _tojson)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return _bounded("parsing", lambda: env.from_string(source))


def _plain(value):
    """Only JSON-like data reaches the template."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def render(source: str, messages: list[dict], *, add_generation_prompt: bool = True,
           bos_token: str | None = None, eos_token: str | None = None, **extra) -> str:
    """Render a conversation (`[{"role": ..., "content": ...}]`) into the prompt text."""
    template = _compile(source)
    variables = dict(messages=_plain(messages), add_generation_prompt=add_generation_prompt,
                     bos_token=bos_token or "", eos_token=eos_token or "", **_plain(extra))
    counter = bounds.counting()
    try:
        return _bounded("rendering", lambda: template.render(**variables))
    finally:
        bounds.done(counter)


def plain_prompt(messages: list[dict]) -> str:
    """For models without a template: the system text, a blank line, then the user's text."""
    return "\n\n".join(m["content"] for m in messages if m.get("content"))


# Gemma 3's own template (google/gemma-3-*-it, tokenizer_config.json), for Gemma files that ship
# without one (the base models' GGUFs): their vocabulary still has the turn markers it writes.
GEMMA_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)


def fallback_template(architecture: str | None, special_tokens: set[str]) -> str | None:
    """The template for a model file that has none, where its family's format is known (llama.cpp
    would use ChatML, whose markers a Gemma vocabulary lacks); None: plain prompts."""
    if architecture in ("gemma3", "gemma3_text") and {"<start_of_turn>", "<end_of_turn>"} <= special_tokens:
        return GEMMA_TEMPLATE
    return None
