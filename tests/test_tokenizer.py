"""Tokenizers built from tokenizer.json, tokenizer.model and GGUF metadata; streaming decode."""

from __future__ import annotations

import json
import shutil

import pytest
import sentencepiece as spm
from tiny import tokenizer_json

from llmcli.formats.tokenizer import StreamDecoder, Tokenizer, from_gguf_metadata, from_hf_folder

TEXTS = [
    "Hello world", " leading space", "  two leading spaces", "trailing space ", "a\nnew line\n\nand two",
    "tabs\tand  double  spaces", "digits 1234567890 and 3.14159", "héllo wörld naïve café",
    "日本語のテキスト", "emoji 🙂🚀 and ZWJ 👩‍💻", "byte fallback ꙮ🦜 𝔘", "<unk> is literal text here", "x" * 50, "",
]


@pytest.fixture(scope="module")
def sp(spm_model):
    proc = spm.SentencePieceProcessor()
    proc.Load(str(spm_model))
    return proc


@pytest.fixture(scope="module")
def spm_folder(spm_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("spm")
    shutil.copy(spm_model, folder / "tokenizer.model")
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return folder


def test_sentencepiece_model_matches_sentencepiece(sp, spm_folder):
    tok = from_hf_folder(spm_folder, {})
    assert tok.bos_id == 1 and tok.add_bos and 2 in tok.eos_ids
    for text in TEXTS:
        assert tok.encode(text, add_bos=False) == sp.encode(text), text
        assert tok.decode(sp.encode(text)) == sp.decode(sp.encode(text)), text
    assert tok.encode("Hi")[0] == 1  # BOS added by default for SentencePiece models


def _gguf_meta_from_sp(sp) -> dict:
    n = sp.GetPieceSize()
    types = [3 if sp.IsControl(i) else 2 if sp.IsUnknown(i) else 6 if sp.IsByte(i) else 1 for i in range(n)]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [sp.IdToPiece(i) for i in range(n)],
            "tokenizer.ggml.scores": [sp.GetScore(i) for i in range(n)], "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}


def test_gguf_sentencepiece_vocab_matches_sentencepiece(sp):
    tok = from_gguf_metadata(_gguf_meta_from_sp(sp))
    assert tok.add_bos and tok.bos_token == "<s>" and tok.eos_token == "</s>"
    for text in TEXTS:
        assert tok.encode(text, add_bos=False) == sp.encode(text), text
    assert tok.encode("</s>", add_bos=False) == [2]  # control tokens written in text are parsed


def test_gguf_byte_level_vocab_matches_tokenizer_json(tmp_path):
    spec = json.loads(tokenizer_json())
    vocab = spec["model"]["vocab"]
    pieces = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": pieces,
            "tokenizer.ggml.token_type": [3 if p.startswith("<|") else 1 for p in pieces],
            "tokenizer.ggml.merges": [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]],
            "tokenizer.ggml.eos_token_id": 2}
    gguf_tok = from_gguf_metadata(meta)
    (tmp_path / "tokenizer.json").write_text(tokenizer_json())
    hf_tok = from_hf_folder(tmp_path, {"eos_token_id": 2})
    for text in TEXTS + ["<|im_start|>user\nhi<|im_end|>"]:
        assert gguf_tok.encode(text) == hf_tok.encode(text), text
        assert gguf_tok.decode(gguf_tok.encode(text)) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")


def _stream(tok: Tokenizer, ids: list[int], context=()) -> list[str]:
    dec = StreamDecoder(tok, list(context))
    pieces = [dec.push(i) for i in ids]
    pieces.append(dec.flush())
    return pieces


@pytest.mark.parametrize("text", ["rare ꙮ🦜 𝔘 and 日本語", " leading and  double spaces", "a\n\nb héllo"])
def test_stream_decoder_emits_whole_characters(sp, spm_folder, text):
    tok = from_hf_folder(spm_folder, {})
    ids = sp.encode(text)
    pieces = _stream(tok, ids)
    assert "".join(pieces) == sp.decode(ids)
    assert all("\ufffd" not in p for p in pieces)
    # these characters are byte-fallback tokens: 3 or 4 ids make one character, and it comes out whole
    if "🦜" in text:
        assert sum(sp.IdToPiece(i).startswith("<0x") for i in ids) == 11
        for char in "ꙮ🦜𝔘":
            assert any(p.endswith(char) for p in pieces)
        assert pieces.count("") >= 8  # the bytes before each character's last one were held back


def test_stream_decoder_keeps_leading_space_after_context(sp, spm_folder):
    """SentencePiece drops the space of a first piece; with the prompt as context it must not."""
    tok = from_hf_folder(spm_folder, {})
    prompt, answer = sp.encode("The answer is"), sp.encode(" forty two", add_bos=False)
    full = sp.decode(prompt + answer)
    assert "".join(_stream(tok, answer, prompt)) == full[len(sp.decode(prompt)):]
