"""What one generation asks for, as one frozen value that checks itself when built.

The CLI (`run`, `chat`, `batch`), the REPL's /set commands, a batch file's lines and every server
API build the same value; generate(), the batch engine, beam search and speculative decoding read
it, and never see flags or HTTP bodies. Options that do not combine are refused here, once, before
any model loads, in the words of whoever set them (`spelling`: flags, request fields, /set):

    Request(sampling=SamplingParams(temperature=0), max_tokens=64, stop=("\\n\\n",))
    Request(beams=4, guesses="draft")       RequestError: --beams does not combine with --draft or --lookup
    request.with_(max_tokens=128)           a new value, checked again
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field, replace
from typing import Mapping

from ..errors import InvalidParameterError
from ..formats.tools import Tool
from ..text_input import check_text
from .constrained import Grammar
from .reasoning import EFFORTS, FORMATS
from .sampling_plain import SamplingParams

MAX_LOGPROBS = 20  # alternatives per token, as OpenAI allows
TOOL_CHOICES = ("auto", "required")  # or a tool's name; "none" is a request without tools

# How a command's flags name each field; a front end with other words passes its own (`spelling`)
FLAGS = {
    "stop": "--stop", "grammar": "--json-schema, --regex or --grammar", "tools": "--tools",
    "tool_choice": "--tool-choice", "logprobs": "--logprobs", "max_tokens": "--max-tokens", "beams": "--beams",
    "draft": "--draft", "lookup": "--lookup", "draft_tokens": "--draft-tokens", "context_shift": "--context-shift",
    "think": "--think/--no-think", "reasoning_budget": "--reasoning-budget", "reasoning_format": "--reasoning-format",
    "reasoning_effort": "--reasoning-effort",
    "hint": "",  # ends the message of a clash with the grammar (the REPL says how to undo its setting)
}


class RequestError(InvalidParameterError):
    """Options of one request that are out of range or do not combine; `field` is the Request field
    at fault (a server names it as the error's `param`)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Request:
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None  # None: until the context is full
    stop: tuple[str, ...] = ()  # texts that end the output (never part of it)
    ignore_eos: bool = False  # go on past the model's end tokens (bench, llama.cpp's --ignore-eos)
    grammar: Grammar | None = None  # the output follows it: a JSON Schema, a regex or a grammar
    tools: tuple[Tool, ...] = ()  # offered to the model; its calls are kept whole and valid
    tool_choice: str = "auto"  # with tools: auto (the model decides), required, or a tool's name
    parallel_tool_calls: bool = True
    logprobs: int | None = None  # alternatives recorded per token (None: no log-probabilities)
    beams: int = 1  # beam search with this many beams (1: off)
    length_penalty: float = 1.0
    guesses: str | None = None  # speculative decoding: "draft" (a draft model) or "lookup" (the context)
    draft_tokens: int | None = None  # most tokens guessed per pass (None: the strategy's default)
    lookup_ngram: int = 3
    context_shift: bool = False  # a full context drops its oldest tokens instead of ending the output
    cache_prompt: bool = True  # a server's prompt cache may reuse and keep this prompt's KV
    # a reasoning model (reasoning.py): thinking on or off (None: the template's default), the most
    # thinking tokens before the thinking is closed (None: no limit; 0: off), whether the thinking is
    # split off the answer ("auto") or left in it with its tags ("none"), gpt-oss's effort
    think: bool | None = None
    reasoning_budget: int | None = None
    reasoning_format: str = "auto"
    reasoning_effort: str | None = None
    spelling: InitVar[Mapping[str, str] | None] = None

    def __post_init__(self, spelling: Mapping[str, str] | None) -> None:
        names = {**FLAGS, **(spelling or {})}

        def refuse(message: str, at: str):
            raise RequestError(message, at)

        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or self.max_tokens < 1):
            refuse(f"{names['max_tokens']} must be at least 1, got {self.max_tokens}", "max_tokens")
        for s in self.stop:
            check_text(s, names["stop"])
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            refuse(f"{names['logprobs']} must be in 0..{MAX_LOGPROBS}, got {self.logprobs}", "logprobs")
        self._check_tools(names, refuse)
        self._check_strategy(names, refuse)
        self._check_reasoning(names, refuse)
        constrained = self.grammar is not None or bool(self.tools)
        if constrained and any(self.stop):
            verb = "do" if names["stop"].endswith("s") else "does"
            what = names["tools"] if self.tools else names["grammar"]
            why = "a stop text could cut a call short" if self.tools else "the grammar decides where the output ends"
            refuse(f"{names['stop']} {verb} not combine with {what}: {why}{names['hint']}", "stop")

    def _check_tools(self, names, refuse) -> None:
        if not self.tools:
            if self.tool_choice != "auto":
                refuse(f"{names['tool_choice']} {self.tool_choice!r} needs {names['tools']}", "tool_choice")
            return
        if self.tool_choice not in TOOL_CHOICES and all(t.name != self.tool_choice for t in self.tools):
            refuse(f"{names['tool_choice']} {self.tool_choice!r} is not among the tools "
                   f"({', '.join(t.name for t in self.tools)}); use auto, none, required or one of them", "tool_choice")
        if self.grammar is not None:
            refuse(f"{names['tools']} and {names['grammar']} exclude each other; pass one", "tools")

    def _check_strategy(self, names, refuse) -> None:
        """Beams, guesses and context shift: which combine with each other and with the rest."""
        if self.beams < 1:
            refuse(f"{names['beams']} must be at least 1 (1: no beam search), got {self.beams}", "beams")
        if self.length_penalty != self.length_penalty or abs(self.length_penalty) == float("inf"):
            refuse(f"--length-penalty must be a finite number, got {self.length_penalty}", "length_penalty")
        guessing = f"{names['draft']} or {names['lookup']}"
        if self.guesses not in (None, "draft", "lookup"):
            refuse(f"guesses must be draft or lookup, got {self.guesses!r}", "guesses")
        if self.beams > 1 and self.guesses:
            refuse(f"{names['beams']} does not combine with {guessing}", "beams")
        if self.context_shift and (self.beams > 1 or self.guesses):
            refuse(f"{names['context_shift']} works with plain decoding only, not {names['beams']}, {guessing}",
                   "context_shift")
        if self.guesses:
            if not self.sampling.greedy:
                refuse(f"{names['draft']} and {names['lookup']} decode greedily for now; add --temp 0", "guesses")
            if self.draft_tokens is not None and not 1 <= self.draft_tokens <= 64:
                refuse(f"{names['draft_tokens']} must be in 1..64, got {self.draft_tokens}", "draft_tokens")
            if not 1 <= self.lookup_ngram <= 8:
                refuse(f"--lookup-ngram must be in 1..8, got {self.lookup_ngram}", "lookup_ngram")
        elif self.draft_tokens is not None:
            refuse(f"{names['draft_tokens']} needs {guessing}", "draft_tokens")
        if (self.beams > 1 or self.guesses) and (self.grammar is not None or self.tools or self.logprobs is not None):
            refuse(f"{names['beams']}, {names['draft']} and {names['lookup']} do not combine with a grammar or "
                   f"{names['logprobs']} yet", "beams")

    def _check_reasoning(self, names, refuse) -> None:
        budget = self.reasoning_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            refuse(f"{names['reasoning_budget']} must be a whole number of at least 0 (0: no thinking), got {budget!r}",
                   "reasoning_budget")
        if self.think is False and budget:
            refuse(f"{names['think']} off and {names['reasoning_budget']} {budget} contradict each other; pass one",
                   "reasoning_budget")
        if self.reasoning_format not in FORMATS:
            refuse(f"{names['reasoning_format']} must be one of {', '.join(FORMATS)}, got {self.reasoning_format!r}",
                   "reasoning_format")
        if self.reasoning_effort is not None and self.reasoning_effort not in EFFORTS:
            refuse(f"{names['reasoning_effort']} must be one of {', '.join(EFFORTS)}, got {self.reasoning_effort!r}",
                   "reasoning_effort")
        if budget is not None and (self.beams > 1 or self.guesses):
            refuse(f"{names['reasoning_budget']} does not combine with {names['beams']}, {names['draft']} or "
                   f"{names['lookup']} yet", "reasoning_budget")

    @property
    def constrained(self) -> bool:
        """Whether something shapes the output token by token: a grammar, or the tools' calls."""
        return self.grammar is not None or bool(self.tools)

    def with_(self, spelling: Mapping[str, str] | None = None, **changes) -> "Request":
        """A new request with `changes`, checked again (in the words of `spelling`)."""
        return replace(self, spelling=spelling, **changes)
