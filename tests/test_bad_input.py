"""Bad input found by a sweep (issue 11): each ends in one `error:` line, a non-zero exit (130/143
for signals), no traceback and no hang. Library checks are tested directly (fast); each kind of
input also goes through the CLI at least once."""

from __future__ import annotations

import json
import math
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from tiny import hf_model, write_gguf

from llmcli.errors import CorruptModelError, InvalidParameterError, LlmcliError, UnsupportedModelError
from llmcli.formats import chat_template
from llmcli.formats.open import check_model_path
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model

CPU = place("cpu", "float32", threads=1)
BIG_SEED = str(2 ** 64)


def cli(*args, input: bytes = b"", timeout: float = 120, cwd=None) -> subprocess.CompletedProcess:
    """Like run_cli, but argv and stdin may be bytes that are not UTF-8."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "llmcli", *args], input=input, capture_output=True,
                          env=env, timeout=timeout, cwd=cwd)


def error_line(r, code: int | None = None, *needles: str) -> str:
    """The one `error:` line at the end of stderr; no traceback; the exit code."""
    err = r.stderr.decode("utf-8", "replace") if isinstance(r.stderr, bytes) else r.stderr
    assert "Traceback" not in err, err
    assert r.returncode != 0 if code is None else r.returncode == code, (r.returncode, err)
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), err
    assert sum(line.startswith("error:") for line in lines) == 1, err
    for needle in needles:
        assert needle in lines[-1], lines[-1]
    return lines[-1]


# ------------------------------------------------------------------------------------ seeds

def test_seed_range_is_checked_in_one_place():
    from llmcli.chat.conversation import Conversation, ConversationFileError
    from llmcli.decode.sampling import SamplingParams, parse_parameter

    for ok in (-1, 0, 2 ** 64 - 1):
        assert SamplingParams(seed=ok).seed == ok
    for bad in (2 ** 64, -2, 10 ** 30):
        with pytest.raises(InvalidParameterError, match="--seed must be"):
            SamplingParams(seed=bad)
    with pytest.raises(InvalidParameterError, match="--seed must be"):  # chat's /set parameter seed
        parse_parameter(SamplingParams(), "seed", BIG_SEED)
    data = {"format": "llmcli-conversation", "version": 1, "messages": [], "parameters": {"seed": 2 ** 64}}
    with pytest.raises(ConversationFileError, match="seed"):  # a --load'ed transcript
        Conversation.from_dict(data)


def test_seed_too_big_through_the_cli(tiny_gguf, tmp_path):
    error_line(run_cli("run", str(tiny_gguf), "hi", "--seed", BIG_SEED), 2, "--seed must be")
    saved = tmp_path / "chat.json"
    saved.write_text(json.dumps({"format": "llmcli-conversation", "version": 1, "messages": [],
                                 "parameters": {"seed": 2 ** 64}}))
    error_line(run_cli("chat", str(tiny_gguf), "--load", str(saved)), None, "seed")
    # piped chat: the bad /set and the non-UTF-8 line are refused, the session goes on, exit 1
    r = cli("chat", str(tiny_gguf), "--temp", "0", "-n", "2",
            input=f"/set parameter seed {BIG_SEED}\nbad \xff\xfe line\n/show parameters\n".encode("latin-1"))
    err = r.stderr.decode()
    assert r.returncode == 1 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "--seed must be" in errors[0] and "UTF-8" in errors[1], err
    assert "seed -1" in err  # the seed did not change


# ---------------------------------------------------------------------------------- prompts

def test_prompt_not_utf8_or_binary(tiny_gguf):
    gguf = str(tiny_gguf)
    error_line(cli("run", gguf, input=b"hi \xff\xfe there"), 2, "stdin", "UTF-8")
    error_line(cli("run", gguf, b"hi \xff there"), 2, "prompt", "UTF-8")
    error_line(cli("run", gguf, input=b"\x7fELF\x02\x01\x01\x00" + bytes(range(256))), 2, "UTF-8")
    error_line(cli("run", gguf, input=b"text\x00with a NUL"), 2, "binary")
    error_line(cli("run", gguf, "hi", "--system", b"sys \xc3("), 2, "--system", "UTF-8")


# -------------------------------------------------------------------------------- templates

LOOP = "{% set r = range(100000) %}{% for a in r %}{% for b in r %}{% for c in r %}{% endfor %}{% endfor %}{% endfor %}"
BAD_TEMPLATES = {
    "loop": LOOP,
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "power": "{{ 10 ** (10 ** 10) }}",
    "product": "{% set ns = namespace(x=3) %}{% for i in range(64) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x }}",
    "repeat": "{{ 'a' * 10 ** 11 }}",
    "doubling": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "plus": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "method": "{{ 'x'.ljust(10 ** 11) }}",
    "filter": "{{ 'x'|center(10 ** 11) }}",
    "format": "{{ '%99999999999d' % 1 }}",
    "str.format": "{{ '{:>99999999999}'.format(1) }}",
    "macro output": ("{% macro m(s) %}{% for i in range(100000) %}{{ s }}{% endfor %}{% endmacro %}"
                     "{% set x = m('y' * 1000000) %}{{ x|length }}"),
    "output": "{% for i in range(100000) %}{{ 'z' * 1000000 }}{% endfor %}",
    "lipsum": "{{ lipsum(n=10 ** 6) }}",
    "division": "{{ 1 / 0 }}",
    "type": "{{ 'a' + 1 }}",
}


@pytest.mark.parametrize("name", BAD_TEMPLATES)
def test_template_bounded(name, monkeypatch):
    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 0.5)
    t0 = time.monotonic()
    with pytest.raises(chat_template.TemplateError) as e:
        chat_template.render(BAD_TEMPLATES[name], [{"role": "user", "content": "hi"}])
    assert time.monotonic() - t0 < 5
    assert "\n" not in str(e.value)


BUILDS_A_LOT = {  # each text under MAX_TEXT, a hundred of them kept: 3.1 GB before the time bound stopped it
    "list of texts": "{% set ns = namespace(l=[]) %}{% for i in range(100) %}{% set ns.l = ns.l + ['x' * 31000000] %}"
                     "{% endfor %}{{ ns.l|length }}",
    "variables": "".join("{%% set v%d = 'x' * 31000000 %%}" % i for i in range(100)) + "ok",
    "split words": "".join("{%% set v%d = ('xy ' * 10000000).split() %%}" % i for i in range(20)) + "ok",
    "wide characters": "".join("{%% set v%d = '\U0001F600' * 31000000 %%}" % i for i in range(100)) + "ok",
}


@pytest.mark.parametrize("name", BUILDS_A_LOT)
def test_template_bounded_in_all_it_builds(name, monkeypatch):
    import tracemalloc

    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 60)  # the size bound must stop it, not the clock
    tracemalloc.start()
    try:
        with pytest.raises(chat_template.TemplateError, match="built more than 256 MiB in all"):
            chat_template.render(BUILDS_A_LOT[name], [{"role": "user", "content": "hi"}])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 320 << 20, peak


S = "{% set s = 'x' * 1000000 %}"  # a long text; below, one call would make thousands of copies of it
GROWS_IN_ONE_CALL = {  # each built gigabytes in one C call, which no bound can stop once started
    "join": S + "{{ ([s] * 3000)|join|length }}",
    "join method": S + "{{ ''.join([s] * 3000)|length }}",
    "replace": S + "{{ s|replace('x', 'y' * 3000)|length }}",
    "replace method": S + "{{ s.replace('x', 'y' * 3000)|length }}",
    "expandtabs": "{{ ('\t' * 3000).expandtabs(1000000)|length }}",
    "translate": S + "{{ s.translate({120: 'y' * 3000})|length }}",
    "indent": "{{ ('a\n' * 3000)|indent(1000000, true)|length }}",
    "indent by a text": "{{ ('a\n' * 3000)|indent('y' * 1000000)|length }}",
    "wordwrap": "{{ ('x ' * 1000000)|wordwrap(1, wrapstring='y' * 3000)|length }}",
    "format method": S + "{{ ('{0}' * 3000).format(s)|length }}",
    "format width": "{{ ('{:1000000}' * 3000).format(*([1] * 3000))|length }}",
    "percent": S + "{{ (('%(a)s' * 3000) % {'a': s})|length }}",
    "format filter": S + "{{ ('%(a)s' * 3000)|format(a=s)|length }}",
    "tojson": S + "{{ ([s] * 3000)|tojson|length }}",
    "tojson indent": "{{ ([[1]] * 1000)|tojson(indent=1000000)|length }}",
    "tojson separators": "{{ ([1] * 3000)|tojson(separators=('y' * 1000000, ':'))|length }}",
    "a list made upper case": S + "{{ ([s] * 3000)|upper|length }}",
    "a list written out": S + "{{ [s] * 3000 }}",
    "a list joined by ~": S + "{{ ('' ~ [s] * 3000)|length }}",
    "a list as a string": S + "{{ ([s] * 3000)|string|length }}",
    "urlencode": S + "{{ ([s] * 3000)|join|urlencode|length }}",
    "sum of lists": "{% set l = ['x'] * 1000000 %}{{ ([l] * 300)|sum(start=[])|length }}",
    "bytes": "{{ ('x'.encode() * 3000000000)|length }}",
    "characters of a wide text": "{{ ('\U0001F600' * 30000000)|list|length }}",
    "encode": "{{ ('\U0001F600' * 30000000).encode('unicode_escape')|length }}",
}


@pytest.mark.parametrize("name", GROWS_IN_ONE_CALL)
def test_template_stopped_before_one_call_builds_too_much(name):
    t0 = time.monotonic()
    with pytest.raises(chat_template.TemplateError) as e:
        chat_template.render(GROWS_IN_ONE_CALL[name], [{"role": "user", "content": "hi"}])
    assert time.monotonic() - t0 < 2  # refused before the work, not by the clock
    assert "\n" not in str(e.value) and str(e.value).endswith("use --raw")
    assert "built" in str(e.value) or "produced" in str(e.value)


def test_hostile_templates_peak_well_under_a_gigabyte():
    """Every template above, rendered in a child process: its peak RSS above what it held before.
    Linux's ru_maxrss keeps the peak from before exec (pytest's, forked): the child reads VmHWM."""
    code = (
        "import json, resource, sys\n"
        "from llmcli.formats import chat_template\n"
        "def peak():\n"
        "    try:\n"
        "        with open('/proc/self/status') as f:\n"
        "            return next(int(line.split()[1]) << 10 for line in f if line.startswith('VmHWM'))\n"
        "    except OSError:  # macOS: ru_maxrss is this process's own, in bytes\n"
        "        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "chat_template.RENDER_SECONDS = 0.5\n"
        "chat_template.render('{{ 1 }}', [])\n"
        "before = peak()\n"
        "for source in json.load(sys.stdin):\n"
        "    try:\n"
        "        chat_template.render(source, [{'role': 'user', 'content': 'hi'}])\n"
        "    except chat_template.TemplateError:\n"
        "        pass\n"
        "print(peak() - before)\n")
    sources = [*BAD_TEMPLATES.values(), *BUILDS_A_LOT.values(), *GROWS_IN_ONE_CALL.values()]
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps(sources), capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) < 512 << 20, f"{int(r.stdout) >> 20} MiB"


def test_normal_template_still_renders():
    from tiny import CHAT_TEMPLATE

    text = chat_template.render(CHAT_TEMPLATE, [{"role": "user", "content": "hi " * 100000}])
    assert text.startswith("<|im_start|>user\nhi hi") and text.endswith("<|im_start|>assistant\n")
    # the watchdog of a finished render never fires later
    time.sleep(0.1)


@pytest.fixture
def folder_copy(tiny_folder, tmp_path):
    import shutil

    def copy(name: str) -> Path:
        return Path(shutil.copytree(tiny_folder, tmp_path / name))
    return copy


def test_looping_template_through_the_cli(folder_copy):
    looping = folder_copy("looping")
    (looping / "chat_template.jinja").write_text(LOOP)
    t0 = time.monotonic()
    error_line(run_cli("run", str(looping), "hi", "-n", "2", timeout=60), 1, "chat template")
    assert time.monotonic() - t0 < 40
    deep = folder_copy("deep")
    (deep / "chat_template.jinja").write_text(BAD_TEMPLATES["recursion"])
    error_line(run_cli("run", str(deep), "hi", "-n", "2", timeout=60), 1, "chat template")


# ------------------------------------------------------------------------------------- GGUF

GGUF_BAD_METADATA = {
    "0 heads": {"llama.attention.head_count": 0},
    "0 kv heads": {"llama.attention.head_count_kv": 0},
    "0 layers": {"llama.block_count": 0},
    "0 dims": {"llama.embedding_length": 0},
    "0 ffn": {"llama.feed_forward_length": 0},
    "0 head dim": {"llama.attention.key_length": 0, "llama.rope.dimension_count": 0},
    "odd head dim": {"llama.attention.key_length": 15},
    "0 context": {"llama.context_length": 0},
    "no dims": {"llama.embedding_length": None},
    "nan rope base": {"llama.rope.freq_base": math.nan},
    "0 rope base": {"llama.rope.freq_base": 0.0},
    "inf rope base": {"llama.rope.freq_base": math.inf},
    "nan eps": {"llama.attention.layer_norm_rms_epsilon": math.nan},
    "0 eps": {"llama.attention.layer_norm_rms_epsilon": 0.0},
    "negative eps": {"llama.attention.layer_norm_rms_epsilon": -1e-5},
    "bad token text": "tokens",
    "merge without a space": {"tokenizer.ggml.merges": ["abc"]},
    "merge of unknown tokens": {"tokenizer.ggml.merges": ["qqqq zzzz"]},
}


@pytest.fixture(scope="module")
def tiny_model():
    return hf_model("llama")


def bad_gguf(model, path: Path, what) -> Path:
    if what == "tokens":  # a token that is not UTF-8
        import json as _json

        from tiny import tokenizer_json
        vocab = _json.loads(tokenizer_json())["model"]["vocab"]
        tokens = [t.encode() for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        tokens[100] = b"\xff\xfe"
        what = {"tokenizer.ggml.tokens": tokens}
    write_gguf(model, path, "F32", metadata=what)
    return path


@pytest.mark.parametrize("name", GGUF_BAD_METADATA)
def test_gguf_bad_metadata(name, tiny_model, tmp_path):
    path = bad_gguf(tiny_model, tmp_path / "bad.gguf", GGUF_BAD_METADATA[name])
    with pytest.raises((CorruptModelError, UnsupportedModelError)) as e:
        load_model(path, CPU)
    assert "corrupt" in str(e.value) and "\n" not in str(e.value)


def misaligned(path: Path) -> Path:
    """Move the last tensor's data offset off the file's alignment (its info ends the header)."""
    from llmcli.formats.gguf import GGUFFile

    reader = GGUFFile(path)
    end = reader.pos
    del reader
    data = bytearray(path.read_bytes())
    (offset,) = struct.unpack_from("<Q", data, end - 8)
    struct.pack_into("<Q", data, end - 8, offset + 4)
    path.write_bytes(bytes(data))
    return path


def test_gguf_misaligned_tensor(tiny_model, tmp_path):
    path = misaligned(bad_gguf(tiny_model, tmp_path / "bad.gguf", {}))
    with pytest.raises(CorruptModelError, match="aligned"):
        load_model(path, CPU)


def test_bad_gguf_through_the_cli(tiny_model, tmp_path):
    heads = bad_gguf(tiny_model, tmp_path / "heads.gguf", GGUF_BAD_METADATA["0 heads"])
    error_line(run_cli("run", str(heads), "hi"), 1, "num_attention_heads")
    off = misaligned(bad_gguf(tiny_model, tmp_path / "off.gguf", {}))
    error_line(run_cli("run", str(off), "hi"), 1, "aligned")
    tokens = bad_gguf(tiny_model, tmp_path / "tokens.gguf", "tokens")
    error_line(run_cli("run", str(tokens), "hi"), 1, "UTF-8")


# -------------------------------------------------------------------------------- HF folder

def test_hf_folder_bad_files(folder_copy):
    listed = folder_copy("listed")
    (listed / "config.json").write_text("[1, 2]")
    with pytest.raises(CorruptModelError, match="JSON object"):
        load_model(listed, CPU)
    hidden = folder_copy("hidden")
    config = json.loads((hidden / "config.json").read_text())
    del config["hidden_size"]
    (hidden / "config.json").write_text(json.dumps(config))
    with pytest.raises(CorruptModelError, match="hidden_size"):
        load_model(hidden, CPU)
    zero = folder_copy("zero")
    (zero / "config.json").write_text(json.dumps({**config, "hidden_size": 64, "num_attention_heads": 0}))
    with pytest.raises(CorruptModelError, match="num_attention_heads"):
        load_model(zero, CPU)
    latin = folder_copy("latin")
    (latin / "chat_template.jinja").write_bytes(b"{{ 'caf\xe9' }}")
    with pytest.raises(CorruptModelError, match="UTF-8"):
        load_model(latin, CPU)
    error_line(run_cli("run", str(listed), "hi"), 1, "config.json")
    error_line(run_cli("run", str(latin), "hi"), 1, "chat_template.jinja")


# ------------------------------------------------------------------------- paths and flags

def test_fifo_as_model_path_does_not_hang(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(UnsupportedModelError, match="not a regular file"):
        check_model_path(fifo)
    error_line(run_cli("run", str(fifo), "hi", timeout=60), 1, "not a regular file")


def test_a_reader_that_goes_away_ends_the_run_quietly(tiny_gguf):
    """`llmcli run ... | head -c 1`: the pipe closes while the answer streams; exit 0, nothing on
    stderr (click's own answer to EPIPE was exit 1, which fails `set -o pipefail` scripts)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "llmcli", "run", str(tiny_gguf), "Hello", "--ignore-eos",
                             "-n", "200", "-t", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.read(1)
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0, err
        assert err == ""
    finally:
        proc.kill()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_output_to_a_full_disk_is_one_line(tiny_gguf):
    """stdout on a full disk (/dev/full fails every write with ENOSPC): one error line, exit 1."""
    with open("/dev/full", "wb") as full:
        r = subprocess.run([sys.executable, "-m", "llmcli", "run", str(tiny_gguf), "Hello", "-n", "4", "-t", "1"],
                           env={**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}, stdout=full,
                           stderr=subprocess.PIPE)
    error_line(r, 1, "No space left on device", "writing the output")


def test_threads_above_the_cpu_count_are_clamped(tiny_gguf):
    with pytest.warns(UserWarning, match="--threads 1000"):
        placement = place("cpu", "float32", threads=1000)
    assert placement.threads == len(os.sched_getaffinity(0))
    place("cpu", "float32", threads=1)
    r = run_cli("run", str(tiny_gguf), "hi", "-n", "2", "--temp", "0", "-t", "1000")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("warning: --threads 1000 is more than") and r.stderr.count("\n") == 1, r.stderr


# ---------------------------------------------------------------------------------- signals

def wait_for(predicate, timeout: float = 120, what: str = ""):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_while_quantize_writes(sig, code, tiny_folder, tmp_path):
    """The real CLI entry point, with the checkpoint writer held up once the temporary folder has a file."""
    script = ("import time, sys\n"
              "from llmcli.quant import checkpoint\n"
              "def slow(folder, *a, **k):\n"
              "    (folder / 'model.safetensors').write_bytes(b'half')\n"
              "    time.sleep(120)\n"
              "checkpoint.write = slow\n"
              "from llmcli.cli import main\n"
              f"main(['quantize', {str(tiny_folder)!r}, '--preset', 'q8', '-o', {str(tmp_path / 'out')!r}])\n")
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: any(tmp_path.glob(".out.partial-*/model.safetensors")) or proc.poll() is not None,
                 what="the temporary folder")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    error_line(r, code, "terminated" if sig == signal.SIGTERM else "interrupted")
    assert list(tmp_path.iterdir()) == []  # no .partial-* folder, no output


