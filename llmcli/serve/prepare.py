"""A checked request (openai_api.Job) -> what the engine runs: one engine Sequence per choice, each
with its own constraint and seed, and the choice objects that turn their chunks into the answer.

    prep = Preparer(rt)
    seqs, choices = prep.chat(job)          # in a worker thread: the template, tokenizing, grammars
    seqs, choices = prep.completion(job)

The constraint is the request's: its tools' grammar (tool_grammar.py, in the syntax of the model's
template), its response_format schema or `grammar`, or serve's --json-schema / --grammar for a
request that asks for no format (openai_api.chat_job chose), or none. Binding grammars to the
tokenizer happens once per server, on first use (Runtime.compiler: the slow part).
"""

from __future__ import annotations

from ..decode.batched import Sequence
from ..decode.sampling_plain import MAX_SEED
from ..decode.think_first import think_first
from ..errors import GrammarError
from ..formats.tools import ToolsUnsupportedError
from . import openai_api as api
from .choices import ChatChoice, CompletionChoice
from .logprobs import LogprobCursor
from .openai_api import ApiError


class Preparer:
    def __init__(self, rt):
        self.rt = rt

    def chat(self, job: api.Job) -> tuple[list[Sequence], list[ChatChoice]]:
        request = job.request
        try:
            ids = self.rt.prompt_ids(job.messages, tools=request.tools, request=request,
                                     variables=job.template_kwargs)
            seqs = self._sequences(job, ids, "messages", thinks=True)
        except ToolsUnsupportedError as e:
            raise ApiError(400, str(e), "tools", "tools_not_supported") from None
        choices = [ChatChoice(i, self._cursor(s), self.rt.call_reader(request)) for i, s in enumerate(seqs)]
        return seqs, choices

    def completion(self, job: api.Job) -> tuple[list[Sequence], list[CompletionChoice]]:
        tok = self.rt.loaded.tokenizer
        ids = tok.encode(job.prompt) if isinstance(job.prompt, str) else job.prompt
        seqs = self._sequences(job, ids, "prompt")
        offset = len(job.prompt if isinstance(job.prompt, str) else tok.decode(ids))  # text_offset counts from here
        return seqs, [CompletionChoice(i, self._cursor(s), offset) for i, s in enumerate(seqs)]

    # ------------------------------------------------------------------ pieces

    def _sequences(self, job: api.Job, ids: list[int], param: str, thinks: bool = False) -> list[Sequence]:
        if not ids:
            raise ApiError(400, f"the {param} is empty", param)
        vocab = self.rt.loaded.args.vocab_size
        if max(ids) >= vocab:
            raise ApiError(400, f"token id {max(ids)} is outside the vocabulary (0..{vocab - 1})", param)
        request, seqs = job.request, []
        for i in range(job.n):  # choice i of a seeded request samples with seed + i: each reproducible
            seed = request.sampling.seed
            choice = request if seed < 0 or i == 0 else request.with_(
                api.SPELLING, sampling=request.sampling.with_(seed=(seed + i) % (MAX_SEED + 1)))
            try:
                constraint = self.rt.constraint(choice)
            except GrammarError as e:
                raise ApiError(400, str(e), "tools" if request.tools else "grammar") from None
            reasoning = self.rt.reasoning(ids, choice) if thinks else None
            constraint = think_first(reasoning, constraint, self.rt.loaded.tokenizer.eos_ids)
            seqs.append(Sequence(ids, choice, constraint, reasoning=reasoning))
        return seqs

    def _cursor(self, seq: Sequence):
        return LogprobCursor(seq.logprobs, self.rt.loaded.tokenizer) if seq.logprobs is not None else None
