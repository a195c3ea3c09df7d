"""Presets: the shipped files, rule matching (llama.cpp's layer selection), group-size fallbacks,
and mistakes in a user's file reported with file and line."""

from __future__ import annotations

import pytest

from llmcli.quant.convert import Source, plan
from llmcli.quant.presets import KEEP, Preset, PresetError, QuantSpec, Rule, load_preset, parse_preset, shipped_names

SHIPPED = ["bf16", "f16", "f32", "llm_int8", "nf4", "q4", "q4_g128", "q4_mixed", "q8"]


def _use_more_bits(i: int, n: int) -> bool:
    # llama.cpp src/llama-quant.cpp
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def test_shipped_presets_load():
    assert shipped_names() == SHIPPED
    for name in SHIPPED:
        preset = load_preset(name)
        assert preset.name == name and preset.description
        assert preset.quantizes == (name not in ("bf16", "f16", "f32"))


def test_q8_and_q4_mixed_refine_their_activations_and_the_rest_keep_int8():
    """int8x2 (int8 codes plus their residual's) where int8 activations were most of the error: q8
    and q4_mixed; q4 keeps llama.cpp's int8 and its speed, as does a preset that does not say."""
    assert {name: load_preset(name).activations for name in SHIPPED} == {
        name: "int8x2" if name in ("q8", "q4_mixed") else "int8" for name in SHIPPED}
    assert parse_preset('activations = "int8x2"\n[[rules]]\nmatch = "*"\nbits = 8\n', "t").activations == "int8x2"


def test_q4_mixed_follows_llama_cpp_layer_choice():
    preset = load_preset("q4_mixed")
    n = 30
    for i in range(n):
        for part in ("self_attn.v_proj", "mlp.down_proj"):
            spec = preset.spec_for(f"model.layers.{i}.{part}.weight", (576, 1536), n)
            assert spec.bits == (8 if _use_more_bits(i, n) else 4), (i, part)
        assert preset.spec_for(f"model.layers.{i}.self_attn.q_proj.weight", (576, 576), n).bits == 4
    assert preset.spec_for("lm_head.weight", (49152, 576), n) == QuantSpec(8, 32, True)
    assert preset.spec_for("model.embed_tokens.weight", (49152, 576), n).bits == 8
    assert preset.spec_for("model.norm.weight", (576,), n) == KEEP


def test_group_size_fallback_names_the_tensor():
    preset = load_preset("q4_g128")
    spec = preset.spec_for("model.layers.0.mlp.up_proj.weight", (1536, 576), 30)
    assert spec == QuantSpec(4, 64, False)  # 576 = 4.5 x 128 = 9 x 64
    assert "model.layers.0.mlp.up_proj.weight" in preset.notes[0] and "576" in preset.notes[0]
    assert preset.spec_for("model.layers.0.mlp.down_proj.weight", (576, 1536), 30) == QuantSpec(4, 128, False)
    assert preset.spec_for("x.weight", (64, 40), 30) == KEEP  # no group size divides 40


def test_refuse_names_the_tensor_and_the_rule():
    text = 'on_indivisible = "refuse"\n\n[[rules]]\nmatch = "*"\nbits = 4\ngroup_size = 128\n'
    preset = parse_preset(text, "mine", "mine.toml")
    with pytest.raises(PresetError, match=r"model\.layers\.2\.mlp\.up_proj\.weight.*576.*mine\.toml:3"):
        preset.spec_for("model.layers.2.mlp.up_proj.weight", (1536, 576), 30)


def test_tied_embedding_takes_the_more_precise_rule():
    text = '[[rules]]\nmatch = "lm_head.weight"\nbits = 8\ngroup_size = 32\n\n[[rules]]\nmatch = "*"\nbits = 4\ngroup_size = 32\n'
    preset = parse_preset(text, "t")
    sources = [Source("model.embed_tokens.weight", (320, 64), lambda: None)]
    assert plan(sources, preset, 2, tied=True)["model.embed_tokens.weight"].bits == 8
    assert plan(sources, preset, 2, tied=False)["model.embed_tokens.weight"].bits == 4


@pytest.mark.parametrize("text,line,needle", [
    ('[[rules]]\nmatch = "*"\nbits = 5\ngroup_size = 32\n', 1, "bits must be 4, 8 or 16"),
    ('description = "x"\n\n[[rules]]\nmatch = "*"\nbits = 4\n\n[[rules]]\nmatch = "*"\nbits = 4\ngroup_size = 48\n', 7,
     "rule 2: group_size"),
    ('[[rules]]\nmatch = "*"\nbits = 8\ngroup_size = 32\nsymmetric = false\n', 1, "symmetric only"),
    ('[[rules]]\nmatch = "*"\nbits = 4\ngroup_size = "row"\n', 1, "is for 8 bits"),
    ('[[rules]]\nmatch = []\nbits = 4\ngroup_size = 32\n', 1, "match must be"),
    ('[[rules]]\nmatch = "*"\nlayers = ["middle"]\nbits = 4\ngroup_size = 32\n', 1, "layers must be"),
    ('[[rules]]\nmatch = "*"\nbits = 4\ngroup_size = 32\ngroup = 3\n', 1, "unknown key 'group'"),
    ('x = 1\n[[rules]]\nmatch = "*"\nbits = 16\n', 1, "unknown key 'x'"),
    ('\n\non_indivisible = "maybe"\n[[rules]]\nmatch = "*"\nbits = 16\n', 3, "on_indivisible"),
    ('\nactivations = "int4"\n[[rules]]\nmatch = "*"\nbits = 8\n', 2, 'activations must be "int8" or "int8x2"'),
    ('description = "no rules"\n', 0, "at least one [[rules]]"),
    ('[[rules]]\nmatch = "*"\nbits = \n', 3, "not valid TOML"),
])
def test_bad_preset_file_says_file_and_line(tmp_path, text, line, needle):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(PresetError) as e:
        load_preset(path)
    message = str(e.value)
    assert needle in message, message
    assert message.startswith(f"{path}:{line if line else '?'}:"), message
    assert "\n" not in message


def test_unknown_preset_lists_the_shipped_ones():
    with pytest.raises(PresetError) as e:
        load_preset("q3")
    assert "'q3'" in str(e.value) and ", ".join(SHIPPED) in str(e.value)
    with pytest.raises(PresetError, match="does not exist"):
        load_preset("/nowhere/p.toml")


def test_the_first_matching_rule_wins_whether_it_names_a_tensor_or_a_pattern():
    """spec_for's index of exactly named tensors finds what a scan of the rules in order finds."""
    a, b, c = QuantSpec(4, 32), QuantSpec(8, 32), QuantSpec(4, 64)
    rules = [Rule(("x.1",), (), a), Rule(("*.mlp.*",), (), b), Rule(("model.layers.3.mlp.up",), (), c),
             Rule(("*.up",), (0,), a), Rule(("lm_head.weight",), (), c), Rule(("lm_head.weight", "y"), (), a)]
    preset = Preset("t", rules)
    for name in ["x.1", "model.layers.3.mlp.up", "model.layers.0.attn.up", "model.layers.5.attn.up",
                 "lm_head.weight", "y", "nothing", "model.layers.0.mlp.up"]:
        assert preset._first_rule(name, 8) is next((r for r in rules if r.matches(name, 8)), None), name
    assert preset._first_rule("model.layers.3.mlp.up", 8).spec == b  # the pattern before the exact name
    assert preset._first_rule("model.layers.0.attn.up", 8).spec == a  # a layer rule
    assert preset._first_rule("nothing", 8) is None
