"""device.place: --dtype named by the user stays; auto may give way to what the model decodes fastest in."""

import torch

from llmcli.runtime.device import place


def test_an_asked_dtype_stays_and_auto_gives_way():
    asked = place("cpu", "bfloat16", 1)
    assert asked.with_fastest_dtype(torch.float32, "why") is asked
    auto = place("cpu", "auto", 1)
    assert auto.dtype in (torch.float32, torch.bfloat16)
    fast = auto.with_fastest_dtype(torch.float32, "the native step computes in float32")
    assert fast.dtype == torch.float32 and "native step" in fast.reason and fast.threads == auto.threads
