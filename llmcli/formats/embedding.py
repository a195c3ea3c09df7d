"""What a model file says about embedding texts: its pooling, whether vectors are normalized, and
the longest text it takes.

    folder   sentence-transformers' files: modules.json lists Transformer, Pooling (its folder's
             config.json picks the mode) and Normalize modules; sentence_bert_config.json has
             max_seq_length
    .gguf    `{arch}.pooling_type` (llama.cpp's: 0 none, 1 mean, 2 cls, 3 last, 4 rank); vectors are
             normalized, as llama-server and ollama return them

An encoder (BERT) without sentence-transformers files is mean-pooled and normalized (what
sentence-transformers does with a plain model, plus the normalization llama-server applies). A
causal model declares no pooling unless its files do (Qwen3-Embedding's modules.json or GGUF): it
embeds only when asked to with --pooling.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import CorruptModelError, UnsupportedModelError
from ..models import is_encoder
from ..models.pooling import Pooling

GGUF_POOLING = {1: "mean", 2: "cls", 3: "last"}
# sentence-transformers' Pooling config keys -> mode
_ST_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "last",
             "pooling_mode_max_tokens": "max"}
_ST_UNSUPPORTED = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
_ST = "sentence_transformers.models."
_ST_MODULES = {_ST + "Transformer", _ST + "Pooling", _ST + "Normalize"}


def gguf_pooling(meta: dict, arch: str | None, encoder: bool) -> Pooling | None:
    value = meta.get(f"{arch}.pooling_type")
    key = f"GGUF {arch}.pooling_type"
    if value in GGUF_POOLING:
        return Pooling(GGUF_POOLING[value], True, key)
    if value == 4:
        raise UnsupportedModelError("this GGUF is a reranker (pooling_type rank), not an embedding model; "
                                    "llmcli does not rerank")
    if value not in (None, 0):
        raise CorruptModelError(f"{key} is {value!r}; llama.cpp's types are 0 to 4")
    return Pooling("mean", True, "the default for an encoder") if encoder else None


def folder_pooling(folder: Path, args) -> Pooling | None:
    modules = _json(folder / "modules.json")
    if modules is None:
        return Pooling("mean", True, "the default for an encoder") if is_encoder(args) else None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise CorruptModelError(f"{folder / 'modules.json'} is not a list of modules; download the model again")
    kinds = [m.get("type") for m in modules]
    other = [k for k in kinds if k not in _ST_MODULES]
    if other:
        raise UnsupportedModelError(f"{folder.name}'s sentence-transformers pipeline has a {other[0]} module, which "
                                    "llmcli does not apply (it runs Transformer, Pooling and Normalize)")
    normalize = _ST + "Normalize" in kinds
    pooling = next((m for m in modules if m.get("type") == _ST + "Pooling"), None)
    if pooling is None:
        raise UnsupportedModelError(f"{folder.name}'s modules.json has no Pooling module: it makes one vector per "
                                    "token, not per text")
    where = f"{pooling.get('path') or '.'}/config.json"
    config = _json(folder / where)
    if not isinstance(config, dict):
        raise CorruptModelError(f"{folder / where} is missing or not a JSON object; download the model again")
    mode = config.get("pooling_mode")  # newer sentence-transformers write the mode by name
    modes = [{"lasttoken": "last"}.get(mode, mode)] if isinstance(mode, str) else \
        [m for key, m in _ST_MODES.items() if config.get(key)]
    odd = [key for key in _ST_UNSUPPORTED if config.get(key)] or [m for m in modes if m not in _ST_MODES.values()]
    if odd or len(modes) != 1:
        what = odd[0] if odd else ("no pooling mode" if not modes else f"{len(modes)} modes at once")
        raise UnsupportedModelError(f"{folder / where} asks for {what}; llmcli pools with one of mean, cls, last, max")
    return Pooling(modes[0], normalize, where)


def max_text_tokens(folder: Path) -> int | None:
    """sentence-transformers' max_seq_length (all-MiniLM-L6-v2: 256 of its 512 positions), if given."""
    config = _json(folder / "sentence_bert_config.json")
    value = config.get("max_seq_length") if isinstance(config, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _json(path: Path):
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptModelError(f"{path} is not valid JSON ({e}); download the model again") from None
