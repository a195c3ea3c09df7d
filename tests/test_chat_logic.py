"""The chat without a terminal: messages from lines, context fitting, conversation files, slash
commands, interrupted replies, and the KV cache reused across turns (with the real model)."""

from __future__ import annotations

import json

import pytest
from tiny import hf_model, write_gguf

from llmcli.chat.commands import NAMES, CommandError, MessageAssembler, run_command, take
from llmcli.chat.conversation import Conversation, ConversationFileError, fit, load, reply_room, save
from llmcli.chat.session import ChatSession
from llmcli.cli.repl import dropped_notice
from llmcli.decode.generate import generate
from llmcli.decode.request import Request
from llmcli.decode.sampling import SamplingParams
from llmcli.errors import InvalidParameterError, PromptTooLongError
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model
from llmcli.runtime.runtime import Runtime

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def tiny_loaded(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(hf_model("llama"), path, "Q8_0")
    return load_model(path, place("cpu", "float32"))


def new_session(loaded, ctx=256, max_tokens=4, **conv) -> ChatSession:
    return ChatSession(Runtime(loaded, ctx), Conversation(params=GREEDY, max_tokens=max_tokens, **conv))


def say(session: ChatSession, text: str) -> str:
    session.add_user(text)
    return "".join(session.reply())


# ------------------------------------------------------------------------- lines -> messages

def test_lines_become_messages():
    a = MessageAssembler()
    assert take(a, "hello there") == ("message", "hello there")
    assert take(a, "   ") is None
    assert take(a, "  /show  ") == ("command", "/show")
    assert take(a, "line one\nline two") == ("message", "line one\nline two")  # a bracketed paste
    assert take(a, "/read x\nmore") == ("message", "/read x\nmore")  # pasted text is never a command


def test_triple_quotes_open_and_close_a_message():
    a = MessageAssembler()
    assert take(a, '"""') is None and a.open
    assert take(a, "first line") is None
    assert take(a, "/bye") is None  # inside a message a slash is just text
    assert take(a, "") is None
    assert take(a, 'last line"""') == ("message", "first line\n/bye\n\nlast line")
    assert not a.open
    assert take(a, '"""Starts here') is None
    assert take(a, 'ends here"""') == ("message", "Starts here\nends here")
    assert take(a, '"""one line"""') == ("message", "one line")
    take(a, '"""')
    a.reset()
    assert not a.open and take(a, "after") == ("message", "after")


# -------------------------------------------------------------------------------- context

def words(messages):
    """A fake tokenizer: one token per word plus two per message."""
    return [0] * sum(len(m["content"].split()) + 2 for m in messages)


def conversation_of(turns: int, system="be brief", max_tokens=10) -> Conversation:
    conv = Conversation(system=system, max_tokens=max_tokens)
    for i in range(turns):
        conv.messages += [{"role": "user", "content": f"question {i} " + "w " * 8},
                          {"role": "assistant", "content": f"answer {i} " + "w " * 8}]
    conv.messages.append({"role": "user", "content": "the newest question"})
    return conv


def test_a_conversation_that_fits_is_left_alone():
    conv = conversation_of(2)
    fitted = fit(conv, words, 200)
    assert fitted.dropped == [] and conv.start == 0 and len(fitted.ids) == len(words(conv.window()))


def test_overflow_drops_the_oldest_turns_and_keeps_the_system_prompt():
    conv = conversation_of(6)  # 6 turns of 24 tokens + system 4 + newest 5 = 153 tokens
    ctx = 100
    fitted = fit(conv, words, ctx)
    limit = ctx - reply_room(ctx, conv.max_tokens)
    assert len(fitted.ids) <= limit - ctx // 4  # freed a quarter more, so the next turns reuse the cache
    assert fitted.dropped == conv.messages[: conv.start]
    assert fitted.dropped[0]["content"].startswith("question 0") and len(fitted.dropped) % 2 == 0
    window = conv.window()
    assert window[0] == {"role": "system", "content": "be brief"}
    assert window[1]["role"] == "user" and window[-1]["content"] == "the newest question"
    assert "dropped the oldest" in dropped_notice(fitted.dropped, ctx)
    again = fit(conv, words, ctx)  # now it fits: nothing more goes
    assert again.dropped == []


def test_a_message_too_long_for_the_context_is_refused():
    conv = Conversation(system="be brief", max_tokens=10)
    conv.messages.append({"role": "user", "content": "word " * 200})
    with pytest.raises(PromptTooLongError, match="--ctx-size"):
        fit(conv, words, 100)


def test_refused_message_is_not_added(tiny_loaded):
    s = new_session(tiny_loaded, ctx=64)
    say(s, "Hello")
    before = list(s.conv.messages)
    with pytest.raises(PromptTooLongError, match="shorten it"):
        s.add_user("The quick brown fox jumps over the lazy dog. " * 20)
    assert s.conv.messages == before
    assert say(s, "Hello") is not None  # the session goes on


def test_overflow_in_a_real_session_goes_on(tiny_loaded):
    s = new_session(tiny_loaded, ctx=96, max_tokens=8)
    dropped = []
    for i in range(8):
        dropped += s.add_user(f"The quick brown fox number {i}.")
        assert "".join(s.reply()) is not None
        assert s.last.context_used <= 96
    assert dropped and dropped[0]["content"] == "The quick brown fox number 0."
    assert len(s.conv.messages) == 16  # everything is kept for /save
    assert s.conv.start > 0


# ----------------------------------------------------------------------- conversation files

def sample_conversation() -> Conversation:
    return Conversation(system="You are terse.", params=SamplingParams(temperature=0.3, top_k=7, seed=5),
                        max_tokens=99, stop=("END",), model={"name": "m"},
                        messages=[{"role": "user", "content": "héllo\nthere"},
                                  {"role": "assistant", "content": "par", "interrupted": True}])


def test_save_then_load_is_the_same_conversation(tmp_path):
    conv = sample_conversation()
    path = save(conv, tmp_path / "c.json")
    back = load(path)
    assert (back.system, back.params, back.max_tokens, back.stop, back.messages, back.model) == \
           (conv.system, conv.params, conv.max_tokens, conv.stop, conv.messages, conv.model)
    assert json.loads(path.read_text())["format"] == "llmcli-conversation"


def test_save_is_atomic_and_replaces(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("old")
    save(sample_conversation(), path)
    assert load(path).system == "You are terse."
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]  # no temp file left behind


def test_save_to_a_missing_folder_or_a_folder(tmp_path):
    with pytest.raises(ConversationFileError, match="does not exist; create it"):
        save(sample_conversation(), tmp_path / "nope" / "c.json")
    with pytest.raises(ConversationFileError, match="is a folder"):
        save(sample_conversation(), tmp_path)


@pytest.mark.parametrize("content,needle", [
    (None, "does not exist"),
    ("{not json", "not valid JSON"),
    ('{"messages": []}', "not an llmcli conversation"),
    ('{"format": "llmcli-conversation", "version": 1, "messages": [{"role": "robot", "content": "x"}]}', "messages"),
    ('{"format": "llmcli-conversation", "version": 1, "messages": [], "parameters": {"temperature": -1}}', "--temp"),
    ('{"format": "llmcli-conversation", "version": 1, "messages": [], "parameters": {"bogus": 1}}', "bogus"),
    ('{"format": "llmcli-conversation", "version": 7, "messages": []}', "version"),
    (b"\x00\xff\xfe binary", "is a binary file"),
])
def test_load_bad_files(tmp_path, content, needle):
    path = tmp_path / "c.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConversationFileError, match=needle):
        load(path)


# ---------------------------------------------------------------------------- slash commands

def test_set_parameter(tiny_loaded):
    s = new_session(tiny_loaded)
    assert run_command(s, "/set parameter temperature 0.5").say == "temp 0.5"
    run_command(s, "/set parameter top_k 7")
    run_command(s, "/set parameter max-tokens 12")
    run_command(s, "/set parameter stop END '<x y>'")
    assert (s.conv.params.temperature, s.conv.params.top_k, s.conv.max_tokens, s.conv.stop) == (0.5, 7, 12, ("END", "<x y>"))
    run_command(s, "/set parameter max-tokens -1")
    assert s.conv.max_tokens is None
    for line, needle in [("/set parameter bogus 1", "unknown parameter 'bogus'; known: temp"),
                         ("/set parameter top-k many", "whole number"), ("/set parameter top-p 2", "--top-p"),
                         ("/set parameter max-tokens 0", "max-tokens"), ("/set parameter temp", "usage"),
                         ("/set parameter ctx-size 8", "restart with --ctx-size"), ("/set", "usage"),
                         ("/set system", "needs the text")]:
        with pytest.raises((CommandError, InvalidParameterError), match=needle):
            run_command(s, line)
    assert s.conv.params.temperature == 0.5  # a refused value changes nothing


def test_show_clear_system_stats_help(tiny_loaded):
    s = new_session(tiny_loaded)
    assert run_command(s, "/stats").say == "no reply yet"
    run_command(s, "/set system Be terse.")
    say(s, "Hello")
    shown = run_command(s, "/show").say
    assert "tiny-test" in shown and "temp 0 ·" in shown and "Be terse." in shown and "of 256 tokens" in shown
    assert "<|im_start|>" in run_command(s, "/show template").say
    with pytest.raises(CommandError, match="info, parameters"):
        run_command(s, "/show everything")
    assert "reused from the cache" in run_command(s, "/stats").say
    assert "forgot the conversation (2 messages); the system prompt stays" == run_command(s, "/clear").say
    assert s.conv.messages == [] and s.conv.system == "Be terse."
    help_text = run_command(s, "/?").say
    assert all(name in help_text for name in NAMES) and run_command(s, "/help").say == help_text
    assert run_command(s, "/bye").exit and run_command(s, "/exit").exit


def test_unknown_command_lists_the_real_ones(tiny_loaded):
    with pytest.raises(CommandError) as e:
        run_command(new_session(tiny_loaded), "/quit")
    assert "unknown command /quit" in str(e.value) and all(n in str(e.value) for n in NAMES)


def test_regen_replaces_the_last_reply(tiny_loaded):
    s = new_session(tiny_loaded)
    with pytest.raises(CommandError, match="no reply"):
        run_command(s, "/regen")
    first = say(s, "Hello")
    assert run_command(s, "/regen").regen
    s.take_back_reply()
    assert "".join(s.reply()) == first  # greedy: the same again
    assert [m["role"] for m in s.conv.messages] == ["user", "assistant"]


def test_read(tiny_loaded, tmp_path):
    s = new_session(tiny_loaded)
    (tmp_path / "notes.txt").write_text("Paris is the capital of France.\n")
    (tmp_path / "blob.bin").write_bytes(b"\x89PNG\x00\x01\x02")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("  \n")
    out = run_command(s, f"/read {tmp_path / 'notes.txt'}")
    assert out.send == "Paris is the capital of France.\n"
    for name, needle in [("missing.txt", "does not exist"), ("blob.bin", "binary"), ("latin1.txt", "not UTF-8"),
                         ("empty.txt", "empty"), ("", "not a file")]:
        with pytest.raises(CommandError, match=needle):
            run_command(s, f"/read {tmp_path / name}")
    with pytest.raises(CommandError, match="needs a file name"):
        run_command(s, "/read")


def test_save_and_load_commands(tiny_loaded, tmp_path):
    s = new_session(tiny_loaded, system="Be terse.")
    say(s, "Hello")
    run_command(s, "/set parameter top-k 3")
    assert "saved 2 messages" in run_command(s, f"/save {tmp_path / 'c.json'}").say
    with pytest.raises(ConversationFileError, match="does not exist"):
        run_command(s, f"/save {tmp_path / 'no' / 'c.json'}")
    saved = (s.conv.messages, s.conv.system, s.conv.params)
    run_command(s, "/clear")
    run_command(s, "/set system Other.")
    assert run_command(s, f"/load {tmp_path / 'c.json'}").say.startswith("loaded 2 messages")
    assert (s.conv.messages, s.conv.system, s.conv.params) == saved
    with pytest.raises(ConversationFileError, match="does not exist"):
        run_command(s, f"/load {tmp_path / 'missing.json'}")


def test_load_from_another_model_asks_first(tiny_loaded, tmp_path):
    s = new_session(tiny_loaded)
    other = sample_conversation()
    other.model = {"name": "SmolLM2"}
    save(other, tmp_path / "other.json")
    out = run_command(s, f"/load {tmp_path / 'other.json'}")
    assert "saved with the model 'SmolLM2', not 'tiny-test'" in out.confirm
    assert s.conv.messages == []  # nothing changes before the answer
    out.then()
    assert s.conv.messages == other.messages


# --------------------------------------------------------------------- interrupts and the cache

def fresh_reply(session: ChatSession, max_tokens: int) -> list[int]:
    """Greedy tokens of a cold run over the whole conversation, with a new cache."""
    loaded = session.rt.loaded
    ids = session.rt.prompt_ids(session.conv.window())
    chunks = generate(loaded.model, loaded.tokenizer, ids, Request(GREEDY, max_tokens=max_tokens),
                      session.rt.new_cache())
    return loaded.tokenizer.decode([t for c in chunks for t in c.tokens])


def test_an_interrupted_reply_is_kept_and_the_next_turn_is_right(tiny_loaded):
    s = new_session(tiny_loaded, max_tokens=40)
    s.add_user("Tell me a long story")
    stream = s.reply()
    partial = next(stream) + next(stream)
    stream.close()  # what Ctrl-C does between two tokens
    assert s.conv.messages[-1] == {"role": "assistant", "content": partial, "interrupted": True}
    assert s.last.finish == "interrupted" and s.last.tokens >= 2
    s.conv.max_tokens = 6
    s.add_user("Go on")
    expected = fresh_reply(s, 6)
    s.conv.messages.pop()
    s.add_user("Go on")
    assert "".join(s.reply()) == expected
    assert s.last.stats.cached_tokens > 0


@pytest.mark.slow
def test_second_turn_prefills_only_new_tokens_and_matches_a_fresh_run(smollm2_loaded):
    s = ChatSession(Runtime(smollm2_loaded, 1024), Conversation(params=GREEDY, max_tokens=24))
    say(s, "What is the capital of France?")
    first = s.last.stats
    assert first.cached_tokens == 0
    s.add_user("And of Germany?")
    new_part = len(s._prompt) - (first.prompt_tokens + first.completion_tokens - 1)
    expected = fresh_reply(s, 24)
    reply = "".join(s.reply())
    second = s.last.stats
    # the cache held the first prompt and every reply token but the last (<|im_end|>, never fed back)
    assert second.cached_tokens == first.prompt_tokens + first.completion_tokens - 1
    assert second.prefilled_tokens == new_part < 20
    assert reply == expected and "Berlin" in reply
