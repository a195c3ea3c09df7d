"""Reasoning models: the parser of each format on the published templates (Qwen3, DeepSeek-R1
distill, SmolLM3, gpt-oss), and a scripted reasoning model through the real tokenizer path, the
template and both decode paths (torch generate() and the torch-free generate_lean()): thinking
apart from the answer, stops on the answer only, `length` inside the thinking, the budget, and a
grammar that starts after the thinking."""

from __future__ import annotations

import json

import pytest
import torch
from reasoning_families import LeanCache, Script, ScriptedLean, ScriptedTorch, family, template_of

from llmcli.cache.static import StaticKVCache
from llmcli.decode.constrained import GrammarCompiler, from_json_schema, from_regex
from llmcli.decode.generate import generate
from llmcli.decode.lean import generate_lean
from llmcli.decode.reasoning import (HarmonyParser, Reasoning, TagParser, reasoning_format, reasoning_variables,
                                     sequence_reasoning)
from llmcli.decode.request import Request, RequestError
from llmcli.decode.sampling_plain import SamplingParams
from llmcli.decode.think_first import think_first
from llmcli.formats.prompt import conversation_ids

GREEDY = SamplingParams(temperature=0)
ASK = [{"role": "user", "content": "What is the capital of France?"}]

# what each family writes: (thinking, with the opener where the model writes it; answer; the closer)
SCRIPTS = {
    "qwen3": ("<think>\nThe user asks for a capital. France: Paris.\n</think>", "\n\nParis.", "</think>"),
    "deepseek-r1": ("The user asks for a capital. France: Paris.\n</think>", "\n\nParis.", "</think>"),
    "smollm3": ("<think>\nThe user asks for a capital. France: Paris.\n</think>", "\nParis.", "</think>"),
    "gpt-oss": ("<|channel|>analysis<|message|>The user asks for a capital. France: Paris.<|end|>"
                "<|start|>assistant<|channel|>final<|message|>", "Paris.", "<|channel|>final<|message|>"),
}
THOUGHT = "The user asks for a capital. France: Paris."


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: family(name, root / name) for name in SCRIPTS}


def split_all(parser, pieces):
    think, answer = [], []
    for p in pieces:
        t, a = parser.push(p)
        think.append(t)
        answer.append(a)
    t, a = parser.finish()
    return "".join(think + [t]), "".join(answer + [a]), answer + [a]


# ----------------------------------------------------------------------------------- parsers


@pytest.mark.parametrize("text", ["<think>\nstep one\nstep two\n</think>\n\nParis.", "  <think>a < b</think>Paris."])
def test_tag_parser_splits_the_same_whatever_the_pieces(text):
    whole = split_all(TagParser(), [text])[:2]
    for size in (1, 2, 3, 5):
        pieces = [text[i:i + size] for i in range(0, len(text), size)]
        think, answer, answers = split_all(TagParser(), pieces)
        assert (think, answer) == whole
        assert not any("<" in a or "think" in a for a in answers)  # never part of a tag as answer text
    assert whole[1] == "Paris."


def test_tag_parser_start_states_follow_the_prompt():
    assert TagParser("<|im_start|>assistant\n").state == "start"
    assert TagParser("<｜Assistant｜><think>\n").state == "thinking"  # DeepSeek-R1: the template opens it
    assert TagParser("assistant\n<think>\n\n</think>\n\n").state == "after"  # enable_thinking false
    assert split_all(TagParser(), ["Paris", " <think>x</think>"])[1] == "Paris <think>x</think>"  # only at the start
    assert split_all(TagParser("<think>\n"), ["cut off mid-thought "])[:2] == ("cut off mid-thought", "")
    assert split_all(TagParser(), ["<thi"])[:2] == ("", "<thi")  # held back, then given back at the end


def test_harmony_parser_channels():
    text = ("<|channel|>analysis<|message|>Think <|about|> it.<|end|><|start|>assistant"
            "<|channel|>final<|message|>Paris.")
    whole = split_all(HarmonyParser("<|start|>assistant"), [text])
    assert whole[:2] == ("Think <|about|> it.", "Paris.")
    for size in (1, 4, 7):
        pieces = [text[i:i + size] for i in range(0, len(text), size)]
        think, answer, answers = split_all(HarmonyParser("<|start|>assistant"), pieces)
        assert (think, answer) == whole[:2]
        assert "".join(answers) == "Paris." and not any("<|" in a for a in answers)
    assert HarmonyParser("<|start|>assistant<|channel|>final<|message|>").state == "final"


