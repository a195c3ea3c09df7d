"""Chat templates: the model's own Jinja template, rendered in a sandbox with Hugging Face semantics.

Templates come from downloaded files, so they are untrusted code: jinja2's immutable sandbox keeps
them from reaching Python internals, and only plain JSON-like data is passed in.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import LlmcliError


class TemplateError(LlmcliError):
    """The model's chat template failed to render (or rejected the conversation)."""


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # like HF: no HTML escaping, the options templates use
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise TemplateError(f"the model's chat template does not parse (line {e.lineno}: {e.message}); use --raw") from None


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
    try:
        return template.render(messages=_plain(messages), add_generation_prompt=add_generation_prompt,
                                bos_token=bos_token or "", eos_token=eos_token or "", **_plain(extra))
    except jinja2.exceptions.SecurityError as e:
        raise TemplateError(f"the model's chat template tried something unsafe ({e}); use --raw") from None
    except jinja2.exceptions.TemplateError as e:
        raise TemplateError(f"the model's chat template refused this conversation: {e}") from None


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
