"""Tokenizers: one `Tokenizer` over the `tokenizers` library, built from whatever a model ships.

Sources:
- `tokenizer.json` (Hugging Face fast tokenizer): loaded as is.
- `tokenizer.model` (SentencePiece): read with `sentencepiece`, rebuilt as a byte-fallback BPE.
- GGUF metadata: `gpt2` (byte-level BPE, split regex chosen by `tokenizer.ggml.pre` as llama.cpp
  does) or `llama` (SentencePiece BPE: merges recovered from the piece scores).

`StreamDecoder` turns token ids into text one token at a time and never emits half a character.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

from ..errors import CorruptModelError, UnsupportedModelError

# Texts that end a turn in the chat formats people use; a model's own list is added to these
# when the token exists in its vocabulary as a special token (llama.cpp does the same).
END_OF_TURN_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|endoftext|>",
                     "<|end|>", "<end_of_turn>", "</s>", "<|END_OF_TURN_TOKEN|>")

# harmony (gpt-oss's chat format): a reply is messages on channels (analysis, then final), each ending
# with <|end|>; the reply ends with <|return|>, or <|call|> after a tool call. In a vocabulary with
# both, these end a reply and <|end|> does not (llama.cpp drops <|end|> from its end tokens there too)
HARMONY_ENDS = ("<|return|>", "<|call|>")

# GGUF token types (llama.cpp's llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k (GPT-4o, Phi-4-mini): the regex of its tokenizer.json, which llama.cpp rewrites without \p{Lu} classes
_GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# `tokenizer.ggml.pre` -> the regexes llama.cpp applies in turn (llama-vocab.cpp)
PRE_TOKENIZER_SPLITS = {
    **{name: (_GPT2_SPLIT,) for name in ("default", "gpt-2", "gpt2", "mpt", "olmo", "jais")},
    **{name: (r"\p{N}", _GPT2_SPLIT) for name in ("smollm", "starcoder", "refact", "command-r", "codeshell")},
    **{name: (_LLAMA3_SPLIT,) for name in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "falcon3", "dbrx")},
    **{name: (_QWEN2_SPLIT,) for name in ("qwen2", "stablelm2", "deepseek-r1-qwen")},
    "gpt-4o": (_GPT4O_SPLIT,),
}
_IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe", "smaug-bpe", "falcon3", "dbrx"}


@dataclass
class Tokenizer:
    backend: Backend
    bos_id: int | None = None
    eos_ids: frozenset[int] = frozenset()
    add_bos: bool = False
    bos_token: str | None = None
    eos_token: str | None = None
    special_ids: frozenset[int] = field(default_factory=frozenset)
    add_eos: bool = False  # GGUF's tokenizer.ggml.add_eos_token: a text on its own ends with EOS (frame())
    # the backend's `encode_special_tokens` switch is shared state: one encode at a time flips it
    # (a second backend would cost a copy of the vocabulary, slow for a large one)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None, special: bool = True) -> list[int]:
        """`special`: special tokens written in the text (e.g. `<|im_start|>`) become their ids;
        False: they are tokenized as the plain text they are (llama.cpp's parse_special=false), as
        message content must be (formats/prompt.py)."""
        with self.lock:
            if special:
                ids = self.backend.encode(text, add_special_tokens=False).ids
            else:
                self.backend.encode_special_tokens = True
                try:
                    ids = self.backend.encode(text, add_special_tokens=False).ids
                finally:
                    self.backend.encode_special_tokens = False
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            if not ids or ids[0] != self.bos_id:
                ids = [self.bos_id] + ids
        return ids

    def special_tokens_in(self, text: str) -> list[tuple[int, int, int]]:
        """(start, end, id) of each special token written in `text` (character offsets), exactly
        where encode() would make it an id."""
        with self.lock:
            enc = self.backend.encode(text, add_special_tokens=False)
        return [(start, end, t) for t, (start, end) in zip(enc.ids, enc.offsets) if t in self.special_ids]

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special)

    def token_text(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def with_extra_eos(self, texts) -> "Tokenizer":
        """A copy that also ends generation on these token texts (those in the vocabulary)."""
        extra = {self.backend.token_to_id(t) for t in texts} - {None}
        return Tokenizer(self.backend, self.bos_id, self.eos_ids | extra, self.add_bos,
                         self.bos_token, self.eos_token, self.special_ids, self.add_eos, self.lock)

    def frame(self, ids: list[int]) -> list[int]:
        """The ids of one text with the special tokens the model's tokenizer puts around a text on
        its own, as an embedding model sees it: a tokenizer.json's post-processor (BERT's [CLS] ...
        [SEP], the EOS a Qwen3-Embedding tokenizer appends), else BOS where add_bos says and EOS
        where add_eos says (GGUF)."""
        prefix, suffix = self._framing()
        return prefix + list(ids) + suffix

    def _framing(self) -> tuple[list[int], list[int]]:
        with self.lock:
            framed = self.backend.encode("a", add_special_tokens=True).ids
            plain = self.backend.encode("a", add_special_tokens=False).ids
        n = len(plain)
        at = next((i for i in range(len(framed) - n + 1) if framed[i:i + n] == plain), None)
        prefix, suffix = ([], []) if at is None else (framed[:at], framed[at + n:])
        if not prefix and self.add_bos and self.bos_id is not None:
            prefix = [self.bos_id]
        eos = self.backend.token_to_id(self.eos_token) if self.eos_token else None
        if not suffix and self.add_eos and eos is not None:
            suffix = [eos]
        return prefix, suffix


class StreamDecoder:
    """Incremental detokenizer: `push(id)` returns the new text that is final so far.

    It decodes a short window of recent tokens and emits the difference, so SentencePiece's
    leading-space rules and multi-token UTF-8 characters come out right; text ending in an
    incomplete character (U+FFFD) is held back until the next token completes it.
    """

    def __init__(self, tokenizer: Tokenizer, context: list[int] = ()):
        self.tokenizer = tokenizer
        self.ids = list(context[-4:])  # a little left context so a leading space is not stripped
        self.prefix = 0  # window start
        self.read = len(self.ids)  # ids before this are already emitted

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        done = self.tokenizer.decode(self.ids[self.prefix:self.read])
        full = self.tokenizer.decode(self.ids[self.prefix:])
        if full.endswith("\ufffd") or len(full) <= len(done):
            return ""
        new = full[len(done):]
        self.prefix, self.read = self.read, len(self.ids)
        return new

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        done = self.tokenizer.decode(self.ids[self.prefix:self.read])
        full = self.tokenizer.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return full[len(done):] if len(full) > len(done) else ""


# ---------------------------------------------------------------------------- builders


def _special_ids(backend: Backend) -> frozenset[int]:
    return frozenset(i for i, tok in backend.get_added_tokens_decoder().items() if tok.special)


def _end_ids(backend: Backend, declared: list[int]) -> frozenset[int]:
    special = backend.get_added_tokens_decoder()
    texts = {tok.content: i for i, tok in special.items() if tok.special}
    # gpt-oss's harmony format ends each message of one reply (its thinking, then its answer) with
    # <|end|>: there <|return|> and <|call|> end the reply, and <|end|> does not (HARMONY_ENDS)
    harmony = "<|channel|>" in {tok.content for tok in special.values()} or all(t in texts for t in HARMONY_ENDS)
    known = {i for t, i in texts.items() if t in END_OF_TURN_TEXTS or (harmony and t in HARMONY_ENDS)}
    ends = frozenset(i for i in declared if i is not None) | known
    return ends - {texts.get("<|end|>")} if harmony else ends


def _sentencepiece_bpe(pieces: list[str], scores: list[float], types: list[int], add_space_prefix: bool,
                       unk_id: int | None) -> Backend:
    """A byte-fallback BPE that tokenizes like SentencePiece's BPE model (merges ranked by score)."""
    vocab = {p: i for i, p in enumerate(pieces)}
    mergeable = {p: s for p, s, t in zip(pieces, scores, types) if t in (_NORMAL, _USER_DEFINED)}
    merges = []
    for piece, score in mergeable.items():
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    unk = pieces[unk_id] if unk_id is not None and 0 <= unk_id < len(pieces) else None
    backend = Backend(models.BPE(vocab=vocab, merges=[(a, b) for a, b, _ in merges], unk_token=unk,
                                 byte_fallback=True, fuse_unk=True))
    # SentencePiece escapes spaces as U+2581 and adds one in front of the text; like llama.cpp, each
    # text fragment between special tokens gets that prefix (Metaspace would skip it before a space)
    steps = ([normalizers.Prepend("\u2581")] if add_space_prefix else []) + [normalizers.Replace(" ", "\u2581")]
    backend.normalizer = normalizers.Sequence(steps)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    return backend


