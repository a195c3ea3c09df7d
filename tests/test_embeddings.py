"""Embeddings: the BERT encoder and pooling against sentence-transformers, last-token pooling of a
causal model against transformers' hidden states, what model files say about pooling, and `llmcli embed`.

References run in float32; vectors must agree to 1e-4 (absolute), as the issue asks."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import run_cli
from test_cli_run import assert_one_line_error

from llmcli.errors import CorruptModelError, PromptTooLongError, UnsupportedModelError
from llmcli.formats.embedding import gguf_pooling
from llmcli.formats.open import open_model_file
from llmcli.models.pooling import Pooling
from llmcli.runtime.embedder import NoPoolingError, floats
from llmcli.runtime.runtime import open_model

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello world! naïve café", "x",
         "What is the capital of France? Paris is the capital of France, and the numbers 12345 and 678 are not."]
SENTENCES = ["The cat sits on the mat.", "A feline rests on a rug.", "Quarterly revenue grew by twelve percent."]


def sentence_transformer(folder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def embedder(folder, **kw):
    return open_model(str(folder), allow_encoder=True, dtype="float32", threads=1).embedder(**kw)


# ------------------------------------------------------------------------------ BERT and pooling


@pytest.mark.parametrize("pooling, normalize", [("mean", True), ("mean", False), ("cls", True), ("max", False),
                                                ("lasttoken", True)])
def test_pooling_matches_sentence_transformers(tmp_path, one_thread, pooling, normalize):
    from tiny import save_bert

    folder = save_bert(tmp_path / "m", pooling, normalize)
    e = embedder(folder, batch_size=2)  # several passes, each padded to its longest text
    assert e.pooling == Pooling("last" if pooling == "lasttoken" else pooling, normalize, "1_Pooling/config.json")
    ids = [e.ids(t) for t in TEXTS]
    st = sentence_transformer(folder)
    assert [len(i) for i in ids] == st.tokenize(TEXTS)["attention_mask"].sum(1).tolist()
    got, want = e.embed(ids), torch.tensor(st.encode(TEXTS, batch_size=3))
    assert (got - want).abs().max() < 1e-5
    assert torch.allclose(got.norm(dim=1), torch.ones(len(TEXTS))) == normalize


def test_padding_does_not_change_a_vector(tiny_bert_folder, one_thread):
    e = embedder(tiny_bert_folder)
    ids = [e.ids(t) for t in TEXTS]
    alone = torch.cat([e.embed([i]) for i in ids])
    assert (e.embed(ids) - alone).abs().max() < 1e-6  # together, padded to the longest, in any order
    assert (e.embed(ids[::-1]).flip(0) - alone).abs().max() < 1e-6


def test_minilm_matches_sentence_transformers(minilm_folder, one_thread):
    e = embedder(minilm_folder)
    assert (e.dimensions, e.max_tokens, e.pooling) == (384, 256, Pooling("mean", True, "1_Pooling/config.json"))
    long = "a long text about nothing in particular " * 60  # 422 tokens: cut to 256, as sentence-transformers does
    with pytest.raises(PromptTooLongError, match="is 422 tokens; this model embeds at most 256"):
        e.ids(long)
    texts = TEXTS + SENTENCES + [long]
    got = e.embed([e.ids(t, truncate=True) for t in texts])
    want = torch.tensor(sentence_transformer(minilm_folder).encode(texts))
    assert (got - want).abs().max() < 1e-4
    assert torch.nn.functional.cosine_similarity(got, want).min() > 1 - 1e-6
    sims = got[4:7] @ got[4:7].T  # the cat and the feline are close; revenue is far from both
    assert sims[0, 1] > 0.4 > 0.1 > sims[0, 2].abs()


def test_causal_last_token_matches_transformers_hidden_states(tiny_folder, one_thread):
    from transformers import AutoModelForCausalLM

    rt = open_model(str(tiny_folder), dtype="float32")
    with pytest.raises(NoPoolingError, match="declare no pooling; pass --pooling last"):
        rt.embedder()
    e = rt.embedder("last", normalize=False, batch_size=3)
    ids = [e.ids(t) for t in TEXTS]
    ref = AutoModelForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32).eval()
    with torch.no_grad():
        want = torch.stack([ref.model(torch.tensor([i])).last_hidden_state[0, -1] for i in ids])
    assert (e.embed(ids) - want).abs().max() < 1e-4
    mean = rt.embedder("mean", normalize=True).embed(ids)
    with torch.no_grad():
        states = [ref.model(torch.tensor([i])).last_hidden_state[0].mean(0) for i in ids]
    assert (mean - torch.nn.functional.normalize(torch.stack(states), dim=1)).abs().max() < 1e-5


def test_floats_are_the_shortest_that_read_back():
    v = torch.tensor([0.1, -1 / 3, 1e-8, 0.0], dtype=torch.float32)
    assert floats(v)[0] == 0.1 and json.dumps(floats(v)) == "[0.1, -0.33333334, 1e-08, 0.0]"
    assert np.array(floats(v), dtype=np.float32).tobytes() == v.numpy().tobytes()


# ------------------------------------------------------------------------------ what the files say


def test_gguf_pooling_types():
    assert gguf_pooling({"qwen3.pooling_type": 3}, "qwen3", False) == Pooling("last", True, "GGUF qwen3.pooling_type")
    assert gguf_pooling({"bert.pooling_type": 1}, "bert", True).mode == "mean"
    assert gguf_pooling({"bert.pooling_type": 2}, "bert", True).mode == "cls"
    assert gguf_pooling({}, "llama", False) is None and gguf_pooling({"llama.pooling_type": 0}, "llama", False) is None
    with pytest.raises(UnsupportedModelError, match="reranker"):
        gguf_pooling({"qwen3.pooling_type": 4}, "qwen3", False)
    with pytest.raises(CorruptModelError, match="pooling_type is 9"):
        gguf_pooling({"qwen3.pooling_type": 9}, "qwen3", False)


def test_folders_that_cannot_be_pooled_as_they_say_are_refused(tiny_bert_folder, tmp_path):
    folder = shutil.copytree(tiny_bert_folder, tmp_path / "m")
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps(modules + [{"path": "3_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(UnsupportedModelError, match="Dense module, which llmcli does not apply"):
        open_model_file(folder).pooling
    (folder / "modules.json").write_text(json.dumps(modules))
    config = json.loads((folder / "1_Pooling/config.json").read_text())
    (folder / "1_Pooling/config.json").write_text(json.dumps({**config, "pooling_mode_cls_token": True}))
    with pytest.raises(UnsupportedModelError, match="asks for 2 modes at once"):
        open_model_file(folder).pooling
    (folder / "1_Pooling/config.json").write_text(json.dumps({"pooling_mode": "lasttoken"}))  # newer files name it
    assert open_model_file(folder).pooling == Pooling("last", True, "1_Pooling/config.json")
    (folder / "modules.json").unlink()  # a plain BERT folder: mean, normalized
    assert open_model_file(folder).pooling == Pooling("mean", True, "the default for an encoder")
    (folder / "sentence_bert_config.json").unlink()
    assert open_model_file(folder).max_text_tokens == 64  # its positions


def test_tokenizer_json_padding_is_ignored(minilm_folder):
    """all-MiniLM-L6-v2's tokenizer.json pads and cuts every text to 128 tokens: never here."""
    tok = open_model_file(minilm_folder).tokenizer
    assert tok.frame(tok.encode("hello world")) == [101, 7592, 2088, 102]
    assert len(tok.encode("word " * 300)) == 300


