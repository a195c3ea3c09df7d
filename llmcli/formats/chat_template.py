"""Chat templates: the model's own Jinja template, rendered in a sandbox with Hugging Face semantics.

Templates come from downloaded files, so they are untrusted code: jinja2's immutable sandbox keeps
them from reaching Python internals, and only plain JSON-like data is passed in. They are bounded
too, so that a bad one is an error rather than a hang or a machine out of memory:

- time: a watchdog thread raises an exception in the rendering thread after RENDER_SECONDS
  (CPython's PyThreadState_SetAsyncExc; it lands at the next bytecode, on any thread, and needs no
  signal). It stops loops that call nothing, e.g. nested `for` over one `range(100000)`;
- size: every way a template builds text or numbers goes through a check before the work is done:
  `*`, `**`, `+` and `%` (intercepted operators), `~` (compiled to the checked join below), the
  output and `{% set %}`/macro bodies (the environment's `concat`), and the arguments and results
  of calls and filters (widths such as `center(10**11)`). Each text is at most MAX_TEXT characters,
  and all the text one render builds at most MAX_BUILT: a hundred texts just under the first bound,
  kept in variables or a list, peaked at 3.1 GB before the time bound stopped the render;
- depth: recursion ends in Python's RecursionError, reported like any other failure.

A long C-level operation cannot be interrupted, which is why sizes are checked before the work.
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import json
import re
import threading
from datetime import datetime
from functools import lru_cache

import jinja2
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import LlmcliError

RENDER_SECONDS = 3.0  # real templates render in milliseconds
MAX_TEXT = 32 << 20  # characters in the output or in any string (or items in a list) built on the way
MAX_BUILT = 2 * MAX_TEXT  # characters (and list items) one render builds in all, kept or not
MAX_INT_BITS = 1 << 16  # integers a template computes (10 ** 10 ** 10 would take forever)
MAX_INT_ARG = 1 << 20  # widths and counts passed to calls and filters, and in format strings


class TemplateError(LlmcliError):
    """The model's chat template failed to render (or rejected the conversation)."""


class _TooBig(Exception):
    """A size bound was hit; the message says which."""


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

_built: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("built", default=None)


def _count(n: int) -> None:
    """Add `n` characters (or list items) to what the current render has built."""
    built = _built.get()
    if built is not None:
        built[0] += n
        if built[0] > MAX_BUILT:
            raise _TooBig(f"built more than {MAX_BUILT} characters in all")


def _sized(value):
    """`value`, if it is within the bounds (and counted against the render's total)."""
    if isinstance(value, (str, list, tuple)):
        if len(value) > MAX_TEXT:
            raise _TooBig(f"built a text or list of more than {MAX_TEXT} items")
        _count(len(value))
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise _TooBig(f"computed a number of more than {MAX_INT_BITS} bits")
    return value


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_args(args, kwargs) -> None:
    for a in (*args, *kwargs.values()):
        if _is_int(a) and abs(a) > MAX_INT_ARG:
            raise _TooBig(f"passed {a} to a function (at most {MAX_INT_ARG})")


def _check_format(fmt: str) -> None:
    """Widths and precisions in a `%` or `.format` string ('%99999999999d' allocates that many)."""
    if any(int(n) > MAX_INT_ARG for n in re.findall(r"\d{7,}", fmt)):
        raise _TooBig(f"used a format width above {MAX_INT_ARG}")


def _check_binop(op: str, a, b) -> None:
    seq = (str, list, tuple)
    if op == "*":
        if _is_int(a) and _is_int(b):
            if a.bit_length() + b.bit_length() > MAX_INT_BITS:
                raise _TooBig(f"computed a number of more than {MAX_INT_BITS} bits")
        elif isinstance(a, seq) and _is_int(b) or isinstance(b, seq) and _is_int(a):
            n, s = (b, a) if _is_int(b) else (a, b)
            if len(s) * n > MAX_TEXT:
                raise _TooBig(f"built a text or list of more than {MAX_TEXT} items")
    elif op == "**":
        if _is_int(a) and _is_int(b) and abs(a) > 1 and b > 0 and a.bit_length() * b > MAX_INT_BITS:
            raise _TooBig(f"computed a number of more than {MAX_INT_BITS} bits")
    elif op == "+":
        if isinstance(a, seq) and isinstance(b, seq) and len(a) + len(b) > MAX_TEXT:
            raise _TooBig(f"built a text or list of more than {MAX_TEXT} items")
    elif op == "%" and isinstance(a, str):
        _check_format(a)
        _check_args(b if isinstance(b, tuple) else (b,), {})


def _bounded_join(pieces) -> str:
    """The environment's `concat`: the output, `{% set %}` blocks, macro bodies, and `~` (below)."""
    kept, size = [], 0
    for piece in pieces:
        if piece:
            size += len(piece)
            if size > MAX_TEXT:
                raise _TooBig(f"produced more than {MAX_TEXT} characters")
            kept.append(piece)
    _count(size)
    return "".join(kept)


class _BoundedCodeGenerator(CodeGenerator):
    def visit_Concat(self, node, frame) -> None:
        # `a ~ b` compiles to runtime.str_join, which nothing can hook; make it the checked join
        self.write("environment.concat(map(str, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(")))")


def _bounded_filter(f):
    @functools.wraps(f)  # keeps jinja's pass_context/pass_environment marks
    def bounded(*args, **kwargs):
        _check_args(args, kwargs)
        return _sized(f(*args, **kwargs))
    return bounded


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, **options):
        super().__init__(**options)
        self.concat = _bounded_join
        self.filters = {name: _bounded_filter(f) for name, f in self.filters.items()}
        del self.globals["lipsum"]  # lipsum(n=10**6) would take minutes; no chat template uses it

    def call_binop(self, context, operator, left, right):
        _check_binop(operator, left, right)
        return _sized(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own spelling)
        _check_args(args, kwargs)
        inner = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        if getattr(inner, "__name__", None) in ("format", "format_map") and isinstance(getattr(inner, "__self__", None), str):
            _check_format(inner.__self__)
        return _sized(super().call(__context, __obj, *args, **kwargs))


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
    except _TooBig as e:
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


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _bounded_filter(_tojson)
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
    counter = _built.set([0])
    try:
        return _bounded("rendering", lambda: template.render(**variables))
    finally:
        _built.reset(counter)


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
