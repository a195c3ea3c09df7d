"""Which decoding options combine, checked in one place before anything loads: for `run`, `chat`,
`batch` and `serve` alike.

    Strategy(beams=4).check(params)            raises InvalidParameterError naming the clash
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidParameterError
from .beam import check_beams
from .sampling import SamplingParams
from .speculative import check_speculative

MAX_LOGPROBS = 20  # alternatives per token, as OpenAI allows


@dataclass(frozen=True)
class Strategy:
    """How tokens are produced beyond sampling: beams, guesses, a grammar, what is recorded."""

    beams: int = 1
    length_penalty: float = 1.0
    draft: bool = False  # a draft model guesses tokens (--draft)
    draft_tokens: int | None = None
    lookup: bool = False  # guesses copied from the context (--lookup)
    lookup_ngram: int = 3
    context_shift: bool = False
    constrained: bool = False  # a JSON Schema, regex or grammar shapes the output
    logprobs: int | None = None
    stop: tuple[str, ...] = ()

    @property
    def speculative(self) -> bool:
        return self.draft or self.lookup

    def check(self, params: SamplingParams, stop_name: str = "--stop",
              grammar_name: str = "--json-schema, --regex or --grammar", hint: str = "") -> None:
        """InvalidParameterError for options that do not combine (with the sampling `params`).
        `stop_name` and `grammar_name` say how the caller's user set those (flags, request fields,
        chat commands); `hint` ends the message."""
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidParameterError(f"--logprobs must be in 0..{MAX_LOGPROBS}, got {self.logprobs}")
        check_beams(self.beams, self.length_penalty)
        if self.draft and self.lookup:
            raise InvalidParameterError("--draft and --lookup are two ways to guess tokens; choose one")
        if self.beams > 1 and self.speculative:
            raise InvalidParameterError("--beams does not combine with --draft or --lookup")
        if self.context_shift and (self.beams > 1 or self.speculative):
            raise InvalidParameterError("--context-shift works with plain decoding only, not --beams, --draft or --lookup")
        if self.speculative:
            check_speculative(params, self.draft_tokens, self.lookup_ngram)
        elif self.draft_tokens is not None:
            raise InvalidParameterError("--draft-tokens needs --draft or --lookup")
        if (self.beams > 1 or self.speculative) and (self.constrained or self.logprobs is not None):
            raise InvalidParameterError("--beams, --draft and --lookup do not combine with a grammar or --logprobs yet")
        if self.constrained and any(self.stop):
            verb = "do" if stop_name.endswith("s") else "does"
            raise InvalidParameterError(f"{stop_name} {verb} not combine with {grammar_name}: "
                                        f"the grammar decides where the output ends{hint}")
