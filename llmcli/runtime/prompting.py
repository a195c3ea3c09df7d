"""How a runtime turns messages into prompt token ids and a request's grammar or tools into the
constraint that binds one sequence, without torch: runtime.py's Runtime and lean.py's LeanRuntime
share it (both hold `loaded`, a LoadedModel)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from ..cache.prompt_cache import PromptCache
from ..decode.constrained import Grammar, GrammarCompiler, TokenConstraint
from ..decode.harmony_grammar import harmony_grammar
from ..decode.reasoning import Reasoning, ReasoningFormat, reasoning_format, reasoning_variables, sequence_reasoning
from ..decode.request import Request
from ..decode.tool_grammar import opener_id, tool_grammar
from ..formats import chat_template
from ..formats.harmony_calls import HarmonyCallReader
from ..formats.prompt import conversation_ids
from ..formats.tool_reply import CallReader
from ..formats.tools import (Tool, ToolSupport, ToolsUnsupportedError, history, no_tools_message, template_support,
                             unknown_format_message)

PROMPT_CACHE_MAX = 1 << 30  # bytes: the prompt cache's default at most (serve, batch; --cache-ram sets it)
PROMPT_CACHE_NO_PLAN = 256 << 20  # its default for a runtime built without a memory plan
CACHED_TOOL_GRAMMARS = 64  # distinct tool sets whose grammars a runtime keeps (a server sees the same ones again)
_LOCK = threading.Lock()  # the grammar caches' (short sections; a server's threads ask at once)


class Prompting:
    """prompt_ids, reasoning, grammar, constraint, compiler, call_reader and tool_support of a
    runtime's `loaded` model, and the prompt cache its batch engine keeps (its `plan`: a memory plan or None)."""

    _compiler: GrammarCompiler | None = None  # bound to the tokenizer, built on first use
    _tool_grammars: OrderedDict | None = None  # (format, tools, choice, parallel) -> Grammar, least recent first

    def prompt_ids(self, messages: list[dict], raw: bool = False, tools: list[Tool] | None = None,
                   request: Request | None = None, variables: dict | None = None) -> list[int]:
        """Token ids for a conversation: through the model's chat template, where only the
        template's structure makes control tokens (formats/prompt.py). `raw`: the messages' text as
        it is, special tokens written in it included (the user writes the whole prompt). `tools`:
        offered to the model through its template (ToolsUnsupportedError if it takes none); past
        tool calls and results (OpenAI's shape) are rendered as the template renders them.
        `request`: its thinking switch and effort go to the template (enable_thinking,
        reasoning_effort); `variables`: more for the template (a server's chat_template_kwargs)."""
        tok, template = self.loaded.tokenizer, self.loaded.chat_template
        if raw:
            return tok.encode(chat_template.plain_prompt(messages))
        extra = reasoning_variables(self.reasoning_format, request, variables)
        if not tools and not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
            return conversation_ids(tok, template, messages, **extra)
        support = self.tool_support() if tools else template_support(template)
        messages = history(messages)
        if support is None:  # past calls for a template that takes no tools: as it renders them
            return conversation_ids(tok, template, messages, **extra)
        messages, more = support.prepare(messages, tools)
        return conversation_ids(tok, template, messages, **extra, **more)

    @property
    def reasoning_format(self) -> ReasoningFormat | None:
        """How the model thinks, read from its chat template (None: it does not)."""
        return reasoning_format(self.loaded.chat_template)

    def reasoning(self, prompt: list[int], request: Request) -> Reasoning | None:
        """One sequence's thinking after `prompt` (decode/reasoning.py), None for a model that does not think."""
        return sequence_reasoning(self.reasoning_format, self.loaded.tokenizer, prompt, request.think,
                                  request.reasoning_budget, request.reasoning_format, calls=bool(request.tools))

    def grammar(self, request: Request) -> Grammar | None:
        """What the output follows: the request's grammar, or its tools' calls in the syntax of this
        model's chat template (ToolsUnsupportedError for a template without tools), or None."""
        if not request.tools:
            return request.grammar
        fmt = self.tool_support().format
        key = (fmt.name, json.dumps([t.definition for t in request.tools], sort_keys=True), request.tool_choice,
               request.parallel_tool_calls)
        with _LOCK:
            if self._tool_grammars is None:
                self._tool_grammars = OrderedDict()
            if key in self._tool_grammars:
                self._tool_grammars.move_to_end(key)
                return self._tool_grammars[key]
        if fmt.harmony:
            grammar = harmony_grammar(list(request.tools), request.tool_choice, self.loaded.tokenizer)
        else:
            grammar = tool_grammar(fmt, list(request.tools), request.tool_choice, self.loaded.tokenizer,
                                   request.parallel_tool_calls)
        with _LOCK:
            self._tool_grammars[key] = grammar
            while len(self._tool_grammars) > CACHED_TOOL_GRAMMARS:
                self._tool_grammars.popitem(last=False)
        return grammar

    def constraint(self, request: Request) -> TokenConstraint | None:
        """A fresh matcher for one sequence of `request` (None: unconstrained)."""
        grammar = self.grammar(request)
        return None if grammar is None else self.compiler().constraint(grammar)

    def compiler(self) -> GrammarCompiler:
        """Grammars bound to this model's tokenizer, built on first use (about a second)."""
        with _LOCK:
            if self._compiler is None:
                self._compiler = GrammarCompiler(self.loaded.tokenizer)
            return self._compiler

    def call_reader(self, request: Request) -> CallReader | None:
        """What takes the tool calls out of one reply to `request` (None without tools)."""
        if not request.tools:
            return None
        fmt = self.tool_support().format
        if fmt.harmony:
            return HarmonyCallReader(list(request.tools), calls_only=request.tool_choice != "auto")
        return CallReader(fmt, opener_id(fmt, self.loaded.tokenizer), list(request.tools),
                          calls_only=request.tool_choice != "auto")

    def tool_support(self) -> ToolSupport:
        """How the model's chat template takes tools; ToolsUnsupportedError when it takes none, or
        writes calls in a syntax llmcli does not know: tools are refused, never ignored."""
        template = self.loaded.chat_template
        support = template_support(template)
        if support is None:
            raise ToolsUnsupportedError(no_tools_message(template))
        if support.format is None:
            raise ToolsUnsupportedError(unknown_format_message())
        return support

    def prompt_cache(self, max_bytes: int | None = None) -> PromptCache | None:
        """Where a batch engine keeps finished sequences' KV for later prompts that start the same way:
        at most `max_bytes` (None: prompt_cache_budget(); 0: none kept)."""
        budget = self.prompt_cache_budget() if max_bytes is None else max_bytes
        return PromptCache(budget) if budget > 0 else None

    def prompt_cache_budget(self) -> int:
        """The prompt cache's default size: a quarter of what the memory plan leaves free beside the
        model and its KV cache, at most PROMPT_CACHE_MAX (PROMPT_CACHE_NO_PLAN without a plan)."""
        if self.plan is None:
            return PROMPT_CACHE_NO_PLAN
        left = self.plan.budget.free - self.plan.taken_bytes - self.plan.host_bytes * (self.plan.budget.host_free is None)
        return max(0, min(PROMPT_CACHE_MAX, left // 4))
