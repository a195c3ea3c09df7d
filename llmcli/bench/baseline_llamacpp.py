"""llama.cpp, through llama-cpp-python, timed on the same GGUF file in the same process as llmcli.

Optional: `pip install 'llmcli[llamacpp]'` compiles llama.cpp (about 10 minutes on two cores).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..errors import LlmcliError
from .measure import Result

INSTALL = ("--baseline llama.cpp needs llama-cpp-python: pip install 'llmcli[llamacpp]' "
           "(it compiles llama.cpp from source, about 10 minutes on two cores)")


class BaselineError(LlmcliError):
    """The baseline engine is missing or cannot run this model."""


class LlamaCppBaseline:
    engine = "llama.cpp"

    def __init__(self, gguf: Path, threads: int, n_ctx: int):
        try:
            from llama_cpp import Llama
        except ImportError:
            raise BaselineError(INSTALL) from None
        if not str(gguf).endswith(".gguf"):
            raise BaselineError(f"llama.cpp reads GGUF files only; {gguf} is not one")
        t0 = time.perf_counter()
        self.llm = Llama(model_path=str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                         n_batch=512, n_ubatch=512, verbose=False)
        self.load_s = time.perf_counter() - t0
        self.size = gguf.stat().st_size
        self.vocab = self.llm.n_vocab()
        self.file_type = _file_type(self.llm.metadata.get("general.file_type"))

    def _tokens(self, n: int, seed: int) -> list[int]:
        rng = np.random.default_rng(seed)  # the same kind of random ids llmcli's side uses
        return rng.integers(100, self.vocab - 100, n).tolist()

    def _argmax(self) -> int:
        """The next token from the last logits, as llmcli's side picks it (greedy)."""
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.vocab,))
        return int(np.argmax(logits))

    def once(self, kind: str, n: int, depth: int) -> tuple[float, float]:
        """(seconds for the test, seconds to the first token), like bench.time_prefill/time_decode."""
        self.llm.reset()  # the next eval drops every cached position from 0 on
        if kind == "pp":
            if depth:
                self.llm.eval(self._tokens(depth, 1))
            ids = self._tokens(n, 2)
            t0 = time.perf_counter()
            self.llm.eval(ids)
            self._argmax()
            elapsed = time.perf_counter() - t0
            return elapsed, elapsed
        self.llm.eval(self._tokens(max(1, depth), 1))
        token = self._argmax()
        t0 = time.perf_counter()
        first = None
        for _ in range(n):
            self.llm.eval([token])
            token = self._argmax()
            if first is None:
                first = time.perf_counter() - t0
        return time.perf_counter() - t0, first

    def result(self, test: str, common: dict) -> Result:
        return Result(**{**common, "test": test, "engine": self.engine, "quant": f"gguf ({self.file_type})",
                         "size_bytes": self.size, "load_s": self.load_s, "peak_mem_bytes": 0})


def _file_type(value) -> str:
    from gguf import LlamaFileType

    try:
        return LlamaFileType(int(value)).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return "?"
