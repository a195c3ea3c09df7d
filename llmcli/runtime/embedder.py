"""Texts -> vectors: a loaded model's last hidden states, pooled (models/pooling.py).

An encoder (BERT) sees each text whole, padding masked out; a causal model (`--pooling last`, or a
GGUF/folder that declares its pooling, like Qwen3-Embedding) runs each text through a cache that
keeps nothing, right-padded, so that no real token sees a pad. Texts are sorted by length and run
`batch_size` at a time (at most BATCH_TOKENS padded tokens a pass), so one long text does not pad
every other.

    embedder = rt.embedder()                       # the model's own pooling, or NoPoolingError
    ids = [embedder.ids(t) for t in texts]         # framed as the model's tokenizer frames a text
    vectors = embedder.embed(ids)                  # (N, dimensions) float32, in the order given
"""

from __future__ import annotations

import numpy as np

from ..cache import new_cache
from ..errors import InvalidParameterError, PromptTooLongError, UnsupportedModelError
from ..models import is_encoder
from ..models.pooling import Pooling, pool, pool_one

BATCH_TEXTS = 32  # sentence-transformers' default batch size
BATCH_TOKENS = 16384  # padded tokens a forward pass holds at most (bounds activation memory)


class NoPoolingError(UnsupportedModelError):
    """A causal model that declares no pooling, and none was asked for."""


class Embedder:
    def __init__(self, rt, pooling: Pooling, batch_size: int = BATCH_TEXTS):
        """`rt` a runtime.Runtime; `pooling` how hidden states become a vector."""
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        loaded = rt.loaded
        self.model, self.tokenizer, self.args = loaded.model, loaded.tokenizer, loaded.args
        self.device, self.dtype = rt.placement.device, rt.placement.dtype
        self.pooling, self.batch_size = pooling, batch_size
        self.encoder = is_encoder(self.args)
        self.max_tokens = rt.max_text_tokens or rt.ctx_size
        self.dimensions = self.args.hidden_size
        framed = self.tokenizer.frame([-1])
        cut = framed.index(-1)
        self.prefix, self.suffix = framed[:cut], framed[cut + 1:]

    def ids(self, text: str, truncate: bool = False, what: str = "the text") -> list[int]:
        """`text`'s ids with the model's own special tokens around them; a text longer than the model
        takes is an error, or with `truncate` cut to fit (its end dropped)."""
        return self.frame(self.tokenizer.encode(text, add_bos=False), truncate, what)

    def frame(self, ids: list[int], truncate: bool = False, what: str = "the text") -> list[int]:
        room = self.max_tokens - len(self.prefix) - len(self.suffix)
        if len(ids) > room:
            if not truncate:
                raise PromptTooLongError(
                    f"{what} is {len(ids) + len(self.prefix) + len(self.suffix)} tokens; this model embeds at most "
                    f"{self.max_tokens} a text: shorten it, or let it be cut (--truncate, or \"truncate\": true)")
            ids = ids[:room]
        if not ids and not self.prefix and not self.suffix:
            raise InvalidParameterError(f"{what} is empty; there is nothing to embed")
        return self.prefix + list(ids) + self.suffix

    def embed(self, texts: list[list[int]]):
        """Framed ids (ids() / frame()) of N texts -> (N, dimensions) float32 on the CPU, in order (a
        torch tensor; a numpy array from the torch-free path's model, one text at a time)."""
        if getattr(self.model, "torch_free", False):
            out = np.empty((len(texts), self.dimensions), np.float32)
            for i, ids in enumerate(texts):
                out[i] = pool_one(self.model.hidden_states(ids), self.pooling)
            return out
        import torch

        with torch.inference_mode():
            return self._embed(texts)

    def _embed(self, texts: list[list[int]]):
        import torch

        out = torch.empty(len(texts), self.dimensions)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # longest first: little padding
        start = 0
        while start < len(order):
            longest = len(texts[order[start]])
            n = max(1, min(self.batch_size, BATCH_TOKENS // longest))
            group = order[start:start + n]
            start += n
            tokens = torch.zeros(len(group), longest, dtype=torch.long)
            for row, i in enumerate(group):
                tokens[row, :len(texts[i])] = torch.tensor(texts[i])
            lengths = torch.tensor([len(texts[i]) for i in group], device=self.device)
            hidden = self._hidden(tokens.to(self.device), lengths)
            out[group] = pool(hidden, lengths, self.pooling).cpu()
        return out

    def _hidden(self, tokens, lengths):
        """(B, T, hidden) last hidden states of right-padded texts."""
        import torch

        if self.encoder:
            mask = torch.arange(tokens.shape[1], device=self.device)[None, :] < lengths[:, None]
            return self.model(tokens, mask)
        # causal: a real token never sees the pads after it
        cache = new_cache(self.args, tokens.shape[1], self.device, self.dtype, "none", batch=tokens.shape[0])
        return self.model.hidden_states(tokens, cache)


def as_float32(vector) -> np.ndarray:
    return vector if isinstance(vector, np.ndarray) else vector.float().numpy()


def floats(vector) -> list[float]:
    """A float32 vector's values (numpy or torch) as the shortest decimals that read back as the same
    float32s (JSON stays short: 0.0123457 rather than 0.012345679104328156)."""
    return [float(x) for x in as_float32(vector).astype(np.float32).astype(str)]


def floats_json(vector) -> str:
    """The same, as a JSON array."""
    return "[" + ", ".join(as_float32(vector).astype(np.float32).astype(str)) + "]"


def embedder_of(rt, pooling: str | None = None, normalize: bool | None = None, batch_size: int = BATCH_TEXTS) -> Embedder:
    """What turns texts into vectors for a runtime (runtime.py's or lean.py's): the model's own
    pooling (rt.pooling), or `pooling` (mean, cls, last, max) and `normalize` where given.
    NoPoolingError for a causal model that declares none and was given none."""
    chosen = rt.pooling
    if pooling is not None:
        default = rt.pooling.normalize if rt.pooling is not None else True
        chosen = Pooling(pooling, default if normalize is None else normalize, "--pooling")
    elif chosen is None:
        raise NoPoolingError(f"{rt.loaded.path.name} is a text-generation model and its files declare no pooling; "
                             "pass --pooling last (or mean) to embed with its last hidden states")
    if normalize is not None and normalize != chosen.normalize:
        chosen = Pooling(chosen.mode, normalize, chosen.source)
    return Embedder(rt, chosen, batch_size)
