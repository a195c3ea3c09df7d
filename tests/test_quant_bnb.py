"""bitsandbytes' formats: NF4 in bitsandbytes' own layout, and LLM.int8; their bitsandbytes code
paths (CUDA in use) are exercised here on the CPU, where bitsandbytes also runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from llmcli.quant.bnb_formats import NF4Weight, bitsandbytes, dequantize_nf4, pack_nf4, quantize_nf4, unpack_nf4
from llmcli.quant.modules import LLMInt8Linear, NF4Linear

CPU = torch.device("cpu")
bnb = pytest.mark.skipif(bitsandbytes() is None, reason="bitsandbytes is not installed")


def _linear() -> nn.Linear:
    torch.manual_seed(1)
    lin = nn.Linear(256, 128)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
    return lin


def test_nf4_round_trip_and_nearest_level():
    w = torch.randn(8, 128)
    codes, absmax = quantize_nf4(w)
    assert torch.equal(unpack_nf4(pack_nf4(codes)), codes)
    back = dequantize_nf4(codes, absmax)
    levels = torch.tensor([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453])
    assert float((back - w).abs().max()) <= float(absmax.max()) * float(levels[1] - levels[0]) / 2 + 1e-6
    torch.testing.assert_close(back.abs().view(8, 2, 64).amax(-1), absmax)  # the absmax value is exact


@bnb
def test_nf4_layout_is_bitsandbytes_own():
    F = bitsandbytes().functional
    w = torch.randn(32, 128)
    codes, absmax = quantize_nf4(w)
    weight = NF4Weight(pack_nf4(codes), absmax, CPU)
    state = weight.bnb_state()
    state.dtype = torch.float32
    theirs = F.dequantize_4bit(weight.qweight.reshape(-1, 1), state)
    torch.testing.assert_close(theirs, dequantize_nf4(codes, absmax), atol=1e-6, rtol=0)
    # and what bitsandbytes packs, we read
    q, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
    ours = dequantize_nf4(unpack_nf4(q.view(32, 64)), state.absmax.view(32, 2))
    torch.testing.assert_close(ours, F.dequantize_4bit(q, state), atol=1e-6, rtol=0)


@pytest.mark.parametrize("force_bnb", [False, pytest.param(True, marks=bnb)])
def test_nf4_linear_equals_own_dequantized_weight(force_bnb):
    module = NF4Linear.from_linear(_linear())
    if force_bnb:  # the CUDA path, on bitsandbytes' CPU backend
        module.packed.quant_state = module.packed.bnb_state()
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    expected = x.float() @ module.dequantize().t() + module.bias
    torch.testing.assert_close(module(x).float(), expected, atol=2e-2 * float(expected.abs().max()), rtol=0)


@pytest.mark.parametrize("force_bnb", [False, pytest.param(True, marks=bnb)])
def test_llm_int8_linear(force_bnb):
    module = LLMInt8Linear.from_linear(_linear())
    if force_bnb:
        state = bitsandbytes().MatmulLtState()
        state.CB, state.SCB = module.packed.qweight, (module.packed.scales.float() * 127).view(-1)
        state.threshold, state.has_fp16_weights, state.is_training = 6.0, False, False
        module.packed.bnb = state
    x = torch.randn(3, 256)
    x[:, 5] = 20.0  # an outlier column, kept in 16 bits by bitsandbytes
    expected = x @ module.dequantize().t() + module.bias
    # bitsandbytes quantizes the activations too (W8A8 outside the outliers)
    torch.testing.assert_close(module(x).float(), expected, atol=3e-2 * float(expected.abs().max()), rtol=0)