# ------------------------------------------------------------------------------ the command


def test_cli_embed_one_text_lines_and_jsonl(tiny_bert_folder):
    e = embedder(tiny_bert_folder)
    want = e.embed([e.ids(t) for t in TEXTS])
    one = run_cli("embed", str(tiny_bert_folder), TEXTS[0], "-t", "1")
    assert one.returncode == 0, one.stderr
    (line,) = one.stdout.splitlines()
    obj = json.loads(line)
    assert list(obj) == ["tokens", "embedding"] and obj["tokens"] == len(e.ids(TEXTS[0]))
    assert (torch.tensor(obj["embedding"]) - want[0]).abs().max() < 1e-6
    piped = run_cli("embed", str(tiny_bert_folder), "--lines", "-t", "1", "-v", input="\n".join(TEXTS[:2]) + "\n\n" + TEXTS[2] + "\n")
    got = [json.loads(x) for x in piped.stdout.splitlines()]
    assert [g["index"] for g in got] == [0, 1, 2] and "mean pooling, normalized" in piped.stderr
    assert (torch.tensor([g["embedding"] for g in got]) - want[:3]).abs().max() < 1e-6
    jsonl = "\n".join(json.dumps({"id": f"t{i}", "text": t}) for i, t in enumerate(TEXTS))
    got = [json.loads(x) for x in run_cli("embed", str(tiny_bert_folder), "-", "--jsonl", "-t", "1", input=jsonl).stdout.splitlines()]
    assert [g["id"] for g in got] == ["t0", "t1", "t2", "t3"]
    assert (torch.tensor([g["embedding"] for g in got]) - want).abs().max() < 1e-6
    # lines of an argument end at \n alone, as stdin's do: U+2028 inside a line keeps it one text
    joined = "\n".join(TEXTS[:2]).replace(" ", "\u2028", 1)
    got = [json.loads(x) for x in run_cli("embed", str(tiny_bert_folder), joined, "--lines", "-t", "1").stdout.splitlines()]
    assert [g["index"] for g in got] == [0, 1]