def _add_typed_tokens(backend: Backend, pieces: list[str], types: list[int]) -> None:
    control = [AddedToken(p, special=True, normalized=False) for p, t in zip(pieces, types) if t == _CONTROL]
    user = [AddedToken(p, special=False, normalized=False) for p, t in zip(pieces, types) if t == _USER_DEFINED]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)


def from_gguf_metadata(meta: dict) -> Tokenizer:
    """Build from `tokenizer.ggml.*` keys (values already decoded to Python types)."""
    try:
        return _from_gguf_metadata(meta)
    except (CorruptModelError, UnsupportedModelError):
        raise
    except BaseException as e:  # the tokenizers library raises bare Exceptions (or panics) on bad input
        if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
            raise
        raise CorruptModelError(f"the GGUF tokenizer cannot be built ({' '.join(str(e).split())[:200]}); "
                                "the file is corrupt, download it again") from None


def _corrupt_vocab(what: str) -> CorruptModelError:
    return CorruptModelError(f"the GGUF tokenizer is corrupt: {what}; download the file again")


def _checked_list(meta: dict, key: str, kind, n: int | None = None) -> list | None:
    values = meta.get(key)
    if values is None:
        return None
    if not isinstance(values, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in values):
        raise _corrupt_vocab(f"{key} is not a list of {getattr(kind, '__name__', 'numbers')}")
    if n is not None and len(values) != n:
        raise _corrupt_vocab(f"{key} has {len(values)} entries for {n} tokens")
    return values


