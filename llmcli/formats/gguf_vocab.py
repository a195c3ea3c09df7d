"""A Hugging Face folder's tokenizer as the `tokenizer.ggml.*` keys llama.cpp's convert_hf_to_gguf.py
writes (its set_vocab per architecture), so llama.cpp and ollama tokenize the file as the folder does.

    llama (SentencePiece)  tokenizer.model: pieces, scores, types (_create_vocab_sentencepiece);
                           a llama-style tokenizer.json without one: pieces at score -1000 (LlamaHfVocab)
    gpt2 (byte-level BPE)  tokenizer.json: pieces, types, merges, and `tokenizer.ggml.pre` named by the
                           hash of the ids the tokenizer gives a check text (get_vocab_base)

Special token ids, add_bos/add_eos, merges and the chat template come from gguf-py's SpecialVocab,
which the converter itself uses. The vocabulary has exactly `n_vocab` entries (the embedding's rows),
padded with unused `[PADi]` pieces as the converter pads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from contextlib import contextmanager
from pathlib import Path

from ..errors import CorruptModelError, UnsupportedModelError
from .gguf_pretokenizers import CHECK_TEXT, NAMES

# GGUF token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@contextmanager
def quiet_gguf():
    """gguf-py logs its choices (and warnings Python's last-resort handler would print): library code stays quiet."""
    log = logging.getLogger("gguf")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def add_vocab(writer, folder: Path, arch: str, n_vocab: int) -> list[str]:
    """Write the folder's tokenizer keys for GGUF architecture `arch`; returns notes for the user."""
    import gguf

    tok_config = _json(folder / "tokenizer_config.json")
    spm = (folder / "tokenizer.model").is_file()
    if arch == "phi3":
        spm = spm and tok_config.get("tokenizer_class") != "GPT2Tokenizer"
    if arch == "llama" and tok_config.get("add_prefix_space") is not None:
        writer.add_add_space_prefix(bool(tok_config["add_prefix_space"]))
    notes = []
    if spm:
        _sentencepiece(writer, folder, tok_config, n_vocab, phi3=arch == "phi3")
        if arch == "gemma3":
            writer.add_add_space_prefix(False)
    elif not (folder / "tokenizer.json").is_file():
        raise UnsupportedModelError(f"{folder} has no tokenizer.json or tokenizer.model to write into the GGUF")
    elif arch == "llama" and _llama_style(_json(folder / "tokenizer.json")):
        _llama_hf(writer, folder, tok_config, n_vocab)
    else:
        notes = _byte_level_bpe(writer, folder, tok_config, n_vocab)
    with quiet_gguf():
        try:
            special = gguf.SpecialVocab(folder, load_merges=not spm, n_vocab=n_vocab)
        except (ValueError, OSError, KeyError, TypeError) as e:
            raise CorruptModelError(f"{folder}'s tokenizer files cannot be read ({e}); download the model again") from None
        special.add_to_gguf(writer, quiet=True)
        if arch == "llama" and n_vocab == 49152:  # LlamaModel.set_vocab: granite's (and SmolLM2's) size adds no BOS
            writer.add_add_bos_token(False)
    return notes


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptModelError(f"{path} is not valid JSON ({e}); download the model again") from None
    return data if isinstance(data, dict) else {}


def _looks_special(token: str) -> bool:
    """The converter's does_token_look_special: added tokens some models forget to mark special."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>")) or (token.startswith("<unused") and token.endswith(">")))


def _added_tokens(folder: Path, tok_config: dict) -> dict[int, dict]:
    """id -> {"content", "special", "normalized"}: tokenizer.json's added tokens and tokenizer_config's
    added_tokens_decoder (transformers adds those too)."""
    added = {int(k): v for k, v in tok_config.get("added_tokens_decoder", {}).items() if isinstance(v, dict)}
    for t in _json(folder / "tokenizer.json").get("added_tokens", []):
        added[int(t["id"])] = t
    return added


# ------------------------------------------------------------------------------ byte-level BPE


def _byte_level_bpe(writer, folder: Path, tok_config: dict, n_vocab: int) -> list[str]:
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    by_id = {i: t for t, i in backend.get_vocab(with_added_tokens=True).items()}
    added = _added_tokens(folder, tok_config)
    for i, t in added.items():
        by_id.setdefault(i, t["content"])
    if by_id and max(by_id) >= n_vocab:
        raise UnsupportedModelError(f"the tokenizer has ids up to {max(by_id)}, beyond the embedding's {n_vocab} "
                                    "rows; llama.cpp cannot load such a file")
    tokens, types = [], []
    for i in range(n_vocab):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        if i in added:
            if not added[i].get("normalized", True):  # as the converter: the text the tokenizer gives back
                token = backend.decode(backend.encode(token, add_special_tokens=False).ids, skip_special_tokens=False)
            if added[i].get("special") or _looks_special(token):
                types.append(CONTROL)
            else:
                token = token.replace("\u2581", " ")  # pre-normalized user-defined spaces
                types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
        tokens.append(token)
    ids = backend.encode(CHECK_TEXT).ids  # with the post-processor's special tokens, as AutoTokenizer.encode
    pre = NAMES.get(hashlib.sha256(str(ids).encode()).hexdigest())
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre or "default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if pre is None:
        return ["the tokenizer's pre-tokenizer is not one llama.cpp knows by its hash; written as 'default' "
                "(llama.cpp splits text as GPT-2 does, which may tokenize some text differently)"]
    return []


# ------------------------------------------------------------------------------ SentencePiece


def _sentencepiece(writer, folder: Path, tok_config: dict, n_vocab: int, phi3: bool = False) -> None:
    """The converter's _create_vocab_sentencepiece (phi3: Phi3MiniModel.set_vocab's added tokens)."""
    from sentencepiece import SentencePieceProcessor

    sp = SentencePieceProcessor()
    try:
        sp.LoadFromFile(str(folder / "tokenizer.model"))
    except (OSError, RuntimeError) as e:
        raise CorruptModelError(f"{folder / 'tokenizer.model'} cannot be read ({e}); download the model again") from None
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    scores = [-10000.0] * n_vocab
    types = [UNUSED] * n_vocab
    for i in range(min(sp.vocab_size(), n_vocab)):
        tokens[i], scores[i] = sp.IdToPiece(i), sp.GetScore(i)
        types[i] = (UNKNOWN if sp.IsUnknown(i) else CONTROL if sp.IsControl(i) else UNUSED if sp.IsUnused(i)
                    else BYTE if sp.IsByte(i) else NORMAL)
    for text, i in _json(folder / "added_tokens.json").items():
        if isinstance(i, int) and i < n_vocab:
            tokens[i], scores[i], types[i] = text, -1000.0, USER_DEFINED
    declared = dict(tok_config.get("added_tokens_decoder", {}))
    if phi3:
        declared.update({str(t["id"]): t for t in _json(folder / "tokenizer.json").get("added_tokens", [])})
    for key, spec in declared.items():
        i, text = int(key), spec["content"]
        if i >= n_vocab:
            continue
        special = spec.get("special") or (not phi3 and _looks_special(text))
        tokens[i] = text if special or phi3 else text.replace("\u2581", " ")
        scores[i], types[i] = -1000.0, CONTROL if special else USER_DEFINED
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)


def _llama_style(tokenizer_json: dict) -> bool:
    """A SentencePiece-style BPE saved as tokenizer.json only (gguf-py's LlamaHfVocab's test)."""
    model = tokenizer_json.get("model", {})
    return (model.get("type") == "BPE" and bool(model.get("byte_fallback"))
            and tokenizer_json.get("decoder", {}).get("type") == "Sequence")


def _llama_hf(writer, folder: Path, tok_config: dict, n_vocab: int) -> None:
    """gguf-py's LlamaHfVocab without transformers: every piece at score -1000, <0xNN> as bytes,
    special added tokens as control tokens."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    by_id = {i: t for t, i in backend.get_vocab(with_added_tokens=True).items()}
    added = _added_tokens(folder, tok_config)
    tokens, types = [], []
    for i in range(n_vocab):
        token = by_id.get(i, f"[PAD{i}]")
        tokens.append(token)
        if i not in by_id:
            types.append(UNUSED)
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):
            types.append(BYTE)
        elif i in added:
            types.append(CONTROL if added[i].get("special") else USER_DEFINED)
        else:
            types.append(NORMAL)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([-1000.0] * n_vocab)
    writer.add_token_types(types)
