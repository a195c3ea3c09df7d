"""`run`, `chat` and `batch` with a reasoning model: the real SmolLM2 given a template that opens a
<think> block (it is not trained to think, but writes its first words inside the block and the
parser, the budget and the grammar take it from there), and one-line errors for flags a model that
does not think cannot honour."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

THINK_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                  "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}"
                  "{% endif %}")
ASK = "What is the capital of France?"


@pytest.fixture(scope="module")
def thinking(smollm2_gguf, tmp_path_factory):
    folder = tmp_path_factory.mktemp("think")
    (folder / "think.jinja").write_text(THINK_TEMPLATE)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    (folder / "city.json").write_text(json.dumps(schema))
    return folder, ["run", str(smollm2_gguf), "--chat-template-file", str(folder / "think.jinja"), "--temp", "0"]


def test_run_json_has_the_thinking_beside_the_text(thinking):
    _, base = thinking
    r = run_cli(*base, "-n", "40", "--json", ASK)
    out = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr
    assert "Paris" in out["reasoning"] and "<think>" not in out["text"] + out["reasoning"]
    assert out["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def test_run_prints_only_the_answer_and_the_thinking_on_stderr_when_asked(thinking):
    _, base = thinking
    plain = run_cli(*base, "-n", "40", "--reasoning-budget", "3", ASK)
    shown = run_cli(*base, "-n", "40", "--reasoning-budget", "3", "--show-thinking", ASK)
    assert plain.returncode == shown.returncode == 0, plain.stderr + shown.stderr
    assert "The capital of" not in plain.stdout + plain.stderr + shown.stdout
    assert shown.stderr.startswith("The capital of") and plain.stdout == shown.stdout
    off = run_cli(*base, "-n", "40", "--no-think", ASK)  # no switch in this template: closed at once
    assert off.returncode == 0 and off.stdout.strip() and "think>" not in off.stdout


def test_the_schema_applies_after_the_thinking(thinking):
    folder, base = thinking
    r = run_cli(*base, "-n", "80", "--reasoning-budget", "8", "--json-schema", str(folder / "city.json"), "--json", ASK)
    out = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr
    assert out["reasoning"].startswith("The capital of") and json.loads(out["text"])["city"]
    cut = run_cli(*base, "-n", "12", "--json-schema", str(folder / "city.json"), ASK)
    assert cut.returncode == 1 and "still thinking" in cut.stderr.strip().splitlines()[-1]


def test_chat_keeps_the_thinking_for_show_thinking(thinking, smollm2_gguf):
    folder, _ = thinking
    r = run_cli("chat", str(smollm2_gguf), "--chat-template-file", str(folder / "think.jinja"), "--temp", "0",
                "-n", "30", "--reasoning-budget", "4", input=f"{ASK}\n/show thinking\n/set think off\n/set think maybe\n")
    assert "The capital of France" in r.stderr and "thinking off" in r.stderr
    assert "usage: /set think on|off" in r.stderr and "The capital of France" not in r.stdout


def test_think_flags_need_a_model_that_thinks(smollm2_gguf):
    for flags in (["--think"], ["--reasoning-budget", "10"]):
        r = run_cli("run", str(smollm2_gguf), *flags, ASK)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "does not think" in lines[0], r.stderr
    r = run_cli("run", str(smollm2_gguf), "--reasoning-budget", "-1", ASK)
    assert r.returncode == 2 and "--reasoning-budget must be" in r.stderr and "Traceback" not in r.stderr