def test_signal_during_real_quantize_and_run(smollm2_gguf, tmp_path):
    """SmolLM2 quantized with q4_g128 takes a while: stopped midway (SIGTERM), it leaves nothing
    behind; a run stopped while it streams (Ctrl-C) ends the same way."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    quant = subprocess.Popen([sys.executable, "-m", "llmcli", "quantize", str(smollm2_gguf), "--preset", "q4_g128",
                              "-o", str(tmp_path / "out")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run = subprocess.Popen([sys.executable, "-m", "llmcli", "run", str(smollm2_gguf), "Count from 1 to 1000:",
                            "--temp", "0", "--ignore-eos", "-n", "4000", "--ctx-size", "4096", "-t", "1"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(6)  # inside loading or converting
        quant.send_signal(signal.SIGTERM)
        out, err = quant.communicate(timeout=60)
        error_line(subprocess.CompletedProcess(quant.args, quant.returncode, out, err), 143, "terminated (SIGTERM)")
        assert list(tmp_path.iterdir()) == []
        first = run.stdout.read(1)  # the reply has started streaming
        assert first, run.stderr.read().decode()
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=60)
        error_line(subprocess.CompletedProcess(run.args, run.returncode, out, err), 130, "interrupted")
    finally:
        quant.kill()
        run.kill()


# ------------------------------------------------------------------ input limits (issue 21)

def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_input_is_bounded_in_depth_and_size(monkeypatch):
    from llmcli import json_input
    from llmcli.json_input import MAX_JSON_DEPTH, JsonInputError, load_json

    assert load_json(nested(MAX_JSON_DEPTH), "x") is not None
    for text in (nested(MAX_JSON_DEPTH + 1), nested(10_000), nested(1_000_000)):
        with pytest.raises(JsonInputError, match=f"nested more than {MAX_JSON_DEPTH} levels") as e:
            load_json(text, "the schema")
        assert str(e.value).startswith("the schema is") and "16 MiB" in str(e.value)
    with pytest.raises(JsonInputError, match="not valid JSON: Expecting value at line 1 column 2"):
        load_json("[", "x")
    with pytest.raises(JsonInputError, match="not usable JSON"):  # more digits than int() takes
        load_json("1" * 5000, "x")
    monkeypatch.setattr(json_input, "MAX_JSON_BYTES", 100)
    with pytest.raises(JsonInputError, match="larger than"):
        load_json(json.dumps("é" * 60), "x")  # 60 characters, 120 bytes


def test_text_files_are_regular_bounded_utf8(tmp_path, monkeypatch):
    from llmcli import text_input
    from llmcli.text_input import read_text_file

    fifo = tmp_path / "schema.json"
    os.mkfifo(fifo)
    cases = {fifo: "is a FIFO", "/dev/zero": "is a character device", tmp_path: "is a folder",
             tmp_path / "none": "does not exist", tmp_path / ("a" * 256): "name of 256 bytes",
             "/" + "/".join(["b" * 200] * 21): "a path of 4221 bytes"}
    for path, needle in cases.items():
        t0 = time.monotonic()
        with pytest.raises(InvalidParameterError, match=needle) as e:
            read_text_file(path, "--grammar")
        assert time.monotonic() - t0 < 5 and str(e.value).startswith("--grammar ")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    with pytest.raises(InvalidParameterError, match="not UTF-8 text"):
        read_text_file(latin, "--grammar")
    (tmp_path / "nul.txt").write_bytes(b"a\0b")
    with pytest.raises(InvalidParameterError, match="binary file"):
        read_text_file(tmp_path / "nul.txt")
    (tmp_path / "big.txt").write_text("x" * 101)
    with pytest.raises(InvalidParameterError, match="larger than 100 bytes"):
        read_text_file(tmp_path / "big.txt", limit=100)
    assert read_text_file(tmp_path / "big.txt") == "x" * 101

    def denied(*a, **k):  # root reads every file: no chmod makes one unreadable here
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(text_input.os, "open", denied)
    with pytest.raises(InvalidParameterError, match="permission denied"):
        read_text_file(tmp_path / "big.txt", "--file")


def test_deep_json_through_every_door(tiny_gguf, tmp_path):
    """10,000 levels: a --json-schema file, a batch line, a --load and a /load file; one error each."""
    deep = tmp_path / "deep.json"
    deep.write_text(nested(10_000))
    error_line(run_cli("run", str(tiny_gguf), "hi", "--json-schema", str(deep)), 2, "nested more than 64 levels")
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"id": 1, "prompt": "hi", "json_schema": ' + '{"anyOf": [' * 5000 + "{}" + "]}" * 5000 + "}\n")
    r = run_cli("batch", str(tiny_gguf), str(lines), "-o", str(tmp_path / "out.jsonl"))
    assert "Traceback" not in r.stderr and r.returncode == 1, r.stderr
    assert "warning: line 1: nested more than 64 levels" in r.stderr, r.stderr
    saved = tmp_path / "chat.json"
    saved.write_text('{"format": "llmcli-conversation", "version": 1, "messages": [], "x": ' + nested(10_000) + "}")
    error_line(run_cli("chat", str(tiny_gguf), "--load", str(saved)), 1, "nested more than 64 levels")
    r = run_cli("chat", str(tiny_gguf), "-n", "2", input=f"/load {saved}\n")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("error:") == 1 and "nested more than 64 levels" in r.stderr, r.stderr


def test_special_files_as_inputs_are_refused_at_once(tiny_gguf, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    gguf = str(tiny_gguf)
    for args, needle in [(["run", gguf, "hi", "--json-schema", str(fifo)], "is a FIFO"),
                         (["run", gguf, "hi", "--json-schema", "/dev/zero"], "is a character device"),
                         (["run", gguf, "hi", "--grammar", str(fifo)], "is a FIFO"),
                         (["perplexity", gguf, "--file", str(fifo)], "is a FIFO"),
                         (["quantize", gguf, "--preset", str(fifo)], "is a FIFO"),
                         (["run", gguf, "hi", "--json-schema", str(tmp_path / ("s" * 300))], "name of 300 bytes")]:
        error_line(run_cli(*args, timeout=60), 2, needle)
    latin = tmp_path / "latin.toml"  # a preset that is not UTF-8: was a UnicodeDecodeError traceback
    latin.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    error_line(run_cli("quantize", gguf, "--preset", str(latin)), 2, "not UTF-8")


def test_stdin_is_read_up_to_a_bound(tiny_gguf):
    gguf = str(tiny_gguf)
    with open("/dev/zero", "rb") as zero:
        r = subprocess.run([sys.executable, "-m", "llmcli", "run", gguf], stdin=zero, capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    error_line(r, 2, "stdin holds more than 16 MiB", "at most 16 MiB")
    error_line(cli("run", gguf, input=b"endless text\n" * (3 << 20)), 2, "more than 16 MiB")
    with open("/dev/zero", "rb") as zero:  # piped chat reads a line at a time: /dev/zero is one endless line
        r = subprocess.run([sys.executable, "-m", "llmcli", "chat", gguf], stdin=zero, capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    error_line(r, 2, "line 1 of stdin is longer than 16 MiB")


def test_llmcli_home_that_is_a_file(tiny_gguf, tmp_path):
    home = tmp_path / "home"
    home.write_text("not a folder")
    for where in (home, home / "sub"):
        error_line(run_cli("run", "smollm2", "hi", env={"LLMCLI_HOME": str(where)}), 2, "LLMCLI_HOME=", "not a folder")
    error_line(run_cli("list", env={"LLMCLI_HOME": str(home)}), 2, "not a folder")


# ------------------------------------------------------------------------- non-finite flags

@pytest.mark.parametrize("field, flag", [("temperature", "temp"), ("top_p", "top-p"), ("min_p", "min-p"),
                                         ("repeat_penalty", "repeat-penalty"), ("presence_penalty", "presence-penalty"),
                                         ("frequency_penalty", "frequency-penalty")])
def test_non_finite_sampling_values_are_refused(field, flag):
    from llmcli.decode.sampling import SamplingParams, parse_parameter
    from llmcli.serve import batch_jobs as bj

    for bad in (math.inf, -math.inf, math.nan, 10 ** 400):
        with pytest.raises(InvalidParameterError, match=f"--{flag} must be a finite number"):
            SamplingParams(**{field: bad})
    with pytest.raises(InvalidParameterError, match=f"--{flag} must be a finite number"):  # /set parameter
        parse_parameter(SamplingParams(), flag, "inf")
    with pytest.raises(InvalidParameterError, match="--temp must be a finite number"):  # Python's json reads Infinity
        bj.parse_line('{"id": 1, "prompt": "hi", "temperature": Infinity}', 1)


def test_non_finite_flags_through_the_cli(tiny_gguf, tmp_path):
    gguf = str(tiny_gguf)
    error_line(run_cli("run", gguf, "hi", "--temp", "inf"), 2, "--temp must be a finite number, got inf")
    error_line(run_cli("run", gguf, "hi", "--repeat-penalty", "inf"), 2, "--repeat-penalty must be a finite number")
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"id": 1, "prompt": "hi", "temperature": Infinity}\n')
    r = run_cli("batch", gguf, str(lines), "-o", str(tmp_path / "out.jsonl"), "-n", "2")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "--temp must be a finite number" in r.stderr, r.stderr
    r = run_cli("chat", gguf, "-n", "2", input="/set parameter temp inf\n/show parameters\n")
    assert r.returncode == 1 and r.stderr.count("error:") == 1 and "finite" in r.stderr and "temp 0.8" in r.stderr, r.stderr


# ------------------------------------------------------------------------------ GGUF header

def with_version(path: Path, version: int) -> Path:
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 4, version)
    path.write_bytes(bytes(data))
    return path


def with_tensor_type(path: Path, index: int, ggml_type: int) -> Path:
    """Rewrite the type of the index-th tensor in the header (its info: name, dims, type, offset)."""
    from llmcli.formats.gguf import GGUFFile

    reader = GGUFFile(path)
    t = reader.tensors[index]
    del reader
    data = bytearray(path.read_bytes())
    name = t.name.encode()
    at = data.find(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, ggml_type)
    path.write_bytes(bytes(data))
    return path


def test_gguf_unknown_version(tiny_model, tmp_path):
    for version in (99, 1, 0x03000000):
        path = with_version(bad_gguf(tiny_model, tmp_path / f"v{version}.gguf", {}), version)
        with pytest.raises(UnsupportedModelError, match=f"GGUF version {version}.*reads versions 2 and 3"):
            load_model(path, CPU)
    error_line(run_cli("run", str(path), "hi"), 1, "GGUF version 50331648 (a big-endian file?)")
    error_line(run_cli("run", str(with_version(path, 99)), "hi"), 1, "GGUF version 99")


def test_gguf_tensor_size_must_match_its_type_and_shape(tiny_model, tmp_path):
    from gguf import GGMLQuantizationType as T

    q8 = tmp_path / "q8.gguf"
    write_gguf(tiny_model, q8, "Q8_0")
    first = with_tensor_type(q8, 0, T.F32)  # a Q8_0 matrix claimed to be F32: 3.8x the bytes it has
    with pytest.raises(CorruptModelError, match=r"is F32 of shape 64x320, .* \(its type or shape does not match"):
        load_model(first, CPU)
    error_line(run_cli("run", str(first), "hi"), 1, "its type or shape does not match its data")
    f32 = bad_gguf(tiny_model, tmp_path / "f32.gguf", {})
    from llmcli.formats.gguf import GGUFFile
    n = len(GGUFFile(f32).tensors)
    with pytest.raises(CorruptModelError, match="does not match its data"):  # the last one, now too small
        load_model(with_tensor_type(f32, n - 1, T.F16), CPU)
    grown = with_tensor_type(bad_gguf(tiny_model, tmp_path / "f16.gguf", {}), n - 1, T.F64)
    with pytest.raises(CorruptModelError, match="truncated"):  # the last one, now past the end
        load_model(grown, CPU)


# ------------------------------------------------------------------- a context that fills up

def test_a_full_context_is_never_silent(tiny_gguf, tmp_path):
    """-n above what the context leaves: a warning on stderr, and --json says which limit ended it."""
    gguf, prompt = str(tiny_gguf), "The quick brown fox jumps over the lazy dog."
    r = run_cli("run", gguf, prompt, "--raw", "--temp", "0", "-c", "64", "-n", "100", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["finish_reason"] == "length" and out["stopped_by"] == "context", r.stderr
    assert out["usage"]["total_tokens"] == 64
    assert r.stderr == (f"warning: the context (64 tokens) filled before -n 100: the answer stops after "
                        f"{out['usage']['completion_tokens']} tokens; raise --ctx-size\n")
    r = run_cli("run", gguf, prompt, "--raw", "--temp", "0", "-c", "64", "-n", "5", "--json")
    out = json.loads(r.stdout)
    assert out["finish_reason"] == "length" and out["stopped_by"] == "max_tokens" and r.stderr == "", r.stderr
    r = run_cli("run", gguf, prompt, "--raw", "--temp", "0", "-c", "64")  # no -n: until the context is full
    assert r.returncode == 0 and r.stderr.startswith("warning: the context (64 tokens) filled: "), r.stderr
    r = run_cli("chat", gguf, "--temp", "0", "-c", "64", input="Hello\n")
    assert r.returncode == 0 and "warning: the context (64 tokens) filled" in r.stderr, r.stderr


# ------------------------------------------------------------------------ batch output lock

def test_two_batch_runs_on_one_output(tiny_gguf, tmp_path):
    """Both at once used to append every result twice; now the second is refused at once (or, if the
    first ended already, it finds every id done): each id is in the output once."""
    from llmcli.serve import batch_jobs as bj

    requests = tmp_path / "in.jsonl"
    requests.write_text("".join(json.dumps({"id": i, "prompt": f"Count to {i}."}) + "\n" for i in range(24)))
    out = tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "llmcli", "batch", str(tiny_gguf), str(requests), "-o", str(out), "-n", "8",
            "--temp", "0", "--rows", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in runs]
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == list(range(24)), results
    for code, err in results:
        assert "Traceback" not in err and (code == 0 or "another llmcli batch is writing" in err), err
    with bj.output_lock(out):  # a run that holds it, deterministically
        r = run_cli("batch", str(tiny_gguf), str(requests), "-o", str(out), "-n", "8")
    error_line(r, 1, "another llmcli batch is writing", "pass another -o file")
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ids


# ------------------------------------------------------------------ leftovers after kill -9

HOLD = ("import sys, time\n"
        "from pathlib import Path\n"
        "from llmcli.hub.store import Store\n"
        "from llmcli.quant.checkpoint import atomic_folder\n"
        "where = Path(sys.argv[2])\n"
        "with (Store(where).staging() if sys.argv[1] == 'pull' else atomic_folder(where / 'out')) as folder:\n"
        "    (folder / 'half').write_bytes(b'x' * 1000)\n"
        "    print(folder, flush=True)\n"
        "    time.sleep(300)\n")


def holder(kind: str, where: Path) -> tuple[subprocess.Popen, Path]:
    """A process inside a pull's staging or a quantize's partial folder, and that folder."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, kind, str(where)], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, text=True)
    return proc, Path(proc.stdout.readline().strip())


