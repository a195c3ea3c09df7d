"""quant/precision.py: which activations the native step makes int8x2, by a file's size,
LLMCLI_ACTIVATIONS over it, and the words `run -v` says it in. No CPU features
assumed: the choice is a mask, the same on every variant (each variant's int8x2 kernels:
test_native_variants.py, test_native_step.py)."""

from __future__ import annotations


import pytest

from llmcli.errors import InvalidParameterError
from llmcli.native.step import REFINE, REFINE_ALL, refine_mask
from llmcli.quant import precision

LAYERS = REFINE["normed"] | REFINE["attention"] | REFINE["mlp"]


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(precision.ENV, raising=False)


def test_small_files_refine_the_normed_inputs_and_down_s_big_files_keep_int8():
    assert precision.choose(100 << 20) == REFINE["normed"] | REFINE["mlp"] == precision.SMALL_FILES
    assert precision.choose(precision.REFINE_UP_TO) == precision.SMALL_FILES
    assert precision.choose(precision.REFINE_UP_TO + 1) == 0


@pytest.mark.parametrize("value,mask", [("int8", 0), ("int8x2", REFINE_ALL), ("head", 8), ("mlp, normed", 5),
                                        ("INT8X2", REFINE_ALL)])
def test_the_environment_sets_the_mask_for_any_file(monkeypatch, value, mask):
    monkeypatch.setenv(precision.ENV, value)
    assert precision.choose(1 << 40) == mask == precision.parse(value)


@pytest.mark.parametrize("value", ["int4", "", "normed,heads"])
def test_a_bad_value_is_one_error_naming_the_choices(value):
    with pytest.raises(InvalidParameterError, match="int8, int8x2 or some of normed, attention, mlp, head"):
        precision.parse(value)


def test_the_words_name_each_matmul_s_activations():
    assert precision.describe(0) == "int8 activations (llama.cpp's)"
    assert precision.describe(REFINE_ALL) == "int8x2 activations (every matmul)"
    assert precision.describe(LAYERS) == "int8x2 activations for q/k/v, gate/up, o, down; int8 for head"
    assert precision.describe(REFINE["head"]) == "int8x2 activations for head; int8 for q/k/v, gate/up, o, down"
    assert precision.describe(precision.SMALL_FILES) == "int8x2 activations for q/k/v, gate/up, down; int8 for o, head"


def test_a_step_s_refined_argument_as_a_mask():
    assert (refine_mask(True), refine_mask(False), refine_mask(6), refine_mask(["head", "mlp"])) == (15, 0, 6, 12)
