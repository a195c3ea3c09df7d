"""device.place: float32 named by the user is the full-precision mode; float32 picked by auto is not."""

import torch

from llmcli.runtime.device import place


def test_full_precision_only_when_float32_is_asked_for():
    assert place("cpu", "float32", 1).full_precision
    assert not place("cpu", "bfloat16", 1).full_precision
    auto = place("cpu", "auto", 1)
    assert not auto.full_precision  # auto keeps GGUF blocks packed, whatever compute dtype it picks
    assert auto.dtype in (torch.float32, torch.bfloat16)