def aged(folder: Path) -> Path:
    """As old as a folder left a while ago (younger ones may not be held yet: left alone)."""
    os.utime(folder, (time.time() - 60, time.time() - 60))
    return folder


@pytest.mark.parametrize("kind", ["pull", "quantize"])
def test_staging_left_by_kill_9_is_removed_but_a_live_one_is_not(kind, tmp_path):
    from llmcli.hub.store import Store
    from llmcli.quant.checkpoint import atomic_folder

    def start_another():
        with (Store(tmp_path).staging() if kind == "pull" else atomic_folder(tmp_path / "out", force=True)):
            pass

    live, live_folder = holder(kind, tmp_path)
    killed, killed_folder = holder(kind, tmp_path)
    try:
        killed.kill()
        killed.wait()
        aged(live_folder), aged(killed_folder)
        start_another()
        assert live_folder.is_dir() and (live_folder / "half").exists()  # its process still holds it
        assert not killed_folder.exists()
    finally:
        live.kill()
        live.wait()
    start_another()
    assert not live_folder.exists()
    assert not list(tmp_path.glob(".out.partial-*")) and not list(tmp_path.glob("tmp/tmp*"))


def test_quantize_killed_then_run_again_leaves_nothing_behind(tiny_folder, tmp_path):
    script = ("import os, signal\n"
              "from llmcli.quant import checkpoint\n"
              "def dies(folder, *a, **k):\n"
              "    (folder / 'model.safetensors').write_bytes(b'half')\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n"
              "checkpoint.write = dies\n"
              "from llmcli.cli import main\n"
              f"main(['quantize', {str(tiny_folder)!r}, '--preset', 'q8', '-o', {str(tmp_path / 'out')!r}])\n")
    r = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True)
    assert r.returncode == -signal.SIGKILL
    [left] = list(tmp_path.glob(".out.partial-*"))
    aged(left)
    r = run_cli("quantize", str(tiny_folder), "--preset", "q8", "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


# ------------------------------------------------------------------------ misleading messages

def test_an_unreadable_model_file_says_so(tiny_gguf, monkeypatch):
    import builtins

    real_open = builtins.open

    def denied(file, *args, **kwargs):  # root reads every file: no chmod makes one unreadable here
        if str(file) == str(tiny_gguf):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", denied)
    with pytest.raises(LlmcliError, match="cannot be read: permission denied") as e:
        check_model_path(tiny_gguf)
    assert "neither a GGUF file" not in str(e.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files without read permission")
def test_an_unreadable_model_file_through_the_cli(tiny_gguf, tmp_path):
    import shutil

    locked = Path(shutil.copy(tiny_gguf, tmp_path / "locked.gguf"))
    locked.chmod(0)
    error_line(run_cli("run", str(locked), "hi"), 1, "cannot be read: permission denied")


def test_grammars_that_fail_later_are_refused_before_the_model_loads(tiny_gguf, tmp_path):
    from llmcli.decode.constrained import from_json_schema, from_regex
    from llmcli.errors import GrammarError

    for pattern in ("a{1000}{1000}{1000}", "a{1000000}", "(ab{100}){100}{100}"):
        with pytest.raises(GrammarError, match="repeats too much.*at most 100000; use \\* or \\+"):
            from_regex(pattern)
    from_regex("[a-z]{1,1000}( [a-z]{1,1000}){50}")  # long, not explosive
    for schema in ({"$ref": "#"}, {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, {"anyOf": [{"$ref": "#"}]}):
        with pytest.raises(GrammarError, match="describes no JSON value.*\\$ref point back to itself"):
            from_json_schema(json.dumps(schema), "s.json")
    from_json_schema(json.dumps({"type": "object", "properties": {"child": {"$ref": "#"}}}))  # recursion that ends
    t0 = time.monotonic()  # through the CLI: the model path does not even exist, the grammar fails first
    error_line(run_cli("run", "/nonexistent.gguf", "hi", "--regex", "a{1000}{1000}{1000}"), 2, "repeats too much")
    selfref = tmp_path / "s.json"
    selfref.write_text('{"$ref": "#"}')
    error_line(run_cli("run", str(tiny_gguf), "hi", "--json-schema", str(selfref)), 2, "$ref point back to itself")
    assert time.monotonic() - t0 < 60


def test_regex_digits_are_ascii(tiny_gguf):
    from llmcli.decode.constrained import GrammarCompiler, from_regex
    from llmcli.formats.open import open_model_file
    from llmcli.decode.regex_check import ascii_digits

    assert ascii_digits(r"\d{3}-\D[^\d]") == "[0-9]{3}-[^0-9][^0-9]"
    assert ascii_digits(r"[\D]") == "[[^0-9]]" and ascii_digits(r"[\D]", python=True) is None
    assert ascii_digits(r"\\d\p{Nd}[\]\d]") == r"\\d\p{Nd}[\]0-9]"  # an escaped backslash, a class, an escaped ]
    g = from_regex(r"\d{3}")
    g.check_output("123")
    from llmcli.errors import InvalidOutputError
    with pytest.raises(InvalidOutputError):  # Arabic-Indic digits: \d in Rust and Python, not here
        g.check_output("\u0661\u0662\u0663")
    tok = open_model_file(tiny_gguf).tokenizer  # byte-level: U+0661 starts with the byte token of 0xD9
    forbidden = GrammarCompiler(tok).constraint(g).forbidden(tok.vocab_size)
    arabic = tok.encode("\u0661", add_bos=False)[0]
    assert forbidden[arabic] and not forbidden[tok.encode("1", add_bos=False)[0]]


# ----------------------------------------------------------------- memory refused, not crashed

def test_beams_that_do_not_fit_are_refused_with_what_fits(smollm2_gguf):
    """--beams 1000 over the whole context wanted ~177 GiB for its cache and died in torch's
    allocator; the plan refuses it first and says how many rows, or which -n, fit."""
    r = run_cli("run", str(smollm2_gguf), "Translate: the cat is asleep", "--beams", "1000", "-t", "1",
                env={"LLMCLI_MEMORY_LIMIT": "4GiB"})
    line = error_line(r, 1, "--beams 1000 needs", "for 1000 rows of 8192 tokens")
    assert "rows fit at that length" in line and "1000 rows fit with -n " in line


def test_rows_that_do_not_fit_are_refused_with_what_fits(smollm2_gguf, monkeypatch):
    """serve --rows 256 -c 8192: the plan counts every row's cache and step, and says what fits."""
    from llmcli.runtime.plan import NotEnoughMemoryError
    from llmcli.runtime.runtime import plan_memory

    monkeypatch.setenv("LLMCLI_MEMORY_LIMIT", "8GiB")
    with pytest.raises(NotEnoughMemoryError, match="8192 tokens for each of 256 rows.*fits \\(or fewer --rows\\)"):
        plan_memory(smollm2_gguf, place("cpu", "bfloat16"), ctx_size=8192, rows=256)
