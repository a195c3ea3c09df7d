"""`llmcli chat` driven in a real pseudo-terminal (pexpect), as a person would use it."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

import pytest
from conftest import REPO

pexpect = pytest.importorskip("pexpect")

PROMPT = ">>>"
END_OF_INPUT = "\x1b[?2004l"  # prompt_toolkit turns bracketed paste off when a line is accepted
STATS = r"tokens/s · context \d+/\d+"
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"


def spawn(tmp_path, *args: str, timeout: float = 120, redirect: str = "", compile: bool = False):
    """`llmcli chat ARGS` in a fresh pty, inside `sh` so the terminal mode can be read before and
    after (stty -g into tmp_path/before and /after). Eager decoding unless `compile` (compiling
    takes tens of seconds of CPU per fresh llmcli home)."""
    args = args if compile else (*args, "--no-compile")
    env = {**os.environ, "PYTHONPATH": str(REPO), "LLMCLI_HOME": str(tmp_path / "home"), "TERM": "xterm",
           "PROMPT_TOOLKIT_NO_CPR": "1", "NO_COLOR": "1"}
    chat = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "llmcli", "chat", *args])
    # the trap keeps sh alive through Ctrl-C (the pty sends SIGINT to sh as well); llmcli still gets it
    script = f"trap true INT; stty -g > {tmp_path}/before; {chat} {redirect}; code=$?; stty -g > {tmp_path}/after; exit $code"
    child = pexpect.spawn("sh", ["-c", script], env=env, encoding="utf-8", timeout=timeout, dimensions=(40, 200),
                          cwd=str(tmp_path))
    child.expect(PROMPT)
    return child


def send(child, line: str, *expected: str, prompt: bool = True):
    """Type a line, wait until it is accepted, then for each expected pattern in order; returns the
    match of the last one."""
    child.send(line + "\r")
    child.expect_exact(END_OF_INPUT)
    match = None
    for pattern in expected:
        child.expect(pattern)
        match = child.match
    if prompt:
        child.expect(PROMPT)
    return match


def leave(child, tmp_path, keys: str = "/bye\r"):
    child.send(keys)
    child.expect(pexpect.EOF)
    child.close()
    assert (child.exitstatus, child.signalstatus) == (0, None)
    assert (tmp_path / "after").read_text() == (tmp_path / "before").read_text()  # the terminal mode is restored


@pytest.mark.slow
def test_conversation_with_the_real_model(tmp_path, smollm2_gguf):
    child = spawn(tmp_path, str(smollm2_gguf), "--temp", "0", "-n", "24", "--dtype", "float32", "--quant", "f32")
    assert "context 8192" in child.before
    send(child, "What is the capital of France?", "Paris", STATS)
    send(child, "And of Germany?", "Berlin", STATS)
    stats = send(child, "/stats", r"prompt \d+ tokens, (\d+) reused from the cache, (\d+) prefilled")
    reused, prefilled = map(int, stats.groups())
    assert reused > 30 and prefilled < 20  # the second turn only read its new tokens

    # Ctrl-C in the middle of a long reply stops it, keeps it, and the session goes on
    send(child, "/set parameter max-tokens 400", "max-tokens 400")
    send(child, "Write a very long story about a dragon and a knight.", r"\w+ \w+ \w+", prompt=False)
    sent = time.perf_counter()
    child.sendcontrol("c")
    child.expect(r"interrupted after (\d+) tokens")
    assert time.perf_counter() - sent < 10 and int(child.match.group(1)) < 200
    child.expect(PROMPT)
    send(child, "/save chat.json", "saved 6 messages")
    saved = json.loads((tmp_path / "chat.json").read_text())["messages"]
    assert saved[-1]["interrupted"] is True and saved[-1]["content"].strip()
    send(child, "What is the capital of France?", "Paris", STATS)
    leave(child, tmp_path)


def test_commands_paste_and_bad_input(tmp_path, tiny_gguf):
    (tmp_path / "notes.txt").write_text("Some notes\nin two lines\n")
    (tmp_path / "blob.bin").write_bytes(b"\x7fELF\x00\x00\x01")
    (tmp_path / "broken.json").write_text("{oops")
    other = {"format": "llmcli-conversation", "version": 1, "model": {"name": "SmolLM2"},
             "messages": [{"role": "user", "content": "from another model"}, {"role": "assistant", "content": "ok"}]}
    (tmp_path / "other.json").write_text(json.dumps(other))
    child = spawn(tmp_path, str(tiny_gguf), "--temp", "0", "-n", "4", "--system", "Be brief.", timeout=60)
    send(child, "/?", "Commands:", "/regen")
    send(child, "/show", "tiny-test", "temp 0", "Be brief.")

    # a bracketed paste of several lines arrives as one message; so does a \"\"\" block
    child.send(f"{PASTE_START}first line\nsecond line{PASTE_END}\r")
    child.expect(STATS)
    child.expect(PROMPT)
    child.send('"""\r')
    child.expect(r"\.\.\.")
    child.send("alpha\r")
    child.expect(r"\.\.\.")
    send(child, 'beta"""', STATS)
    send(child, f"/read {tmp_path / 'notes.txt'}", "sending", STATS)
    send(child, "/regen", STATS)
    send(child, "/save chat.json", "saved 6 messages")
    saved = json.loads((tmp_path / "chat.json").read_text())
    assert [m["content"] for m in saved["messages"] if m["role"] == "user"] == \
           ["first line\nsecond line", "alpha\nbeta", "Some notes\nin two lines\n"]
    assert saved["system"] == "Be brief." and saved["parameters"]["max_tokens"] == 4

    # /clear then /load restores the same conversation
    send(child, "/clear", r"forgot the conversation \(6 messages\); the system prompt stays")
    send(child, "/load chat.json", "loaded 6 messages")
    send(child, "/save again.json", "saved 6 messages")
    assert json.loads((tmp_path / "again.json").read_text())["messages"] == saved["messages"]

    # bad input: one line saying what to do, and the session goes on
    for line, answer in [
        ("/set parameter bogus 1", "error: unknown parameter 'bogus'; known: temp"),
        ("/set parameter temp hot", "error: temp needs a number"),
        ("/set parameter top-p 7", r"error: --top-p must be in \(0, 1\]"),
        ("/load missing.json", "error: .*missing.json does not exist"),
        ("/load broken.json", "error: .*broken.json is not valid JSON"),
        (f"/read {tmp_path / 'nothing.txt'}", "error: .*nothing.txt does not exist"),
        (f"/read {tmp_path / 'blob.bin'}", "error: .*blob.bin is a binary file"),
        ("/save no/such/folder/c.json", "error: cannot save to .* does not exist; create it first"),
        ("/quit", r"error: unknown command /quit; the commands are /\?, /help, /bye"),
    ]:
        send(child, line, answer)
    # a conversation from another model is loaded only when confirmed
    send(child, "/load other.json", r"saved with the model 'SmolLM2', not 'tiny-test'; load it anyway\? \[y/N\]",
         prompt=False)
    send(child, "n", "not loaded")
    send(child, "/load other.json", r"\[y/N\]", prompt=False)
    send(child, "y", "loaded 2 messages")
    send(child, "/show", "2 messages")

    # Ctrl-C clears a typed line; at an empty prompt it says how to leave
    child.send("half a message")
    child.sendcontrol("c")
    send(child, "/stats", "last reply")  # not "half a message/stats"
    child.sendcontrol("c")
    child.expect("Use Ctrl-D or /bye to leave.")
    child.expect(PROMPT)
    leave(child, tmp_path, keys="\x04")  # Ctrl-D


