"""K-quant GGUF files (Q4_K_M, Q5_K_M mixes as llama.cpp writes them) load packed, exactly, at about
their file size, and match transformers' float32 logits; the block formats agree with gguf-py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny import k_mix, reference_from, write_gguf

from benchmarks.gguf_blocks import quantize

TYPES = ["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"]
BF16 = torch.bfloat16


def _ggml(type_name: str):
    import gguf

    return gguf.GGMLQuantizationType[type_name]


def _weights(N=64, K=512, seed=0):
    return np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32) * 0.05


@pytest.mark.parametrize("type_name", TYPES)
def test_test_encoders_write_blocks_gguf_reads_back(type_name):
    from gguf.quants import dequantize

    x = _weights()
    back = dequantize(quantize(x, type_name), _ggml(type_name)).reshape(x.shape)
    bits = {"Q4_K": 4, "Q5_K": 5, "Q6_K": 6, "Q5_0": 5, "Q5_1": 5}[type_name]
    assert np.abs(back - x).max() < 0.25 * 2.0 ** (4 - bits)  # right layout: the error of its bit width


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
@pytest.mark.parametrize("type_name", ["Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q8_0", "Q4_K"])
def test_blocks_dequantize_and_multiply_as_gguf_py_reads_them(type_name, kernel, monkeypatch):
    from gguf.quants import dequantize

    from llmcli import native
    from llmcli.quant.gguf_blocks import INT8_DOT_TYPES, TYPE_IDS, GGUFBlockWeight

    if kernel and type_name in INT8_DOT_TYPES and native.available():  # every variant, the portable one too
        pytest.skip("int8 activations: test_int8_dot_kernel_multiplies_as_llama_cpp_does, test_native_variants.py")
    if kernel and native.available() and native.module().grouped_takes(TYPE_IDS[type_name], 64):  # Q5_K, x86
        pytest.skip(f"int8 activations on {native.module().variant}: test_native_variants.py's row-group test")
    if not kernel:
        monkeypatch.setattr(native, "_module", False)
    elif not native.available():
        pytest.skip("no C++ compiler: the kernel cannot be built here")
    x = _weights()
    blocks = quantize(x, type_name)
    ref = torch.from_numpy(dequantize(blocks, _ggml(type_name)).reshape(x.shape))
    w = GGUFBlockWeight.from_blocks(torch.from_numpy(blocks.copy()), type_name, torch.device("cpu"))
    assert torch.equal(w.dequantize(torch.float32), ref)  # nothing rounded
    assert torch.equal(w.rows(torch.tensor([5, 0, 63]), torch.float32), ref[[5, 0, 63]])
    a = torch.randn(3, 512)
    torch.testing.assert_close(w.matmul(a), a @ ref.T, rtol=1e-5, atol=1e-5)  # decode: the kernel
    a = torch.randn(40, 512, dtype=BF16)
    torch.testing.assert_close(w.matmul(a), a @ ref.T.to(BF16), rtol=0, atol=0)  # prefill: dequantized tile


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_0", "Q5_1"])
def test_int8_dot_kernel_multiplies_as_llama_cpp_does(type_name):
    """Q4_0/Q4_1/Q8_0 blocks against activations quantized to int8 per 32 (d = max|x| / 127, as
    llama.cpp's Q8_0/Q8_1): the kernel's integer dot products equal float64 arithmetic on those."""
    from gguf.quants import dequantize

    from llmcli import native
    from llmcli.quant.gguf_blocks import GGUFBlockWeight

    if not native.int8_dot():
        pytest.skip("no AVX2 block kernel here: these types use the int4 / int8 kernels")
    # one activation row takes 32-blocks four at a time: K = 544 leaves one over
    for K in (512,) if type_name.endswith("_K") else (512, 544):
        x = _weights(N=96, K=K)
        blocks = quantize(x, type_name)
        ref = dequantize(blocks, _ggml(type_name)).reshape(x.shape).astype(np.float64)
        w = GGUFBlockWeight.from_blocks(torch.from_numpy(blocks.copy()), type_name, torch.device("cpu"))
        assert torch.equal(w.dequantize(torch.float32), torch.from_numpy(ref).float())
        for M in (1, 3, 4, 9):  # the kernel takes activation rows 4 at a time, then one by one
            a = np.random.default_rng(M).standard_normal((M, K)).astype(np.float32)
            blocks_a = a.reshape(M, -1, 32)
            d = np.abs(blocks_a).max(-1, keepdims=True) / 127
            a_hat = (np.round(blocks_a / d) * d).reshape(M, K).astype(np.float64)
            got = w.matmul(torch.from_numpy(a)).double().numpy()
            np.testing.assert_allclose(got, a_hat @ ref.T, rtol=1e-4, atol=1e-4 * np.abs(a_hat @ ref.T).max())
            assert np.abs(got - a @ ref.T).max() < 0.02 * np.abs(a @ ref.T).max()  # and close to float activations


def test_q4_k_imports_as_int4_g32_rounding_only_the_scales():
    from gguf.quants import dequantize

    from llmcli.quant.gguf_import import AS_STORED, import_block_quants
    from llmcli.quant.packed import Int4Weight

    x = _weights()
    raw = quantize(x, "Q4_K")
    ref = torch.from_numpy(dequantize(raw, _ggml("Q4_K")).reshape(x.shape))
    q = import_block_quants(raw, "Q4_K", 64, 512, AS_STORED["Q4_K"])
    exact = (q["codes"].float() - 8).view(64, -1, 32) * q["scales"][..., None] + q["zeros"][..., None]
    torch.testing.assert_close(exact.view(64, 512), ref, rtol=0, atol=1e-6)  # the codes map exactly
    w = Int4Weight.from_codes(q["codes"], q["scales"], q["zeros"], torch.device("cpu"))
    step = q["scales"].abs().max().item()
    assert (w.dequantize(torch.float32) - ref).abs().max() < step / 16  # bfloat16 scales and zeros only


def _tiny_qwen2(tied=True):
    from tiny import hf_model

    # rows of 256 take K-quants; the MLP's down projection (rows of 320) falls back to 32-blocks
    return hf_model("qwen2", hidden_size=256, intermediate_size=320, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, tie_word_embeddings=tied)


@pytest.fixture(scope="module", params=["Q4_K", "Q5_K"], ids=["Q4_K_M", "Q5_K_M"])
def mixed_gguf(request, tmp_path_factory):
    model = _tiny_qwen2()
    path = tmp_path_factory.mktemp("kq") / f"tiny-{request.param}.gguf"
    held = write_gguf(model, path, k_mix(4, tied=True, base=request.param))
    return path, reference_from(model, held), request.param


def _forward(model, ids, dtype: torch.dtype) -> torch.Tensor:
    from llmcli.cache.static import StaticKVCache

    return model(ids, StaticKVCache.for_model(model.args, 64, torch.device("cpu"), dtype))[0].float()


def test_a_q4_k_m_qwen2_loads_packed_and_matches_transformers(mixed_gguf):
    """issue 11: layers whose attn_v is Q6_K (and q/k biases beside packed weights) loaded by default."""
    from llmcli.quant.presets import load_preset
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    path, ref, base = mixed_gguf
    ids = torch.tensor([[5, 17, 80, 3, 200, 41, 9, 150]])
    with torch.no_grad():
        expected = ref(ids).logits.float()
    # --quant f32 dequantizes (the reference mode); float32 and bfloat16 keep the blocks: activations in
    # their dtype, and int8 per 32 where the kernel has integer dot products
    full = load_model(path, place("cpu", "float32", threads=1), load_preset("f32"))
    with torch.no_grad():
        got = _forward(full.model, ids, torch.float32)
    assert (got - expected).abs().max().item() < 1e-4 * expected.abs().max().item()
    for dtype, tol in ((torch.float32, 0.1), (BF16, 0.1)):
        loaded = load_model(path, place("cpu", str(dtype).removeprefix("torch."), threads=1))
        with torch.no_grad():
            got = _forward(loaded.model, ids, dtype)
        assert (got - expected).abs().max().item() < tol * expected.abs().max().item(), dtype


def test_every_weight_stays_packed_and_blocks_where_the_kernels_multiply_them(mixed_gguf, cpu_kind):
    """By default every 2-D weight stays packed (nothing dequantized to bfloat16), the 5/6-bit ones as
    blocks; Q8_0 and Q4_K ones too where the kernels have integer dot products (all variants but the
    portable one), else as int8 / int4 for torch's kernels. Chosen at load: no kernel runs."""
    from llmcli.quant.modules import GGUFBlockLinear, QuantEmbedding
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    path, _, base = mixed_gguf
    modules = list(load_model(path, place("cpu", "bfloat16", threads=1)).model.modules())
    assert not any(isinstance(m, (torch.nn.Linear, torch.nn.Embedding)) for m in modules)
    blocks = {m.packed.type_name for m in modules if isinstance(m, GGUFBlockLinear)}
    int8_dot = ({"Q8_0", "Q4_K"} if base == "Q4_K" else {"Q8_0"}) if cpu_kind.name != "old" else set()
    assert blocks == ({"Q5_0", "Q6_K"} if base == "Q4_K" else {"Q5_K", "Q5_1", "Q6_K"}) | int8_dot
    assert any(isinstance(m, QuantEmbedding) for m in modules)


def test_packed_blocks_give_the_logits_of_their_dequantized_weights(mixed_gguf):
    """Default load (packed, fused as runtime.py fuses), in float32 and in bfloat16, vs the same file
    dequantized to float32 (--quant f32, the reference mode) and to bfloat16 (--quant bf16).

    The bounds are the arithmetic's, not the CPU's. Where the kernel has integer dot products,
    activations go in as int8 per block of 32 (llama.cpp's scale max|x|/127): each matmul input moves
    by up to 0.4% of its block's largest value, which through these 4 random layers and the head
    measured 1.5-3.4% of the largest logit. bfloat16 activations add their own 8-bit rounding: the
    dequantized model alone in bfloat16 measured 2.3-2.9% off float32 (on AVX-512 BF16 and AVX2
    CPUs alike, since bf16 matmuls round their inputs either way). Together: 2.9-6.6%."""
    from llmcli.cache.static import StaticKVCache
    from llmcli.quant.presets import load_preset
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    path = mixed_gguf[0]
    ids = torch.tensor([[5, 17, 80, 3, 200, 41, 9, 150]])
    with torch.no_grad():
        reference = _forward(load_model(path, place("cpu", "float32", threads=1), load_preset("f32")).model, ids,
                             torch.float32)
        dense = _forward(load_model(path, place("cpu", "bfloat16", threads=1), load_preset("bf16")).model, ids, BF16)
        exact = _forward(load_model(path, place("cpu", "float32", threads=1)).model.fuse(), ids, torch.float32)
        packed = load_model(path, place("cpu", "bfloat16", threads=1)).model.fuse()
        got = _forward(packed, ids, BF16)
        step = packed(ids[:, :1], StaticKVCache.for_model(packed.args, 8, torch.device("cpu"), BF16))[0].float()
    top = reference.abs().max()
    assert (exact - reference).abs().max() < 0.05 * top  # int8 activations alone
    assert (got - reference).abs().max() < 0.10 * top  # int8 and bfloat16 activations
    assert torch.equal(got.argmax(-1), dense.argmax(-1))
    torch.testing.assert_close(step[0, 0], got[0, 0], rtol=0.02, atol=0.02 * got.abs().max().item())


def test_held_bytes_are_the_plan_and_about_the_file_size(mixed_gguf):
    from llmcli.bench.measure import weights_bytes
    from llmcli.formats.gguf import open_gguf
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model
    from llmcli.runtime.probe import weights_from_files

    path = mixed_gguf[0]
    loaded = load_model(path, place("cpu", "bfloat16", threads=1))
    plan = weights_from_files(path, None, BF16, torch.device("cpu"))
    held = weights_bytes(loaded.model)
    assert plan.nbytes == held
    file_tensors = sum(t.n_bytes for t in open_gguf(path).tensors)
    assert held <= 1.15 * file_tensors


def test_released_pages_of_the_map_read_back_the_same(mixed_gguf):
    """GGUFFile.release_pages drops whole pages of the map inside a range (the file's, never written):
    what is read there afterwards is the file's bytes again; a range outside the map is refused and
    left alone (an array in the process's own memory would be zeroed)."""
    from llmcli.formats.gguf import open_gguf

    reader = open_gguf(mixed_gguf[0])
    t = max(reader.tensors, key=lambda t: t.n_bytes)
    data = t.data
    before = np.array(data)  # a copy in anonymous memory
    assert reader.release_pages(data.ctypes.data, data.nbytes)
    assert np.array_equal(data, before)
    assert not reader.release_pages(before.ctypes.data, before.nbytes) and before.any()
