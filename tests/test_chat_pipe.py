"""`llmcli chat` when stdin is not a terminal: messages in, replies out, nothing else on stdout."""

from __future__ import annotations

import io
import json

from conftest import run_cli

from llmcli.chat.conversation import Conversation
from llmcli.chat.session import ChatSession
from llmcli.cli import repl as chat
from llmcli.decode.sampling import SamplingParams
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model
from llmcli.runtime.runtime import DEFAULT_MODEL, Runtime


def test_piped_messages_get_only_replies(tiny_gguf, tmp_path):
    r = run_cli("chat", str(tiny_gguf), "--temp", "0", "-n", "6", "--stop", "\n",
                input="What is the capital of France?\n\nAnd of Germany?\n/save chat.json\n", cwd=tmp_path,
                env={"LLMCLI_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 2  # one line per reply (--stop "\n"), nothing else
    saved = json.loads((tmp_path / "chat.json").read_text())["messages"]
    assert [m["content"] for m in saved if m["role"] == "user"] == ["What is the capital of France?", "And of Germany?"]
    assert r.stdout == "".join(m["content"] + "\n" for m in saved if m["role"] == "assistant")
    assert r.stderr == "saved 4 messages to chat.json\n"  # command output goes to stderr: no banner, no stats
    assert not (tmp_path / "home").exists()  # no history file when nobody types


def test_single_reads_all_of_stdin_as_one_message(tiny_gguf, monkeypatch, capsys):
    session = ChatSession(Runtime(load_model(tiny_gguf, place("cpu", "float32")), 256),
                          Conversation(params=SamplingParams(temperature=0), max_tokens=3))
    monkeypatch.setattr("sys.stdin", io.StringIO("first line\nsecond line\n/bye\n"))
    assert chat.run(session, single=True) == 0
    assert session.conv.messages[0] == {"role": "user", "content": "first line\nsecond line\n/bye\n"}
    out, err = capsys.readouterr()
    assert out == session.conv.messages[1]["content"] + "\n" and err == ""


def test_context_overflow_drops_old_turns_with_a_notice(tiny_gguf):
    questions = "".join(f"The quick brown fox number {i} jumps.\n" for i in range(6))
    r = run_cli("chat", str(tiny_gguf), "--temp", "0", "-n", "8", "--ctx-size", "80", "--stop", "\n", input=questions)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 6  # every message got its reply
    assert 'dropped the oldest' in r.stderr and 'from "The quick brown fox number 0 jumps."' in r.stderr


def test_bad_input_is_one_line_and_the_chat_goes_on(tiny_gguf, tmp_path):
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01")
    lines = ["/set parameter bogus 1", "/read blob.bin", "/load nothing.json", "/save no/dir/c.json",
             "/frobnicate", "Hello", "word " * 300]
    r = run_cli("chat", str(tiny_gguf), "--temp", "0", "-n", "3", "--stop", "\n", "--ctx-size", "128",
                input="\n".join(lines) + "\n", cwd=tmp_path)
    assert r.returncode == 1  # something was refused
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 6 and all(e.startswith("error: ") for e in errors), r.stderr
    assert "unknown parameter" in errors[0] and "binary" in errors[1] and "does not exist" in errors[2]
    assert "create it first" in errors[3] and "unknown command /frobnicate" in errors[4]
    assert "this message is" in errors[5] and "--ctx-size" in errors[5]
    assert r.stdout.count("\n") == 1  # the reply to "Hello"
    assert "Traceback" not in r.stderr


def test_load_from_another_model_needs_a_terminal(tiny_gguf, tmp_path):
    saved = {"format": "llmcli-conversation", "version": 1, "model": {"name": "SmolLM2"},
             "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / "c.json").write_text(json.dumps(saved))
    r = run_cli("chat", str(tiny_gguf), "--load", str(tmp_path / "c.json"), input="Hello\n")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("error: the conversation was saved with the model 'SmolLM2', not 'tiny-test'")
    (tmp_path / "bad.json").write_text("[]")
    r = run_cli("chat", str(tiny_gguf), "--load", str(tmp_path / "bad.json"), input="Hello\n")
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "not an llmcli conversation" in r.stderr


def test_load_keeps_saved_parameters_unless_given(tiny_gguf, tmp_path):
    saved = {"format": "llmcli-conversation", "version": 1, "model": {"name": "tiny-test"}, "system": "Be terse.",
             "parameters": {"temperature": 0, "top_k": 5, "max_tokens": 2},
             "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / "c.json").write_text(json.dumps(saved))
    r = run_cli("chat", str(tiny_gguf), "--load", "c.json", "--top-k", "9", input="/show parameters\n/show system\n",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "temp 0.0 · top-k 9 · " in r.stderr and "max-tokens 2" in r.stderr and "Be terse." in r.stderr


def test_help_names_the_default_model():
    r = run_cli("chat", "--help")
    assert r.returncode == 0 and DEFAULT_MODEL in r.stdout and "--load" in r.stdout and "--system" in r.stdout


def test_bad_flags_are_one_line(tiny_gguf):
    r = run_cli("chat", str(tiny_gguf), "--temp", "-1", input="hi\n")
    assert r.returncode == 2 and r.stderr.startswith("error: --temp") and len(r.stderr.splitlines()) == 1
    r = run_cli("chat", str(tiny_gguf), "-n", "0", input="hi\n")
    assert r.returncode == 2 and "--max-tokens" in r.stderr