def test_history_persists_and_ctrl_r_finds_it(tmp_path, tiny_gguf):
    """Also: --render (Markdown through rich.live) leaves the terminal as it found it."""
    child = spawn(tmp_path, str(tiny_gguf), "--temp", "0", "-n", "2", timeout=60)
    send(child, "remember this line", STATS)
    leave(child, tmp_path)
    assert "remember this line" in (tmp_path / "home" / "chat_history").read_text()

    child = spawn(tmp_path, str(tiny_gguf), "--temp", "0", "-n", "2", "--render", timeout=60)
    child.send("\x12")  # Ctrl-R: reverse search through the history
    child.send("remember")
    child.expect(r"remember.*this line")
    send(child, "", STATS)  # Enter accepts the found line and sends it
    send(child, "/save c.json", "saved")
    assert json.loads((tmp_path / "c.json").read_text())["messages"][0]["content"] == "remember this line"
    child.send("\x1b[A")  # Up: the previous line
    child.expect("/save c.json")
    child.sendcontrol("c")
    leave(child, tmp_path, keys="/exit\r")


def test_stdout_redirected_gets_only_replies(tmp_path, tiny_gguf):
    child = spawn(tmp_path, str(tiny_gguf), "--temp", "0", "-n", "3", "--stop", "\n", timeout=60,
                  redirect="> replies.txt")
    send(child, "Hello", STATS)  # the stats line still reaches the terminal, on stderr
    send(child, "/show", "tiny-test")
    leave(child, tmp_path)
    replies = (tmp_path / "replies.txt").read_text()
    assert replies.count("\n") == 1 and ">>>" not in replies and "tiny-test" not in replies


@pytest.mark.slow
def test_background_compile_takes_over_while_chatting(tmp_path, tiny_gguf):
    """At a terminal the decode step compiles in the background: replies come at once (eagerly),
    and once compiled the session says so and keeps answering."""
    import time

    # bfloat16: in float32 a GGUF model decodes through the C++ step, with nothing to compile
    child = spawn(tmp_path, str(tiny_gguf), "--temp", "0", "-n", "4", "--dtype", "bfloat16", timeout=240, compile=True)
    send(child, "Hello", "\\n")  # answered before compiling can have finished
    deadline = time.time() + 200
    while True:
        mode = send(child, "/show info", "decode +(\\S[^\\r\\n]*)").group(1)
        if mode.startswith("compiled") or time.time() > deadline or "failed" in mode:
            break
        time.sleep(1)
    assert mode.startswith("compiled"), mode
    send(child, "Hello again", "\\n")
    leave(child, tmp_path)


def test_a_gguf_model_decodes_natively_from_the_first_reply(tmp_path, tiny_gguf):
    """Default flags, whatever the CPU computes in by default: a Llama-family GGUF chats through the
    C++ step (auto picks float32 for it), not a compiled or eager one."""
    from llmcli import native

    if not native.int8_dot():  # test_cpu_kinds.py: its Q8_0 loads for torch's int8 kernel, decoded eagerly
        pytest.skip("no C++ compiler for the kernels, or only the portable ones")
    child = spawn(tmp_path, str(tiny_gguf), "--temp", "0", "-n", "4", compile=True)
    assert send(child, "/show info", "decode +(\\S[^\\r\\n]*)").group(1).startswith("native")
    send(child, "Hello", "\\n")
    leave(child, tmp_path)
