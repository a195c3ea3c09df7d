"""Constrained output (--json-schema, --regex, --grammar: Lark or llama.cpp's GBNF) and --logprobs:
the mask on hand-built logits, generation with a scripted model, every bad input as one line before
the model loads, and the real SmolLM2 writing JSON that parses and validates."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch
from conftest import run_cli
from test_cli_run import assert_one_line_error
from test_generate import ScriptedModel
from tiny import tokenizer_json

from llmcli.cache.static import StaticKVCache
from llmcli.decode import constrained
from llmcli.decode.generate import Logprobs, generate
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams, token_logprobs
from llmcli.errors import GrammarError, InvalidParameterError
from llmcli.formats.tokenizer import from_hf_folder
from llmcli.runtime.runtime import Runtime

GREEDY = SamplingParams(temperature=0)
GRAMMARS = Path(__file__).parent / "data" / "grammars"  # llama.cpp's own samples (README.md there)
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0}}}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    (folder / "tokenizer.json").write_text(tokenizer_json())
    return from_hf_folder(folder, {"eos_token_id": 2})


@pytest.fixture(scope="module")
def compiler(tok):
    return constrained.GrammarCompiler(tok)


def texts(tok, ids):
    return [tok.decode([i], skip_special=False) for i in ids]


# ------------------------------------------------------------------------- the mask


def test_mask_keeps_allowed_logits_and_forbids_the_rest_and_the_padding(tok, compiler):
    c = compiler.constraint(constrained.from_regex("[0-9]+"))
    width = tok.vocab_size + 8  # a model's head is often wider than its vocabulary
    logits = torch.randn(width, generator=torch.Generator().manual_seed(0))
    out = c.mask(logits)
    allowed = (out > float("-inf")).nonzero().flatten().tolist()
    assert allowed, "digits must be allowed"
    assert all(re.fullmatch("[0-9]+", t) for t in texts(tok, allowed))
    digits = [i for i in range(tok.vocab_size) if re.fullmatch("[0-9]+", tok.decode([i], skip_special=False))]
    assert sorted(allowed) == digits  # every digit token, nothing else
    assert torch.equal(out[allowed], logits[allowed])  # allowed logits are untouched
    assert torch.isinf(out[tok.vocab_size:]).all()  # ids past the tokenizer's vocabulary
    assert not any(e in allowed for e in tok.eos_ids)  # nothing matched yet: no end


def test_end_token_allowed_only_once_the_text_is_complete(tok, compiler):
    c = compiler.constraint(constrained.from_regex("[0-9]+"))
    (digit,) = tok.encode("7")
    c.advance(digit)
    out = c.mask(torch.zeros(tok.vocab_size))
    assert all(out[e] == 0 for e in tok.eos_ids) and c.is_accepting() and not c.is_done()


def test_generation_follows_the_grammar_and_ends_without_another_step(tok, compiler):
    # the model wants "Paris is the capital"; the grammar allows only "yes" or "no"
    want = tok.encode(" Paris is the capital")
    model = ScriptedModel(want, tok.vocab_size)
    prompt = tok.encode("Hello")
    model.prompt_len = len(prompt)
    cache = StaticKVCache(1, 1, 1, 64, torch.device("cpu"), torch.float32)
    c = compiler.constraint(constrained.from_regex("yes|no"))
    chunks = list(generate(model, tok, prompt, Request(GREEDY), cache, constraint=c))
    text = "".join(ch.text for ch in chunks)
    assert text in ("yes", "no")
    last = chunks[-1]
    assert last.finish_reason == "stop"
    n = len(tok.encode(text))
    assert last.stats.completion_tokens == n  # the forced end is not a generated token
    assert len(model.calls) == n  # prefill + n-1 decode steps: no step for the end


def test_max_tokens_before_the_grammar_is_complete_gives_length(tok, compiler):
    model = ScriptedModel(tok.encode("12345678"), tok.vocab_size)
    prompt = tok.encode("Hello")
    model.prompt_len = len(prompt)
    cache = StaticKVCache(1, 1, 1, 64, torch.device("cpu"), torch.float32)
    c = compiler.constraint(constrained.from_json_schema(json.dumps(PERSON)))
    chunks = list(generate(model, tok, prompt, Request(GREEDY, max_tokens=3), cache, constraint=c))
    assert chunks[-1].finish_reason == "length" and not c.is_accepting()
    message = constrained.incomplete_message(constrained.from_json_schema(json.dumps(PERSON)), 3, 3)
    assert message == "the output was cut at 3 tokens before the JSON was complete; raise -n/--max-tokens"


def test_a_sentencepiece_vocabulary_is_read_with_its_spaces(spm_model, tmp_path):
    # our SentencePiece tokenizers are rebuilt as byte-fallback BPEs with "▁" for spaces: llguidance
    # must see "▁{" as " {" (not JSON's first byte) and "{\"" as a valid start
    import shutil

    shutil.copy(spm_model, tmp_path / "tokenizer.model")
    tok = from_hf_folder(tmp_path, {"eos_token_id": 2, "bos_token_id": 1})
    c = constrained.GrammarCompiler(tok).constraint(constrained.from_json_schema(json.dumps(PERSON)))
    out = c.mask(torch.zeros(tok.vocab_size))
    piece = tok.backend.token_to_id
    assert out[piece('{"')] == 0 and out[piece("▁{")] == float("-inf")
    for token in [piece(p) for p in ['{"', "name", '":', "▁\"", "Z", "o", "ë"]]:
        c.advance(token)
        c.mask(torch.zeros(tok.vocab_size))


def test_output_checks():
    g = constrained.from_json_schema(json.dumps(PERSON))
    g.check_output('{"name": "Al", "age": 3}')
    for bad in ('{"name": "Al"', '{"name": "Al", "age": -1}'):
        with pytest.raises(Exception, match="bug"):
            g.check_output(bad)
    constrained.from_regex(r"\d{3}").check_output("123")
    with pytest.raises(Exception, match="does not match"):
        constrained.from_regex(r"\d{3}").check_output("12")


# ---------------------------------------------------------------------------- logprobs


def test_token_logprobs_on_hand_built_logits():
    logits = torch.tensor([1.0, 3.0, 2.0, -1.0, 0.5])
    ref = logits.log_softmax(-1)
    chosen, top = token_logprobs(logits, 2, 3)
    assert chosen == pytest.approx(float(ref[2]))
    assert [i for i, _ in top] == [1, 2, 0]  # most likely first
    assert [lp for _, lp in top] == pytest.approx(ref[[1, 2, 0]].tolist())
    assert token_logprobs(logits, 3, 0) == (pytest.approx(float(ref[3])), [])


# ------------------------------------------------------------------------- bad input


def cli(capsys, *args, input: str | None = None, monkeypatch=None):
    """`llmcli ARGS` in this process: a subprocess would spend seconds importing torch again (each
    subprocess test took 8-20 s on the shared machine). `input` (with `monkeypatch`) is stdin."""
    import io

    from llmcli.cli import main

    if input is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(input))
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out, err = capsys.readouterr()
    return type("Result", (), {"returncode": e.value.code, "stdout": out, "stderr": err})


@pytest.mark.parametrize("content, needles", [
    ('{"type": "object",', ["is not valid JSON", "line 1"]),
    ('{"type": "foo"}', ["not a valid JSON Schema", "'foo' is not valid"]),
    ('{"type": "object", "if": {"required": ["a"]}, "then": {}}', ["cannot be used", "Unimplemented keys", "if"]),
    ('[1, 2]', ["must be an object"]),
])
def test_bad_schema_is_one_line_before_the_model_loads(capsys, tmp_path, content, needles):
    schema = tmp_path / "schema.json"
    schema.write_text(content)
    # the model path does not exist: the schema is checked first
    r = cli(capsys, "run", "/nonexistent/model.gguf", "hi", "--json-schema", str(schema))
    assert_one_line_error(r, str(schema), *needles, code=2)


@pytest.mark.parametrize("args, needles", [
    (["--regex", "(abc"], ["not a usable regex", "unclosed group"]),
    (["--regex", "a(?=b)"], ["look-around"]),
    (["--json-schema", "/nonexistent/schema.json"], ["does not exist"]),
    (["--regex", "[0-9]+", "--json-schema", "s.json"], ["exclude each other"]),
    (["--regex", "[0-9]+", "--stop", "x"], ["--stop does not combine"]),
    (["--logprobs", "3"], ["needs --json"]),
    (["--logprobs", "21", "--json"], ["0..20"]),
])
def test_bad_flags_are_one_line(capsys, args, needles):
    assert_one_line_error(cli(capsys, "run", "/nonexistent/model.gguf", "hi", *args), *needles, code=2)


def test_bad_input_in_a_subprocess_and_in_chat(tmp_path):  # one real process, to see its exit code
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "dependentSchemas": {"a": {}}}')
    assert_one_line_error(run_cli("chat", "/nonexistent/model.gguf", "--json-schema", str(schema)),
                          "Unimplemented keys", "dependentSchemas", code=2)


def test_bad_lark_grammar(capsys, tmp_path):
    g = tmp_path / "g.lark"
    g.write_text('start: greeting\n')
    assert_one_line_error(cli(capsys, "run", "/nonexistent/model.gguf", "hi", "--grammar", str(g)),
                          "not a usable Lark grammar", "unknown name", code=2)
    with pytest.raises(GrammarError):
        constrained.from_lark('start: "a" | /(/')
    with pytest.raises(InvalidParameterError):
        constrained.from_flags(regex="a", grammar=g)


# ------------------------------------------------------------------------ GBNF


def _accepts(compiler, tok, grammar, text: str) -> bool:
    """Whether the grammar takes `text` token by token and then allows the end token."""
    c = compiler.constraint(grammar)
    for token in tok.encode(text):
        if c.forbidden(tok.vocab_size)[token]:
            return False
        c.advance(token)
    return c.is_accepting()


@pytest.mark.parametrize("name, good, bad", [
    ("json.gbnf", '{"a": [1, 2.5e3, "x\\n", true, null], "b": {}}', '{"a": }'),
    ("arithmetic.gbnf", "1+2*(x-3)= 4\n", "1+=2\n"),
    ("list.gbnf", "- eggs\n- milk\n", "eggs\n"),
])
def test_llama_cpp_gbnf_grammars_are_read_as_llama_cpp_reads_them(tok, compiler, name, good, bad):
    text = (GRAMMARS / name).read_text()
    grammar = constrained.from_flags(grammar=GRAMMARS / name)
    assert grammar.kind == "grammar" and grammar.source == text and constrained.is_gbnf(text)
    assert _accepts(compiler, tok, grammar, good)
    assert not _accepts(compiler, tok, grammar, bad)


def test_gbnf_rules_stay_lexemes_only_where_greedy_matching_is_safe():
    """A rule whose text no other text of it begins is one lexeme (fast masks); one that can run on
    (arithmetic's `num ::= [0-9]+ ws`) is parsed by characters, as llama.cpp parses it."""
    from llmcli.decode.gbnf import gbnf_as_lark

    lark = gbnf_as_lark((GRAMMARS / "list.gbnf").read_text())
    assert "\nITEM: " in lark  # "- " [^\n...]+ "\n": it ends at its first newline
    lark = gbnf_as_lark((GRAMMARS / "json.gbnf").read_text())
    assert "string: STRING_HEAD ws" in lark and "\nSTRING_HEAD: " in lark  # the quoted string; then ws
    assert "\nws: " in lark  # ws ::= | " " | "\n" [ \t]{0,20}: by characters
    lark = gbnf_as_lark((GRAMMARS / "arithmetic.gbnf").read_text())
    assert not re.search(r"^[A-Z_]+:", lark, re.MULTILINE)  # every rule can run on: all by characters


def test_generation_with_a_gbnf_grammar(tok, compiler):
    # the model wants "Paris is the capital"; llama.cpp's list grammar makes it a list
    model = ScriptedModel(tok.encode(" Paris is the capital"), tok.vocab_size)
    prompt = tok.encode("Hello")
    model.prompt_len = len(prompt)
    cache = StaticKVCache(1, 1, 1, 64, torch.device("cpu"), torch.float32)
    c = compiler.constraint(constrained.from_flags(grammar=GRAMMARS / "list.gbnf"))
    chunks = list(generate(model, tok, prompt, Request(GREEDY, max_tokens=20), cache, constraint=c))
    text = "".join(ch.text for ch in chunks)
    assert re.fullmatch(r"(- [^\n]+\n)+", text + ("" if text.endswith("\n") else "\n")) or \
        chunks[-1].finish_reason == "length", text
    assert text.startswith("- ")


@pytest.mark.parametrize("gbnf, needle", [
    ('root ::= greeting\n', "Rule 'greeting' not found"),
    ('item ::= "a"\n', "No 'root' rule found"),
    ('root ::= "a\n', "Unexpected end of input"),
    ("root ::= root\n", "matches no text"),
])
def test_bad_gbnf_grammar_is_one_line(capsys, tmp_path, gbnf, needle):
    g = tmp_path / "g.gbnf"
    g.write_text(gbnf)
    assert_one_line_error(cli(capsys, "run", "/nonexistent/model.gguf", "hi", "--grammar", str(g)),
                          "g.gbnf is not a usable GBNF grammar", needle, code=2)


# ------------------------------------------------------------------------ the real model


@pytest.fixture(scope="module")
def smol(smollm2_loaded):
    rt = Runtime(smollm2_loaded, 512)
    return rt, constrained.GrammarCompiler(smollm2_loaded.tokenizer)


def _generate(rt, compiler, grammar, prompt, params=GREEDY, max_tokens=64, logprobs=None, keep=None):
    """(text, last chunk, prompt ids) of a constrained answer; `keep` gets the Generation."""
    ids = rt.prompt_ids([{"role": "user", "content": prompt}])
    request = Request(params, max_tokens, grammar=grammar, logprobs=logprobs)
    generation = generate(rt.loaded.model, rt.loaded.tokenizer, ids, request, rt.new_cache(),
                          constraint=compiler.constraint(grammar))
    chunks = list(generation)
    if keep is not None:
        keep.append(generation)
    return "".join(ch.text for ch in chunks), chunks[-1], ids


@pytest.mark.slow
def test_real_model_writes_valid_json(smol):
    rt, compiler = smol
    grammar = constrained.from_json_schema(json.dumps(PERSON))
    runs = [("Describe Alice, 30, as JSON.", GREEDY), ("Who is the oldest person you know? Answer in JSON.", GREEDY),
            ("Make up a person.", SamplingParams(temperature=0.8, seed=7))]
    for prompt, params in runs:
        text, last, _ = _generate(rt, compiler, grammar, prompt, params)
        assert last.finish_reason == "stop", (prompt, text)
        jsonschema.validate(json.loads(text), PERSON)
        grammar.check_output(text)


@pytest.mark.slow
def test_real_model_regex_output_fullmatches(smol):
    rt, compiler = smol
    pattern = r"(19|20)[0-9]{2}"
    text, last, _ = _generate(rt, compiler, constrained.from_regex(pattern), "In which year did World War II end?")
    assert re.fullmatch(pattern, text) and last.finish_reason == "stop"


@pytest.mark.slow
def test_real_model_follows_a_gbnf_grammar_through_the_cli(smollm2_gguf):
    r = run_cli("run", str(smollm2_gguf), "List three fruits.", "--grammar", str(GRAMMARS / "list.gbnf"),
                "--temp", "0", "-n", "40", "-t", "1")
    assert r.returncode in (0, 1), r.stderr
    if r.returncode == 0:  # complete: one list, as llama.cpp's grammar writes it
        assert re.fullmatch(r"(- [^\n]+\n)+", r.stdout[:-1]), r.stdout
    else:  # -n ended it first: nothing on stdout, one line saying so
        assert r.stdout == "" and "before the text of the grammar was complete" in r.stderr


@pytest.mark.slow
def test_real_model_logprobs_match_a_full_forward(smol):
    rt, compiler = smol
    kept = []
    text, last, prompt = _generate(rt, compiler, constrained.from_regex("[A-Z][a-z]+"), "Name a colour.",
                                   logprobs=5, keep=kept)
    record = kept[0].logprobs
    ids = prompt + [t for t, _, _ in record.entries]
    with torch.inference_mode():  # one forward over everything: logits at each generated position
        ref = rt.loaded.model(torch.tensor([ids]), rt.new_cache()).float()[0, len(prompt) - 1:-1].log_softmax(-1)
    for k, (token, logprob, top) in enumerate(record.entries):
        assert logprob == pytest.approx(float(ref[k, token]), abs=2e-3)
        assert len(top) == 5 and [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        assert [i for i, _ in top] == ref[k].topk(5).indices.tolist()
        assert top[0][1] == pytest.approx(float(ref[k].max()), abs=2e-3)
    assert last.stats.completion_tokens == len(record.entries)


@pytest.mark.slow
def test_cli_json_schema_with_logprobs(capsys, smollm2_gguf, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    r = cli(capsys, "run", str(smollm2_gguf), "Describe Bob, 41, as JSON.", "--json-schema", str(schema),
                "--temp", "0", "--json", "--logprobs", "2", "-v")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    jsonschema.validate(json.loads(out["text"]), PERSON)
    assert out["finish_reason"] == "stop" and len(out["logprobs"]) == out["usage"]["completion_tokens"]
    first = out["logprobs"][0]
    assert first["token"].startswith("{") and len(first["top"]) == 2 and set(first) == {"token", "id", "logprob", "top"}
    assert "constraint (json_schema): mask + advance" in r.stderr


def test_cli_cut_by_max_tokens_is_an_error(capsys, tiny_gguf, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    # nothing on stdout (it would not parse), one error line, a non-zero exit
    r = cli(capsys, "run", str(tiny_gguf), "Describe Bob", "--json-schema", str(schema), "-n", "4")
    assert_one_line_error(r, "cut at 4 tokens before the JSON was complete", "raise -n", code=1)
    # --json keeps the partial text and says why it ended
    r = cli(capsys, "run", str(tiny_gguf), "Describe Bob", "--json-schema", str(schema), "-n", "4", "--json")
    assert r.returncode == 1 and "cut at 4 tokens" in r.stderr
    out = json.loads(r.stdout)
    assert out["finish_reason"] == "length" and out["text"].startswith('{"n')


@pytest.mark.slow
def test_chat_every_reply_follows_the_schema(capsys, monkeypatch, smollm2_gguf, tiny_gguf, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    r = cli(capsys, "chat", str(smollm2_gguf), "--json-schema", str(schema), "--temp", "0", "-n", "40",
            input="Describe Alice, 30.\nNow her brother Tom, 35.\n", monkeypatch=monkeypatch)
    assert r.returncode == 0, r.stderr
    replies = r.stdout.strip().splitlines()
    assert len(replies) == 2
    for reply in replies:
        jsonschema.validate(json.loads(reply), PERSON)
    r = cli(capsys, "chat", str(tiny_gguf), "--json-schema", str(schema), "-n", "3", input="Describe Alice.\n",
            monkeypatch=monkeypatch)
    assert r.returncode == 1 and "error: the output was cut at 3 tokens before the JSON was complete" in r.stderr


def test_chat_refuses_stop_texts_with_a_grammar_before_adding_the_message(tok):
    from llmcli.chat.conversation import Conversation
    from llmcli.chat.session import ChatSession

    rt = type("Rt", (), {"new_cache": lambda self: None, "ctx_size": 64})()
    session = ChatSession(rt, Conversation(stop=("}",)), request=Request(grammar=constrained.from_regex("[0-9]+")))
    with pytest.raises(InvalidParameterError, match="stop texts do not combine"):
        session.add_user("hi")
    assert session.conv.messages == []
