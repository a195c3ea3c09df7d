"""device.place: --dtype named by the user stays; auto is bfloat16 only where the CPU has it natively
(AVX-512 BF16 or AMX), and may give way to what the model decodes fastest in. Every kind of CPU
(tests/cpu_kinds.py) on any machine."""

import pytest
import torch

from llmcli.runtime.device import place

AUTO_DTYPE = {"zen3": torch.float32, "zen4": torch.bfloat16, "intel": torch.bfloat16, "alderlake": torch.float32,
              "arm": torch.float32, "old": torch.float32}


def test_an_asked_dtype_stays(cpu_kind):
    asked = place("cpu", "bfloat16", 1)
    assert asked.dtype == torch.bfloat16 and "asked for" in asked.reason
    assert asked.with_fastest_dtype(torch.float32, "why") is asked


def test_auto_is_bfloat16_only_where_the_cpu_has_it_and_gives_way(cpu_kind):
    auto = place("cpu", "auto", 1)
    assert auto.dtype == AUTO_DTYPE[cpu_kind.name]
    fast = auto.with_fastest_dtype(torch.float32, "the native step computes in float32")
    assert fast.dtype == torch.float32 and fast.threads == auto.threads == 1
    if auto.dtype == torch.bfloat16:
        assert "dtype bfloat16 (native bf16 on this CPU)" in auto.reason
        assert "dtype float32 (the native step computes in float32)" in fast.reason
    else:  # float32 from the start: nothing gives way, and no reason names bf16 or the step
        assert fast is auto and "dtype float32 (default for the device)" in auto.reason
        assert "bf16" not in auto.reason and "native step" not in auto.reason


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_torch_kept_off_avx512_means_float32(cpu_kind, monkeypatch, capability):
    """ATEN_CPU_CAPABILITY below avx512: torch's own kernels emulate bf16 there, whatever the CPU has."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    assert place("cpu", "auto", 1).dtype == torch.float32