def _gguf_merges(meta: dict, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """`a b` pairs whose parts and result are tokens (tokenizers panics on a merge that is not)."""
    merges = []
    for i, m in enumerate(_checked_list(meta, "tokenizer.ggml.merges", str) or ()):
        a, space, b = m.partition(" ")
        if not space or a not in vocab or b not in vocab or a + b not in vocab:
            raise _corrupt_vocab(f"merge {i} ({m[:40]!r}) is not two tokens that join into a third")
        merges.append((a, b))
    return merges


def _from_gguf_metadata(meta: dict) -> Tokenizer:
    kind = meta.get("tokenizer.ggml.model")
    pieces = _checked_list(meta, "tokenizer.ggml.tokens", str)
    if not pieces:
        raise UnsupportedModelError("the GGUF file has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    types = _checked_list(meta, "tokenizer.ggml.token_type", int, len(pieces)) or [_NORMAL] * len(pieces)
    if kind == "gpt2":
        vocab = {p: i for i, p in enumerate(pieces)}
        merges = _gguf_merges(meta, vocab)
        pre = meta.get("tokenizer.ggml.pre", "default")
        backend = Backend(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in _IGNORE_MERGES))
        splits = PRE_TOKENIZER_SPLITS.get(pre, (_GPT2_SPLIT,))
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        backend.decoder = decoders.ByteLevel()
        add_bos_default = False
    elif kind == "llama":
        scores = _checked_list(meta, "tokenizer.ggml.scores", (int, float), len(pieces)) or [0.0] * len(pieces)
        backend = _sentencepiece_bpe(pieces, scores, types, meta.get("tokenizer.ggml.add_space_prefix", True),
                                     meta.get("tokenizer.ggml.unknown_token_id"))
        add_bos_default = True  # llama.cpp adds BOS to a SentencePiece vocabulary unless told otherwise
    else:
        raise UnsupportedModelError(f"GGUF tokenizer type {kind!r} is not supported; supported: gpt2 (BPE), llama (SentencePiece)")
    _add_typed_tokens(backend, pieces, types)
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    declared = [eos, meta.get("tokenizer.ggml.eot_token_id"), meta.get("tokenizer.ggml.eom_token_id")]
    return Tokenizer(
        backend, bos_id=bos, eos_ids=_end_ids(backend, declared),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)),
        bos_token=pieces[bos] if bos is not None and bos < len(pieces) else None,
        eos_token=pieces[eos] if eos is not None and eos < len(pieces) else None,
        special_ids=_special_ids(backend), add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)))


