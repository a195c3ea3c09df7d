"""What each kind of CPU (tests/cpu_kinds.py) chooses, on any machine: the kernel variant, whether
blocks multiply as integers, the default dtype, the KV cache type and the decode step, and the words
--verbose says them in; through the probe in-process, and through LLMCLI_HIDE_CPU_FLAGS in `llmcli`."""

from __future__ import annotations

import pytest
import torch

from conftest import run_cli
from cpu_kinds import KINDS, hide_env
from llmcli import native
from llmcli.native import cpu

VARIANT = {"zen3": "avx2", "zen4": "avx512vnni", "intel": "avx512vnni", "alderlake": "avxvnni", "arm": "neon",
           "old": "portable"}
RUNNABLE = {"zen3": ["avx2", "portable"], "zen4": ["avx512vnni", "avx2", "portable"],
            "intel": ["avx512vnni", "avxvnni", "avx2", "portable"], "alderlake": ["avxvnni", "avx2", "portable"],
            "arm": ["neon", "portable"], "old": ["portable"]}
WHY_NOT = {  # variant: the reason given on each kind that cannot run it
    "avx512vnni": {"zen3": "needs avx512_vnni", "alderlake": "needs avx512_vnni",
                   "arm": "avx512vnni is for x86_64 CPUs; this one is aarch64", "old": "needs avx512_vnni"},
    "avxvnni": {"zen3": "needs avx_vnni", "zen4": "needs avx_vnni",
                "arm": "avxvnni is for x86_64 CPUs; this one is aarch64", "old": "needs avx_vnni"},
    "avx2": {"arm": "avx2 is for x86_64 CPUs; this one is aarch64", "old": "needs avx2"},
    "neon": {kind: "neon is for aarch64 CPUs; this one is x86_64" for kind in KINDS if kind != "arm"},
}


def test_the_variant_follows_the_flags(cpu_kind):
    assert cpu.runnable() == RUNNABLE[cpu_kind.name]
    for variant, reasons in WHY_NOT.items():
        assert cpu.why_not(variant) == reasons.get(cpu_kind.name), variant
    assert native.variant() == native.describe() == VARIANT[cpu_kind.name]
    assert native.int8_dot() == (cpu_kind.name != "old")  # SIMD integer dot products in every variant but portable


def test_a_gguf_decodes_through_the_native_step_in_float32_with_a_float16_cache(cpu_kind, tiny_gguf):
    """On every kind with integer dot products: a bf16 CPU's auto dtype gives way to float32 for the
    step, naming it; elsewhere it is float32 from the start. Without them (portable kernels) Q8_0
    loads as int8 for torch's kernel: eager, and nothing changed for a step that does not run."""
    from llmcli.formats.open import open_model_file
    from llmcli.runtime.device import place
    from llmcli.runtime.runtime import native_placement, open_model

    auto = place("cpu", "auto", 1)
    placement, kv = native_placement(open_model_file(tiny_gguf), auto, None)
    native_step = cpu_kind.name != "old"
    assert (placement.dtype, kv) == (torch.float32, "f16" if native_step else None)
    if auto.dtype == torch.bfloat16:
        assert "dtype float32 (the native one-call step runs in float32)" in placement.reason
    else:
        assert placement is auto and "dtype float32 (default for the device)" in placement.reason
    rt = open_model(str(tiny_gguf), device="cpu", ctx_size=64, threads=1)
    assert rt.placement == placement and rt.kv_type == kv
    step = rt.decode_step(compile=False)  # a C++ step where the kind has one (its kernels unused until a call)
    assert rt.describe_step(step) == (f"native (one C++ call a step, {VARIANT[cpu_kind.name]} kernels, "
                                      "int8x2 activations for q/k/v, gate/up, down; int8 for o, head, f16 KV cache)"
                                      if native_step else "eager")


def test_the_memory_plan_counts_the_weights_as_the_kind_holds_them(cpu_kind, smollm2_gguf):
    """SmolLM2's Q4_1/Q8_0 blocks as they are, or (portable kernels) as int4/int8 codes and scales."""
    from llmcli.runtime.probe import weights_from_files

    info = weights_from_files(smollm2_gguf, None, torch.bfloat16, torch.device("cpu"))
    assert info.label == "Q4_1/Q8_0 as stored"
    assert f"{info.nbytes / 2**20:.2f}" == ("97.10" if cpu_kind.name == "old" else "92.04")


@pytest.mark.parametrize("name", ["zen3", "old"])
def test_llmcli_sees_the_flags_the_environment_leaves(tiny_gguf, name):
    if not native.available():
        pytest.skip("no C++ compiler for the kernels")
    r = run_cli("run", str(tiny_gguf), "Hi", "-n", "2", "--temp", "0", "-v", env=hide_env(KINDS[name]))
    assert r.returncode == 0, r.stderr
    assert "dtype float32 (default for the device)" in r.stderr
    step = "eager\n" if name == "old" else (f"native (one C++ call a step, {VARIANT[name]} kernels, "
                                            "int8x2 activations for q/k/v, gate/up, down; int8 for o, head, f16 KV cache")
    assert f"decode step: {step}" in r.stderr