# --------------------------------------------------------------------------- templates


def test_each_template_is_recognised_with_its_switches():
    qwen3, r1, smol, oss = (reasoning_format(template_of(n)) for n in ("qwen3", "deepseek-r1", "smollm3", "gpt-oss"))
    assert (qwen3.kind, qwen3.switch) == ("think", True)
    assert (r1.kind, r1.switch) == ("think", False)
    assert (smol.kind, smol.switch) == ("think", True)
    assert (oss.kind, oss.effort) == ("harmony", True)
    assert reasoning_format("{{ messages[0]['content'] }}") is None and reasoning_format(None) is None


@pytest.mark.parametrize("name, think, state", [
    ("qwen3", None, "start"), ("qwen3", False, "after"), ("deepseek-r1", None, "thinking"),
    ("smollm3", None, "start"), ("smollm3", False, "after"), ("gpt-oss", None, "header")])
def test_the_prompt_decides_where_the_parser_starts(families, name, think, state):
    tok, template = families[name]
    fmt = reasoning_format(template)
    ids = conversation_ids(tok, template, ASK, **reasoning_variables(fmt, Request(think=think)))
    assert Reasoning(fmt, tok, ids).state == state


def test_smollm3_system_flag_and_gpt_oss_effort_reach_the_template(families):
    tok, template = families["smollm3"]
    ids = conversation_ids(tok, template, [{"role": "system", "content": "Be brief. /no_think"}, *ASK])
    assert Reasoning(reasoning_format(template), tok, ids).state == "after"
    tok, template = families["gpt-oss"]
    fmt = reasoning_format(template)
    prompt = tok.decode(conversation_ids(tok, template, ASK, **reasoning_variables(fmt, Request(reasoning_effort="low"))),
                        skip_special=False)
    assert "Reasoning: low" in prompt


# ------------------------------------------------------------------- scripted generation


def prompt_of(tok, template, request=Request(), messages=ASK):
    return conversation_ids(tok, template, messages, **reasoning_variables(reasoning_format(template), request))


def run_lean(tok, template, request, script, messages=ASK):
    prompt = prompt_of(tok, template, request, messages)
    reasoning = sequence_reasoning(reasoning_format(template), tok, prompt, request.think, request.reasoning_budget,
                                   request.reasoning_format)
    model = ScriptedLean(script, tok.vocab_size)
    constraint = think_first(reasoning, None, tok.eos_ids)
    return list(generate_lean(model, tok, prompt, request, LeanCache(), constraint, reasoning))


def run_torch(tok, template, request, script, grammar=None, messages=ASK):
    prompt = prompt_of(tok, template, request, messages)
    reasoning = sequence_reasoning(reasoning_format(template), tok, prompt, request.think, request.reasoning_budget,
                                   request.reasoning_format)
    inner = GrammarCompiler(tok).constraint(grammar) if grammar is not None else None
    constraint = think_first(reasoning, inner, tok.eos_ids)
    model = ScriptedTorch(script, tok.vocab_size)
    cache = StaticKVCache(1, 1, 1, 4096, torch.device("cpu"), torch.float32)
    return list(generate(model, tok, prompt, request, cache, constraint=constraint, reasoning=reasoning))


def joined(chunks):
    return "".join(c.reasoning for c in chunks), "".join(c.text for c in chunks), chunks[-1]


@pytest.mark.parametrize("run", [run_lean, run_torch])
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_scripted_reasoning_model_thinks_apart_from_its_answer(families, name, run):
    tok, template = families[name]
    script = Script(tok, *SCRIPTS[name])
    think, answer, last = joined(run(tok, template, Request(GREEDY, max_tokens=200), script))
    assert (think, answer, last.finish_reason) == (THOUGHT, "Paris.", "stop")
    assert 0 < last.stats.reasoning_tokens < last.stats.completion_tokens


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_reasoning_format_none_keeps_the_tags_in_the_answer(families, name):
    tok, template = families[name]
    think, answer, _ = joined(run_lean(tok, template, Request(GREEDY, reasoning_format="none"), Script(tok, *SCRIPTS[name])))
    assert think == "" and THOUGHT in answer and answer.endswith("Paris.")
    assert ("</think>" if name != "gpt-oss" else "<|channel|>final<|message|>") in answer


