"""OpenAI's embeddings endpoint, both ways: a request body -> a checked EmbeddingJob, and vectors ->
the list object OpenAI returns. No HTTP and no model here (openai_endpoints.py runs it).

    input            a string, a list of strings, a list of token ids, or a list of such lists
                     (at most MAX_INPUTS); token ids get the model's own special tokens around them
                     ([CLS] ... [SEP]), as a text's do
    encoding_format  "float" (the default) or "base64": the little-endian float32 bytes, as OpenAI
                     sends them (the openai Python client asks for base64 unless told otherwise)
    dimensions       only the model's own size: these models were not trained to be cut shorter
    truncate         ollama's extra field: cut a text that is too long instead of answering 400
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from ..runtime.embedder import as_float32, floats
from .openai_api import ApiError

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


@dataclass
class EmbeddingJob:
    inputs: list[str | list[int]]
    base64: bool
    dimensions: int | None
    truncate: bool
    model: str | None


def embedding_job(body: dict) -> EmbeddingJob:
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise ApiError(400, f"encoding_format must be float or base64, got {fmt!r}", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1):
        raise ApiError(400, f"dimensions must be a whole number of at least 1, got {dimensions!r}", "dimensions")
    truncate = body.get("truncate", False)
    if not isinstance(truncate, bool):
        raise ApiError(400, f"truncate must be true or false, got {truncate!r}", "truncate")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "model must be a string", "model")
    return EmbeddingJob(_inputs(body.get("input")), fmt == "base64", dimensions, truncate, model)


def _inputs(value) -> list[str | list[int]]:
    """OpenAI's four shapes of `input` -> a list of texts and token-id lists."""
    shape = "input must be a string, a list of strings, a list of token ids or a list of token-id lists"
    if value is None:
        raise ApiError(400, f"input is required; {shape}", "input")
    if isinstance(value, str) or _ids(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"input is empty or of the wrong type; {shape}", "input")
    if len(value) > MAX_INPUTS:
        raise ApiError(400, f"input holds {len(value)} items; at most {MAX_INPUTS} a request", "input")
    for i, item in enumerate(value):
        if not (isinstance(item, str) or _ids(item)):
            raise ApiError(400, f"input[{i}] is not a string or a list of token ids; {shape}", f"input[{i}]")
        if isinstance(item, str) and not item:
            raise ApiError(400, f"input[{i}] is an empty string; there is nothing to embed", f"input[{i}]")
    return value


def _ids(value) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value))


def embeddings_response(model: str, vectors, tokens: int, as_base64: bool) -> dict:
    """vectors (N, dimensions) float32, numpy or torch -> OpenAI's list of embedding objects, with usage."""
    def encode(v):
        if as_base64:
            return base64.b64encode(as_float32(v).astype("<f4").tobytes()).decode("ascii")
        return floats(v)

    data = [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
