"""Quantized modules: each equals a matmul with its own dequantized weight, through the CPU kernels
and through the fallback (dequantized tiles), and the CPU kernel layout is read back exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from llmcli.quant import kernels
from llmcli.quant.modules import Int4Linear, Int8Linear, QuantEmbedding
from llmcli.quant.packed import Int4Weight, Int8Weight

CPU = torch.device("cpu")
FORMATS = {  # name -> (class, from_linear keyword arguments)
    "int4_g32": (Int4Linear, {"group_size": 32}),
    "int4_g64_sym": (Int4Linear, {"group_size": 64, "symmetric": True}),
    "int4_g128": (Int4Linear, {"group_size": 128}),
    "int8_row": (Int8Linear, {}),
    "int8_g32": (Int8Linear, {"group_size": 32}),
}


@pytest.fixture(params=["kernel", "fallback"])
def path(request, monkeypatch):
    """'kernel': the CPU weight-only kernels (decode-sized inputs); 'fallback': every format kept
    in the portable layout and run as dequantized tiles + a dense matmul."""
    if request.param == "fallback":
        monkeypatch.setattr(kernels, "int4_backend", lambda *a, **k: "portable")
        monkeypatch.setattr(kernels, "int8_row_kernel", lambda *a, **k: False)
    return request.param


def _linear(n_out: int, n_in: int, bias: bool = True) -> nn.Linear:
    lin = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        lin.weight[3, :7] = 0.9  # an outlier row
    return lin


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 40])  # 40: above DENSE_FROM_ROWS, the dequantized path
def test_linear_equals_matmul_with_own_dequantized_weight(path, fmt, dtype, rows):
    cls, kw = FORMATS[fmt]
    module = cls.from_linear(_linear(192, 256), **kw)
    backend = getattr(module.packed, "backend", None)
    if path == "kernel" and fmt.startswith("int4"):
        assert backend == "cpu"
    if path == "fallback":
        assert getattr(module.packed, "halves", None) is None and backend in (None, "portable")
    w = module.dequantize(torch.float32)
    x = torch.randn(2, rows, 256).to(dtype)
    y = module(x.clone())
    expected = x.float() @ w.t() + module.bias.float()
    assert y.dtype == dtype and y.shape == (2, rows, 192)
    # the kernels compute in bfloat16 activations: compare at that precision
    tol = 2e-2 if dtype == torch.bfloat16 or (path == "kernel" and rows < kernels.DENSE_FROM_ROWS["cpu"]) else 1e-5
    torch.testing.assert_close(y.float(), expected, atol=tol * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 32), (8, None)])
def test_embedding_dequantizes_only_looked_up_rows(path, bits, group):
    emb = nn.Embedding(320, 64)
    q = QuantEmbedding.from_embedding(emb, bits, group, symmetric=bits == 8, dtype=torch.float32)
    table = q.packed.dequantize(torch.float32)
    ids = torch.tensor([[0, 5, 319], [17, 17, 64]])
    torch.testing.assert_close(q(ids), table[ids], atol=0, rtol=0)
    w = emb.weight.detach()
    assert float((table - w).abs().max()) < 0.25 * float(w.abs().max())


def test_tied_head_shares_the_embedding_table():
    from llmcli.quant.modules import linear_class

    q = QuantEmbedding.from_embedding(nn.Embedding(320, 64), 8, 32, dtype=torch.float32)
    head = linear_class(8)(q.packed)
    h = torch.randn(1, 1, 64)
    expected = h @ q.packed.dequantize().t()
    torch.testing.assert_close(head(h), expected, atol=2e-2 * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("N", [16, 64, 112, 192, 320])
def test_cpu_int4_layout_reads_back(N):
    layout = kernels.cpu_int4_layout()
    if layout is None:
        pytest.skip("this PyTorch build has no known CPU int4 layout")
    codes = torch.randint(0, 16, (N, 96), dtype=torch.uint8)
    packed = kernels.cpu_int4_pack(codes)
    assert torch.equal(kernels.cpu_int4_codes_t(packed, N, 96), codes.t())
    ids = torch.tensor([0, N - 1, N // 2, 1, N // 3])
    assert torch.equal(kernels.cpu_int4_rows(packed, N, 96, ids), codes[ids])
    block = layout[0]
    if N > block:  # a tile starting at a block boundary
        assert torch.equal(kernels.cpu_int4_codes_t(packed, N, 96, block, N), codes[block:].t())


def test_portable_state_survives_the_device_layout():
    """What a checkpoint stores comes back unchanged from every packed form."""
    from llmcli.quant.primitives import pack_int4, quantize

    w = torch.randn(80, 128)
    q4, q8 = quantize(w, 4, 32, symmetric=False), quantize(w, 8, 32)
    for weight, q in ((Int4Weight(pack_int4(q4.codes), q4.scales, q4.zeros, CPU), q4),
                      (Int8Weight(q8.codes, q8.scales, CPU), q8)):
        state = weight.state()
        expected = pack_int4(q.codes) if q.bits == 4 else q.codes
        assert torch.equal(state["qweight"], expected) and torch.equal(state["scales"], q.scales)
        if q.zeros is not None:
            assert torch.equal(state["zeros"], q.zeros)


def test_kernel_choice_by_rows():
    assert kernels.use_kernel(CPU, 1)
    assert not kernels.use_kernel(CPU, kernels.DENSE_FROM_ROWS["cpu"])
    assert kernels.int4_backend(CPU, 100, 64, 32, False) == "portable"  # N not a multiple of 16
    assert kernels.int4_backend(CPU, 64, 96, 64, False) == "portable"  # group does not divide K


@pytest.mark.parametrize("sizes", [(64, 32, 32), (128, 64, 64)])
@pytest.mark.parametrize("bits,group", [(4, 32), (8, 32), (8, None)])
def test_concat_of_quantized_linears_equals_their_outputs_side_by_side(bits, group, sizes):
    """Fusion (q/k/v, gate/up) stacks packed rows: the fused output is exactly the parts', whether
    the CPU layout's bytes concatenate (whole row blocks) or go through the portable form."""
    from llmcli.quant.modules import Int4Linear, Int8Linear

    torch.manual_seed(0)
    parts = [torch.nn.Linear(64, n, bias=True) for n in sizes]
    cls = Int4Linear if bits == 4 else Int8Linear
    mods = [cls.from_linear(p, group_size=group, search=False) for p in parts]
    fused = cls.concat(mods)
    for rows in (3, 40):  # the kernel, and dense tiles read back from the fused layout
        x = torch.randn(rows, 64, dtype=torch.bfloat16)
        torch.testing.assert_close(fused(x), torch.cat([m(x) for m in mods], dim=-1), atol=0, rtol=0)
    torch.testing.assert_close(fused.dequantize(), torch.cat([m.dequantize() for m in mods]), atol=0, rtol=0)
    layout = kernels.cpu_int4_layout()
    if sizes == (128, 64, 64) and layout is not None and (bits == 4 or group):
        assert type(mods[0].packed).stacked([m.packed for m in mods]) is not None  # no unpack and repack
    other = Int8Linear.from_linear(parts[0], search=False) if bits == 4 else Int4Linear.from_linear(parts[0], search=False)
    assert cls.concat([mods[0], other]) is None  # different formats do not fuse


def test_cpu_int4_pack_in_slices_equals_one_pack(monkeypatch):
    """Packing whole row blocks at a time (less memory) gives the kernel's bytes for the whole weight."""
    if kernels.cpu_int4_layout() is None:
        pytest.skip("no CPU int4 kernel here")
    for N, K in ((1008, 576), (176, 64)):
        codes = torch.randint(0, 16, (N, K), dtype=torch.int32)
        whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        monkeypatch.setattr(kernels, "PACK_ELEMENTS", 64 * K * 2)  # slices of 128 rows
        assert torch.equal(kernels.cpu_int4_pack(codes).view(-1), whole.view(-1))
