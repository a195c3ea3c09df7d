"""Group-wise quantization primitives: packing, round trips, exact grids, and the scale search."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from llmcli.quant.primitives import SCALE_DTYPE, dequantize, pack_int4, quantize, reconstruction_error, unpack_int4

FAST = settings(max_examples=40, deadline=None)


@st.composite
def weights(draw, max_rows=12):
    """(N, K) float weights with K a multiple of the chosen group size, and that group size."""
    group = draw(st.sampled_from([32, 64, 128]))
    n, groups = draw(st.integers(1, max_rows)), draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([1e-3, 0.02, 1.0, 30.0]))
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, groups * group, generator=gen) * scale
    if draw(st.booleans()):  # outliers, constant groups, zeros: what real weights have
        w[0, :group] = 0.0
        w[-1, -group:] = 1.5 * scale
        w[n // 2, 3] = 25 * scale
    return w, group


@FAST
@given(st.integers(1, 9), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_pack_unpack_round_trip(rows, half, seed):
    codes = torch.randint(0, 16, (rows, 2 * half), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (rows, half) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), codes)
    assert torch.equal(packed[0, 0] & 15, codes[0, 0])  # even column in the low nibble


@FAST
@given(weights(), st.sampled_from([(4, False), (4, True), (8, True)]), st.booleans())
def test_quantize_dequantize_round_trip(wg, fmt, search):
    w, group = wg
    bits, symmetric = fmt
    q = quantize(w, bits, group, symmetric, search)
    N, K = w.shape
    assert q.codes.shape == (N, K) and q.scales.shape == (N, K // group) and q.scales.dtype == SCALE_DTYPE
    assert (q.zeros is None) == symmetric
    if bits == 4:
        assert q.codes.dtype == torch.uint8 and int(q.codes.max()) <= 15
    else:
        assert q.codes.dtype == torch.int8 and int(q.codes.min()) >= -127
    back = q.dequantize()
    # min/max: within half a step (a whole one for the clipped side of symmetric int4, as Q4_0);
    # the search may trade a clipped extreme for a finer grid, within two steps
    step = q.scales.float().abs().repeat_interleave(group, dim=1)
    steps = 2.0 if search else 1.0 if (bits == 4 and symmetric) else 0.5
    assert bool(((back - w).abs() <= step * steps * 1.02 + w.abs() * 2**-8 + 1e-6 * w.abs().max()).all())
    # dequantize() is a pure function of what is stored
    assert torch.equal(back, dequantize(q.codes, q.scales, q.zeros, bits, group))


@FAST
@given(st.integers(1, 6), st.integers(1, 3), st.sampled_from([32, 64]), st.integers(0, 2**31 - 1), st.booleans())
@example(3, 1, 32, 10_000_000, True)  # the search's least-squares zero came out an ulp off: min/max's is kept
def test_weights_on_the_grid_are_recovered_exactly(rows, groups, group, seed, search):
    """A weight that is exactly (q - 8) * s + z, with every group using levels 0 and 15, comes back
    bit for bit: neither the min/max scales nor the search lose anything (this is what makes a
    re-quantized Q4_1 model lossless)."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, groups * group), generator=gen)
    codes.view(rows, groups, group)[..., 0] = 0
    codes.view(rows, groups, group)[..., 1] = 15
    s = (torch.rand(rows, groups, generator=gen) * 0.1 + 0.01).to(SCALE_DTYPE)
    z = (torch.randn(rows, groups, generator=gen) * 0.05).to(SCALE_DTYPE)
    w = dequantize(codes, s, z, 4, group)
    q = quantize(w, 4, group, symmetric=False, search=search)
    assert torch.equal(q.dequantize(), w)


def test_search_beats_min_max_on_gaussian_weights():
    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(3))
    for bits, group, symmetric in [(4, 32, False), (4, 128, False), (4, 32, True), (4, 128, True), (8, 32, True)]:
        plain = reconstruction_error(w, quantize(w, bits, group, symmetric, search=False))
        searched = reconstruction_error(w, quantize(w, bits, group, symmetric, search=True))
        assert searched < plain * (0.95 if bits == 4 else 1.0), (bits, group, symmetric, plain, searched)


def test_symmetric_int4_uses_the_extra_level_like_q4_0():
    w = torch.tensor([[-8.0, 7.0, 1.0, 0.0] * 8])  # largest magnitude negative -> scale +1, level -8
    q = quantize(w, 4, 32, symmetric=True, search=False)
    assert float(q.scales[0, 0]) == 1.0
    assert torch.equal(q.dequantize(), w)


def test_constant_and_zero_groups():
    w = torch.zeros(2, 64)
    w[1, 32:] = 0.37
    for bits, symmetric in [(4, False), (4, True), (8, True)]:
        q = quantize(w, bits, 32, symmetric)
        assert torch.isfinite(q.scales.float()).all()
        torch.testing.assert_close(q.dequantize(), w, atol=0.37 / 127, rtol=0)


def test_bad_arguments():
    w = torch.randn(4, 96)
    with pytest.raises(ValueError, match="does not divide"):
        quantize(w, 4, 64)
    with pytest.raises(ValueError, match="symmetric"):
        quantize(w, 8, 32, symmetric=False)
