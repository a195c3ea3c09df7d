"""A checked request (openai_api.Job) -> what the engine runs: one engine request per choice, each
with its own constraint and seed, and the choice objects that turn their chunks into the answer.

    prep = Preparer(rt, defaults)
    reqs, choices = prep.chat(job)          # in a worker thread: the template, tokenizing, grammars
    reqs, choices = prep.completion(job)

The constraint is, first to last: the tools' grammar (tool_grammar.py, with tools offered), the
request's response_format schema or `grammar`, serve's --json-schema / --grammar for a request that
asks for no format, or none. Grammars are compiled once per distinct text (a small cache); binding
them to the tokenizer happens once per server (~1 s, on first use).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from ..decode.batched import Request as EngineRequest
from ..decode.constrained import GrammarCompiler, from_grammar, from_json_schema
from ..decode.generate import Logprobs
from ..decode.sampling import MAX_SEED
from ..decode.tool_grammar import opener_id, tool_grammar
from ..errors import GrammarError
from ..formats.tool_reply import CallReader
from ..formats.tools import ToolsUnsupportedError
from . import openai_api as api
from .choices import ChatChoice, CompletionChoice
from .openai_api import ApiError

CACHED_GRAMMARS = 64


class Preparer:
    def __init__(self, rt, defaults: api.Defaults = api.Defaults()):
        self.rt, self.defaults = rt, defaults
        self._compiler = None
        self._lock = threading.Lock()
        self._grammars: OrderedDict[tuple, object] = OrderedDict()

    def chat(self, job: api.Job) -> tuple[list[EngineRequest], list[ChatChoice]]:
        try:
            ids = self.rt.prompt_ids(job.messages, tools=job.tools)
            support = self.rt.tool_support() if job.tools else None
        except ToolsUnsupportedError as e:
            raise ApiError(400, str(e), "tools", "tools_not_supported") from None
        reqs = self._requests(job, ids, "messages", self._grammar(job, support))
        tok = self.rt.loaded.tokenizer
        choices = []
        for i, req in enumerate(reqs):
            reader = None
            if support is not None:
                reader = CallReader(support.format, opener_id(support.format, tok), job.tools,
                                    calls_only=job.tool_choice != "auto")
            choices.append(ChatChoice(i, self._cursor(req), reader))
        return reqs, choices

    def completion(self, job: api.Job) -> tuple[list[EngineRequest], list[CompletionChoice]]:
        tok = self.rt.loaded.tokenizer
        ids = tok.encode(job.prompt) if isinstance(job.prompt, str) else job.prompt
        reqs = self._requests(job, ids, "prompt", self._grammar(job, None))
        offset = len(job.prompt if isinstance(job.prompt, str) else tok.decode(ids))  # text_offset counts from here
        return reqs, [CompletionChoice(i, self._cursor(r), offset) for i, r in enumerate(reqs)]

    def compiler(self) -> GrammarCompiler:
        """The grammar compiler for this model's tokenizer, built on first use (about a second)."""
        with self._lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(self.rt.loaded.tokenizer)
            return self._compiler

    # ------------------------------------------------------------------ pieces

    def _requests(self, job: api.Job, ids: list[int], param: str, grammar) -> list[EngineRequest]:
        if not ids:
            raise ApiError(400, f"the {param} is empty", param)
        vocab = self.rt.loaded.args.vocab_size
        if max(ids) >= vocab:
            raise ApiError(400, f"token id {max(ids)} is outside the vocabulary (0..{vocab - 1})", param)
        reqs = []
        for i in range(job.n):  # choice i of a seeded request samples with seed + i: each reproducible
            params = job.params if job.params.seed < 0 or i == 0 else job.params.with_(seed=(job.params.seed + i) % (MAX_SEED + 1))
            constraint = None
            if grammar is not None:
                try:
                    constraint = self.compiler().constraint(grammar)
                except GrammarError as e:
                    raise ApiError(400, str(e), "grammar") from None
            recorder = Logprobs(job.logprobs) if job.logprobs is not None else None
            reqs.append(EngineRequest(ids, params, job.max_tokens, job.stop, constraint, recorder,
                                      cache_prompt=job.cache_prompt))
        return reqs

    def _cursor(self, req: EngineRequest):
        return api.LogprobCursor(req.logprobs, self.rt.loaded.tokenizer) if req.logprobs is not None else None

    def _grammar(self, job: api.Job, support):
        if job.tools:
            key = ("tools", support.format.name, json.dumps([t.definition for t in job.tools], sort_keys=True),
                   job.tool_choice, job.parallel_tool_calls)
            return self._cached(key, "tools", lambda: tool_grammar(support.format, job.tools, job.tool_choice,
                                                                   self.rt.loaded.tokenizer, job.parallel_tool_calls))
        if job.schema is not None:
            return self._cached(("schema", job.schema), "response_format",
                                lambda: from_json_schema(job.schema, "response_format's schema"))
        if job.grammar is not None:
            return self._cached(("grammar", job.grammar), "grammar", lambda: from_grammar(job.grammar, "grammar"))
        return self.defaults.grammar if job.default_format else None

    def _cached(self, key: tuple, param: str, build):
        """A grammar checked and compiled once per distinct text; its mistakes are 400s naming `param`."""
        with self._lock:
            if key in self._grammars:
                self._grammars.move_to_end(key)
                return self._grammars[key]
        try:
            grammar = build()
        except GrammarError as e:
            raise ApiError(400, str(e), param) from None
        with self._lock:
            self._grammars[key] = grammar
            while len(self._grammars) > CACHED_GRAMMARS:
                self._grammars.popitem(last=False)
        return grammar