@pytest.mark.parametrize("args, input, needle", [
    (["run", "{bert}", "hi"], None, "is an embedding model (bert): it makes vectors, not text; use `llmcli embed"),
    (["chat", "{bert}"], "hi\n", "is an embedding model (bert)"),
    (["embed", "{llama}", "hi"], None, "declare no pooling; pass --pooling last"),
    (["quantize", "{bert}", "-o", "{bert}-q4"], None, "is an embedding model (bert); llmcli quantizes text-generation"),
    (["embed", "{bert}", "word " * 60], None, "this model embeds at most 48 a text: shorten it, or let it be cut (--truncate"),
    (["embed", "{bert}", "--lines"], "ok\n" + "word " * 60 + "\n", "line 2 is 182 tokens"),
    (["embed", "{bert}", "--jsonl"], '{"id": 1}\n', "line 1 must be a JSON object with a non-empty \"text\""),
    (["embed", "{bert}", "hi", "--pooling", "sum"], None, "--pooling must be one of mean, cls, last, max"),
    (["embed", "{bert}", "hi", "--lines", "--jsonl"], None, "pass one"),
])
def test_cli_mistakes_are_one_line(tiny_bert_folder, tiny_folder, args, input, needle):
    args = [a.format(bert=tiny_bert_folder, llama=tiny_folder) for a in args]
    r = run_cli(*args, *(["-t", "1"] if args[0] != "quantize" else []), input=input)
    assert_one_line_error(r, needle)


def test_cli_embed_truncate_and_causal_pooling(tiny_bert_folder, tiny_folder):
    cut = run_cli("embed", str(tiny_bert_folder), "word " * 60, "--truncate", "-t", "1")
    assert json.loads(cut.stdout)["tokens"] == 48
    last = run_cli("embed", str(tiny_folder), "hello", "--pooling", "last", "--no-normalize", "-t", "1", "--dtype", "float32")
    e = open_model(str(tiny_folder), dtype="float32", threads=1).embedder("last", normalize=False)
    want = e.embed([e.ids("hello")])[0]
    assert (torch.tensor(json.loads(last.stdout)["embedding"]) - want).abs().max() < 1e-5