def _token_content(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptModelError(f"{path} is not valid JSON ({e}); re-download the model") from None
    if not isinstance(data, dict):
        raise CorruptModelError(f"{path} is not a JSON object; re-download the model")
    return data


def from_hf_folder(folder: Path, config: dict) -> Tokenizer:
    """From `tokenizer.json` (preferred) or `tokenizer.model`, plus `tokenizer_config.json` and
    `generation_config.json` for special tokens, BOS handling and end-of-sequence ids."""
    tok_config = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").exists() else {}
    gen_config = _read_json(folder / "generation_config.json") if (folder / "generation_config.json").exists() else {}
    if (folder / "tokenizer.json").exists():
        try:
            backend = Backend.from_file(str(folder / "tokenizer.json"))
        except Exception as e:  # the library raises a bare Exception on malformed files
            raise CorruptModelError(f"{folder / 'tokenizer.json'} cannot be read ({e}); re-download the model") from None
        # a tokenizer.json may carry padding and truncation settings (all-MiniLM-L6-v2's pads and cuts
        # every text to 128 tokens): llmcli never pads a prompt, and never cuts one silently
        backend.no_padding()
        backend.no_truncation()
        # whether the fast tokenizer's post-processor adds BOS by itself
        probe = backend.encode("a", add_special_tokens=True).ids
        plain = backend.encode("a", add_special_tokens=False).ids
        post_adds_bos = len(probe) > len(plain) and probe[1:] == plain
    elif (folder / "tokenizer.model").exists():
        backend = _from_sentencepiece_file(folder / "tokenizer.model", tok_config)
        post_adds_bos = True
    else:
        raise UnsupportedModelError(f"{folder} has no tokenizer.json or tokenizer.model")
    # tokens declared in tokenizer_config (added_tokens_decoder) that the backend lacks
    for _id, spec in sorted(tok_config.get("added_tokens_decoder", {}).items(), key=lambda kv: int(kv[0])):
        if backend.token_to_id(spec["content"]) is None:  # (special false: a plain added token, kept when decoding)
            special = spec.get("special", True)
            token = AddedToken(spec["content"], special=special, normalized=False)
            (backend.add_special_tokens if special else backend.add_tokens)([token])
    bos_token = _token_content(tok_config.get("bos_token"))
    eos_token = _token_content(tok_config.get("eos_token"))
    bos_id = backend.token_to_id(bos_token) if bos_token else config.get("bos_token_id")
    if bos_token is None and bos_id is not None:
        bos_token = backend.id_to_token(bos_id)
    declared = []
    for source in (gen_config.get("eos_token_id"), config.get("eos_token_id")):
        declared.extend(source if isinstance(source, list) else [source])
    if eos_token:
        declared.append(backend.token_to_id(eos_token))
    if eos_token is None and declared and declared[0] is not None:
        eos_token = backend.id_to_token(declared[0])
    add_bos = tok_config.get("add_bos_token", post_adds_bos)
    return Tokenizer(backend, bos_id=bos_id, eos_ids=_end_ids(backend, declared), add_bos=bool(add_bos),
                     bos_token=bos_token, eos_token=eos_token, special_ids=_special_ids(backend))


def _from_sentencepiece_file(path: Path, tok_config: dict) -> Backend:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(str(path))
    except (OSError, RuntimeError) as e:
        raise CorruptModelError(f"{path} is not a SentencePiece model ({e}); re-download the model") from None
    n = sp.GetPieceSize()
    pieces = [sp.IdToPiece(i) for i in range(n)]
    scores = [sp.GetScore(i) for i in range(n)]
    types = [_CONTROL if sp.IsControl(i) else _UNKNOWN if sp.IsUnknown(i) else _BYTE if sp.IsByte(i)
             else _USER_DEFINED if sp.IsUnused(i) is False and _is_user_defined(sp, i) else _NORMAL for i in range(n)]
    add_prefix = tok_config.get("add_prefix_space", True)
    backend = _sentencepiece_bpe(pieces, scores, types, add_prefix if add_prefix is not None else True, sp.unk_id())
    _add_typed_tokens(backend, pieces, types)
    return backend


def _is_user_defined(sp, i: int) -> bool:
    fn = getattr(sp, "IsUserDefined", None) or getattr(sp, "is_user_defined", None)
    return bool(fn(i)) if fn else False