def test_stops_apply_to_the_answer_only(families):
    tok, template = families["qwen3"]
    script = Script(tok, *SCRIPTS["qwen3"])
    think, answer, last = joined(run_lean(tok, template, Request(GREEDY, stop=("capital", "France")), script))
    assert think == THOUGHT and answer == "Paris." and last.finish_reason == "stop"  # "capital" only in the thinking
    think, answer, last = joined(run_lean(tok, template, Request(GREEDY, stop=("is.",)), script))
    assert (answer, last.finish_reason) == ("Par", "stop")


@pytest.mark.parametrize("run", [run_lean, run_torch])
def test_max_tokens_inside_the_thinking_is_length(families, run):
    tok, template = families["qwen3"]
    think, answer, last = joined(run(tok, template, Request(GREEDY, max_tokens=6), Script(tok, *SCRIPTS["qwen3"])))
    assert last.finish_reason == "length" and answer == "" and think and THOUGHT.startswith(think)
    assert last.stats.reasoning_tokens == 6


@pytest.mark.parametrize("run", [run_lean, run_torch])
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_budget_closes_the_thinking_and_the_answer_follows(families, name, run):
    tok, template = families[name]
    think, answer, last = joined(run(tok, template, Request(GREEDY, reasoning_budget=5), Script(tok, *SCRIPTS[name])))
    assert answer == "Paris." and last.finish_reason == "stop"
    assert think and THOUGHT.startswith(think) and think != THOUGHT  # cut short
    assert last.stats.reasoning_tokens <= 5 + 8  # the budget, then the tokens that close it


@pytest.mark.parametrize("name", ["qwen3", "smollm3", "deepseek-r1", "gpt-oss"])
def test_budget_zero_turns_thinking_off(families, name):
    """Through the template's switch where it has one (Qwen3, SmolLM3), else by closing at once."""
    tok, template = families[name]
    think, answer, last = joined(run_lean(tok, template, Request(GREEDY, reasoning_budget=0), Script(tok, *SCRIPTS[name])))
    assert (think, answer) == ("", "Paris.")
    assert last.stats.reasoning_tokens <= 8
    think, answer, _ = joined(run_lean(tok, template, Request(GREEDY, think=False), Script(tok, *SCRIPTS[name])))
    assert (think, answer) == ("", "Paris.")


def test_a_json_schema_constrains_only_the_answer(families):
    """The thinking writes what no schema allows; the answer is the schema's (the script wanted "Paris.")."""
    tok, template = families["qwen3"]
    schema = from_json_schema(json.dumps({"type": "object", "properties": {"city": {"enum": ["Paris"]}},
                                          "required": ["city"], "additionalProperties": False}))
    request = Request(GREEDY, max_tokens=200, grammar=schema)
    think, answer, last = joined(run_torch(tok, template, request, Script(tok, *SCRIPTS["qwen3"]), schema))
    assert think == THOUGHT and json.loads(answer) == {"city": "Paris"}
    schema.check_output(answer)
    think, answer, _ = joined(run_torch(tok, template, request.with_(reasoning_budget=3),
                                        Script(tok, *SCRIPTS["qwen3"]), schema))
    assert think and json.loads(answer) == {"city": "Paris"}


def test_a_regex_after_the_thinking_of_a_template_that_opens_it(families):
    tok, template = families["deepseek-r1"]
    regex = from_regex("[A-Z][a-z]+")
    script = Script(tok, SCRIPTS["deepseek-r1"][0], "Paris", "</think>")
    think, answer, _ = joined(run_torch(tok, template, Request(GREEDY, max_tokens=100, grammar=regex), script, regex))
    assert think == THOUGHT and answer == "Paris"


def test_reasoning_fields_are_checked():
    with pytest.raises(RequestError, match="--reasoning-budget must be"):
        Request(reasoning_budget=-1)
    with pytest.raises(RequestError, match="contradict"):
        Request(think=False, reasoning_budget=10)
    with pytest.raises(RequestError, match="reasoning_effort must be one of low"):
        Request(reasoning_effort="max", spelling={"reasoning_effort": "reasoning_effort"})
    with pytest.raises(RequestError, match="--reasoning-format must be one of"):
        Request(reasoning_format="tags")
