"""Every kernel variant this CPU runs (llmcli/native: avx512vnni, avxvnni, avx2, neon, portable),
each block type: dequantization equals gguf-py's bit for bit, activations quantize to the bytes
llama.cpp's formula gives, and the integer dot products equal float64 arithmetic on those same int8
activations. A variant this CPU cannot run is skipped, naming the missing flag or the machine."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmarks.gguf_blocks import quantize
from llmcli import native
from llmcli.native.build import VARIANTS
from llmcli.quant.gguf_blocks import BLOCKS, TYPE_IDS

INT8_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K", "MXFP4"]
# where each type keeps its float16 scales (offsets in a block): random bytes there could be inf or NaN
HALVES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2),
          "Q6_K": (208,)}


@pytest.fixture(params=list(VARIANTS))
def kernels(request):
    reason = native.why_not(request.param)
    if reason is not None:
        pytest.skip(reason)
    return native.load(request.param)


def _ggml(type_name: str):
    import gguf

    return gguf.GGMLQuantizationType[type_name]


def _blocks(type_name: str, N: int, K: int, seed: int, raw: bool) -> np.ndarray:
    """(N, row bytes): a quantized random matrix, or random bytes with sane scales (every code value,
    Q8_0's -128 and Q6_K's extremes included)."""
    rng = np.random.default_rng(seed)
    if type_name == "MXFP4":  # every code, and e8m0 exponents 2^-12 .. 2^2 (the ones gpt-oss's experts have)
        b = rng.integers(0, 256, (N, K // 32, 17), dtype=np.uint8)
        b[..., 0] = rng.integers(115, 130, (N, K // 32))
        return b.reshape(N, -1)
    if not raw:
        return quantize(rng.standard_normal((N, K)).astype(np.float32) * 0.05, type_name)
    size, nbytes = BLOCKS[type_name]
    b = rng.integers(0, 256, (N, K // size, nbytes), dtype=np.uint8)
    for at in HALVES[type_name]:
        scale = (rng.uniform(0.002, 0.02, (N, K // size)) * rng.choice([-1, 1], (N, K // size))).astype(np.float16)
        b[..., at:at + 2] = scale.view(np.uint8).reshape(N, K // size, 2)
    return b.reshape(N, -1)


def _reference_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's Q8 activations in float32 numpy: per 32, d = max|x| / 127, q = rint(x * (1 / d))."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = np.abs(blocks).max(-1) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    return np.rint(blocks * inv[..., None]).astype(np.int8).reshape(x.shape), d.astype(np.float32)


def test_activations_quantize_to_llama_cpp_s_bytes(kernels):
    x = np.random.default_rng(1).standard_normal((5, 544)).astype(np.float32)
    x[2, :32] = 0  # a block of zeros: scale 0, codes 0
    x[3, 40] = 1e4  # one large value: the rest of its block rounds to 0
    q, d, s = kernels.quantize_rows(torch.from_numpy(x))
    want_q, want_d = _reference_activations(x)
    assert np.array_equal(q.numpy(), want_q) and np.array_equal(d.numpy(), want_d)
    sums = want_q.reshape(5, -1, 32).astype(np.int64).sum(-1)
    assert np.array_equal(s.numpy(), want_d * sums.astype(np.float32))


@pytest.mark.parametrize("raw", [False, True], ids=["quantized", "random-bytes"])
@pytest.mark.parametrize("type_name", INT8_TYPES)
def test_int8_dot_products_equal_float64_on_the_same_activations(kernels, type_name, raw):
    from gguf.quants import dequantize

    type_id = TYPE_IDS[type_name]
    # 32-blocks go eight (AVX-512) or four at a time: K = 544 leaves one over, 416 five, 96 is three
    # blocks in all; K-quants: one and three 256-blocks
    for K in (256, 768) if type_name.endswith("_K") else (512, 544, 416, 96):
        blocks = _blocks(type_name, 70, K, seed=K, raw=raw)
        w = dequantize(blocks, _ggml(type_name)).reshape(70, K).astype(np.float64)
        b = torch.from_numpy(blocks.copy())
        assert torch.equal(kernels.dequantize(b, type_id, K), torch.from_numpy(w).float())  # nothing rounded
        for M in (1, 3, 4, 9):  # one row, and rows 4 at a time (AVX2), then one by one
            x = torch.randn(M, K, generator=torch.Generator().manual_seed(M))
            q, d, _ = kernels.quantize_rows(x)
            x_hat = (q.double().view(M, -1, 32) * d.double()[..., None]).view(M, K).numpy()
            want = x_hat @ w.T
            got = kernels.mm(x, b, type_id, K).double().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4"])
def test_row_group_kernels_equal_float64_and_give_each_row_what_it_gets_alone(kernels, type_name):
    """The kernels a decode step takes on its copy of the weights interleaved in groups of rows (16
    with AVX-512, 8 with AVX2 and AVX-VNNI): the float64 products of the same int8 activations, and
    each activation row's values those of that row alone, whatever rows come with it (1, 3, 8 and 9
    and 17 over tiles)."""
    from gguf.quants import dequantize

    type_id = TYPE_IDS[type_name]
    size, nbytes = BLOCKS[type_name]
    R = kernels.group_rows
    if R == 0:
        pytest.skip(f"the {kernels.variant} kernels have no row-group layout (x86's)")
    assert kernels.mm_grouped(torch.zeros(1, size), torch.zeros(R, nbytes, dtype=torch.uint8), type_id, size) is not None
    assert kernels.mm_grouped(torch.zeros(1, size), torch.zeros(R // 2, nbytes, dtype=torch.uint8), type_id, size) is None
    for raw in (False, True):
        for K in (256, 768) if type_name.endswith("_K") else (512, 544, 96):
            blocks = _blocks(type_name, 48, K, seed=K, raw=raw)
            w = dequantize(blocks, _ggml(type_name)).reshape(48, K).astype(np.float64)
            b = torch.from_numpy(blocks.copy())
            x = torch.randn(17, K, generator=torch.Generator().manual_seed(K))
            q, d, _ = kernels.quantize_rows(x)
            want = (q.double().view(17, -1, 32) * d.double()[..., None]).view(17, K).numpy() @ w.T
            alone = torch.cat([kernels.mm_grouped(x[i:i + 1], b, type_id, K) for i in range(17)])
            np.testing.assert_allclose(alone.double().numpy(), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
            for M in (3, 8, 9, 17):
                assert torch.equal(kernels.mm_grouped(x[:M], b, type_id, K), alone[:M]), (raw, K, M)


def _reference_pairs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """int8x2 activations in float32 numpy (blocks.h's quantize_pair_scalar): per 32, 16-bit codes
    v = rint(x / e), e = max|x| / 127 / 256, split into a high byte h = floor((v + 128) / 256) and a low
    one l = v - 256 h clamped to -127. Returns h, l (M, K) int8, e (M, K/32) and the sums 256 h + l."""
    blocks = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    e = (np.abs(blocks).max(-1) / np.float32(127) * np.float32(1 / 256)).astype(np.float32)
    inv = np.where(e > 0, np.float32(1) / np.where(e > 0, e, 1), 0).astype(np.float32)
    v = np.clip(np.rint(blocks * inv[..., None]), -32512, 32512).astype(np.int64)
    h = (v + 128) >> 8
    l = np.maximum(v - 256 * h, -127)
    return (h.astype(np.int8).reshape(x.shape), l.astype(np.int8).reshape(x.shape), e,
            (256 * h + l).sum(-1))


def test_refined_activations_quantize_to_the_same_bytes_on_every_variant(kernels):
    """int8x2: each row's high codes, then its low ones, with d = 256 e and e, and s = e * the 16-bit
    codes' sum on the high row (0 on the low one): numpy's bytes, on every variant."""
    x = np.random.default_rng(2).standard_normal((5, 544)).astype(np.float32)
    x[2, :32] = 0  # a block of zeros: scale 0, codes 0
    x[3, 40] = 1e4  # one large value: the rest of its block rounds to 0
    x[4, 64:96] = np.linspace(-1, 1, 32)  # ties and lows of -128 (clamped to -127) among them
    q, d, s = kernels.quantize_rows(torch.from_numpy(x), refined=True)
    h, l, e, sums = _reference_pairs(x)
    assert np.array_equal(q.numpy()[0::2], h) and np.array_equal(q.numpy()[1::2], l)
    assert np.array_equal(d.numpy()[0::2], np.float32(256) * e) and np.array_equal(d.numpy()[1::2], e)
    assert np.array_equal(s.numpy()[0::2], e * sums.astype(np.float32)) and not s.numpy()[1::2].any()
    assert (q.numpy() >= -127).all() and np.abs(q.numpy()[1::2]).max() > 100


def _refined_activations(x: np.ndarray) -> np.ndarray:
    """int8x2 activations as float64: the values e * (256 h + l) the kernels multiply for a refined row."""
    h, l, e, _ = _reference_pairs(x)
    v = 256 * h.astype(np.int64) + l
    return (v.reshape(x.shape[0], -1, 32) * e[..., None].astype(np.float64)).reshape(x.shape)


@pytest.mark.parametrize("type_name", INT8_TYPES)
def test_refined_activations_multiply_as_float64_on_their_two_rows_much_nearer_the_floats(kernels, type_name):
    """int8x2 (a preset's `activations`): every integer route (the blocks as stored, one row or
    several, and the row-group kernels a decode step takes) equals float64 on each row's codes plus
    its residual's, and lands at least 10 times nearer the float activations' products than int8
    does; each row's values as alone, whatever rows come with it."""
    from gguf.quants import dequantize

    type_id = TYPE_IDS[type_name]
    for K in (256, 768) if type_name.endswith("_K") else (544, 96):
        blocks = _blocks(type_name, 48, K, seed=K, raw=False)
        w = dequantize(blocks, _ggml(type_name)).reshape(48, K).astype(np.float64)
        b = torch.from_numpy(blocks.copy())
        x = torch.randn(9, K, generator=torch.Generator().manual_seed(K))
        x[2, 5] = 40.0  # an outlier: its block's int8 codes coarse, the residual's fine
        want = _refined_activations(x.numpy()) @ w.T
        exact = x.double().numpy() @ w.T
        int8 = kernels.mm(x, b, type_id, K).double().numpy()
        routes = {"stored": kernels.mm(x, b, type_id, K, refined=True),
                  "stored, alone": torch.cat([kernels.mm(x[i:i + 1], b, type_id, K, refined=True) for i in range(9)])}
        if kernels.group_rows:
            routes["grouped"] = kernels.mm_grouped(x, b, type_id, K, refined=True)
            alone = torch.cat([kernels.mm_grouped(x[i:i + 1], b, type_id, K, refined=True) for i in range(9)])
            assert torch.equal(routes["grouped"], alone), (type_name, K)
        for route, got in routes.items():
            got = got.double().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max(), err_msg=route)
            assert 10 * np.abs(got - exact).max() < np.abs(int8 - exact).max(), (route, K)


def test_refined_activations_leave_the_float_routes_as_they_are(kernels):
    """F16/BF16 rows and Q5_K as stored take the activations as floats: refined or not, the same."""
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(1))
    q5k = torch.from_numpy(_blocks("Q5_K", 36, 512, seed=3, raw=False).copy())
    rows, _ = _half_rows("F16", 36, 512, seed=4)
    for b, type_name in ((q5k, "Q5_K"), (rows, "F16")):
        assert torch.equal(kernels.mm(x, b, TYPE_IDS[type_name], 512, refined=True),
                           kernels.mm(x, b, TYPE_IDS[type_name], 512))


def _half_rows(type_name: str, N: int, K: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """(N, 2K) uint8 rows of F16 or BF16 (every exponent F16 has that a weight may take, subnormals and
    zeros among them), and their values in float64."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((N, K)) * np.exp2(rng.integers(-20, 4, (N, K)))
    w[rng.random((N, K)) < 0.05] = 0.0
    t = torch.from_numpy(w).to(torch.float16 if type_name == "F16" else torch.bfloat16)
    return t.view(torch.uint8).contiguous(), t.double().numpy()


@pytest.mark.parametrize("type_name", ["F16", "BF16"])
def test_half_rows_take_float32_activations_and_give_each_row_what_it_gets_alone(kernels, type_name):
    """F16 and BF16 rows times float32 activations (no int8): float64's products within float32
    rounding; each activation row's values bit for bit those it gets alone, whether the weights stream
    (a few rows: decode) or are tiled (a prompt: converted once, micro-tiles of several rows), and
    whatever range of weight rows a thread takes. The rows dequantize exactly."""
    type_id = TYPE_IDS[type_name]
    for N, K in ((70, 576), (37, 1536), (9, 104), (5, 40)):  # K % 16: 0, 0, 8, 8 (vector tails)
        rows, w = _half_rows(type_name, N, K, seed=K)
        assert torch.equal(kernels.dequantize(rows, type_id, K).double(), torch.from_numpy(w))
        x = torch.randn(130, K, generator=torch.Generator().manual_seed(N))
        want = x.double().numpy() @ w.T
        alone = torch.cat([kernels.mm(x[i:i + 1], rows, type_id, K) for i in range(130)])
        bound = 4e-7 * K * (np.abs(x.double().numpy()) @ np.abs(w).T)  # float32 sums of K products
        assert (np.abs(alone.double().numpy() - want) <= bound + 1e-30).all()
        for M in (2, 3, 7, 8, 13, 100, 130):  # streamed (up to 12 rows on AVX-512), tiled beyond
            assert torch.equal(kernels.mm(x[:M], rows, type_id, K), alone[:M]), (N, K, M)
        assert torch.equal(kernels.mm(x[:50], rows[3:], type_id, K), alone[:50, 3:])  # rows from another start


def test_q5_k_takes_the_float_route(kernels):
    from gguf.quants import dequantize

    blocks = _blocks("Q5_K", 36, 512, seed=3, raw=False)  # (not whole groups of rows: no int8 kernels)
    w = dequantize(blocks, _ggml("Q5_K")).reshape(36, 512).astype(np.float64)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
    got = kernels.mm(x, torch.from_numpy(blocks.copy()), TYPE_IDS["Q5_K"], 512).double().numpy()
    np.testing.assert_allclose(got, x.double().numpy() @ w.T, rtol=1e-5, atol=1e-5)


def test_rows_that_do_not_hold_k_weights_are_refused(kernels):
    b = torch.zeros(4, 20, dtype=torch.uint8)  # one Q4_1 block a row: K = 32
    with pytest.raises(ValueError):
        kernels.mm(torch.randn(1, 64), b, TYPE_IDS["Q4_1"], 64)


@pytest.mark.parametrize("B,H,KV,S,D", [(1, 9, 3, 70, 64), (2, 4, 4, 1, 64), (2, 6, 3, 17, 80), (1, 4, 2, 33, 128),
                                         (1, 14, 2, 41, 64), (1, 4, 1, 9, 256)])
def test_one_query_attention_equals_sdpa(kernels, B, H, KV, S, D):
    g = torch.Generator().manual_seed(S * D + B)
    q = torch.randn(B, H, 1, D, generator=g)
    cache_k, cache_v = torch.randn(2, B, KV, S + 5, D, generator=g)
    k, v = cache_k[:, :, :S], cache_v[:, :, :S]  # strided views, as the KV cache hands them out
    mask = torch.rand(B, S, generator=g) > 0.4
    mask[:, 0] = True
    for m in (None, mask):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=None if m is None else m[:, None, None, :],
                                             scale=0.3, enable_gqa=H != KV)
        torch.testing.assert_close(kernels.attend_one(q, k, v, m, 0.3), ref, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("D", [64, 72, 256])
def test_query_heads_sharing_a_key_head_get_what_each_gets_alone(kernels, D):
    """Grouped-query attention takes up to four query heads of a key head at once (each key and value
    row read once for them); each head's numbers are exactly those it gets alone."""
    B, H, KV, S = 2, 14, 2, 37
    g = torch.Generator().manual_seed(D)
    q = torch.randn(B, H, 1, D, generator=g)
    k, v = torch.randn(2, B, KV, S, D, generator=g)
    grouped = kernels.attend_one(q, k, v, None, 0.125)
    alone = kernels.attend_one(q, k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1), None, 0.125)
    assert torch.equal(grouped, alone)


def test_without_a_compiler_one_warning_and_the_torch_path(monkeypatch, tmp_path):
    import warnings

    from llmcli.errors import LlmcliWarning
    from llmcli.native import library

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(library, "cache_dir", lambda: tmp_path)  # nothing built there
    monkeypatch.setattr(library, "installed", lambda variant: tmp_path / "none.so")
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_loaded", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not native.available() and native.variant() is None and not native.int8_dot()
    assert [str(w.message) for w in caught if w.category is LlmcliWarning] == [
        "no C++ compiler found (install g++ or clang++, or set CXX); the GGUF kernels take the slower torch path"]


def test_builds_of_other_sources_are_pruned_beyond_the_newest_few(tmp_path):
    """Two installs sharing the user cache keep their own builds; older ones beyond KEPT go."""
    import os

    from llmcli.native import library

    name = "libllmcli-avx2.so"
    paths = [tmp_path / f"{i:04x}-{name}" for i in range(6)]
    for age, p in enumerate(reversed(paths)):
        p.write_bytes(b"x")
        os.utime(p, (1000 - age, 1000 - age))  # paths[5] newest
    (tmp_path / "0000-libllmcli-neon.so").write_bytes(b"x")  # another variant: untouched
    library._prune(paths[-1], name)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([p.name for p in paths[-library.KEPT:]] + ["0000-libllmcli-neon.so"])


def test_an_installed_library_of_older_sources_is_passed_over(tmp_path, monkeypatch):
    """A library beside the sources built from other ones (an upgrade without a rebuild) lacks newer
    functions: it is recognized by its source hash alone and the cache's build is used instead."""
    import shutil
    import subprocess

    from llmcli.native import build, library

    if native.variant() is None or shutil.which("c++") is None:
        pytest.skip("no kernels or no C++ compiler here")
    old = tmp_path / build.library_name(native.variant())
    src = tmp_path / "old.cpp"
    src.write_text('extern "C" const char* llmcli_source_hash() { return "older"; }\n'
                   'extern "C" const char* llmcli_variant() { return "avx2"; }\n')
    subprocess.run(["c++", "-shared", "-fPIC", str(src), "-o", str(old)], check=True)
    monkeypatch.setattr(library, "installed", lambda variant: old)
    # the cache's build, made already (the one in use, copied where find() looks): nothing compiles again
    monkeypatch.setattr(library, "cache_dir", lambda: tmp_path / "cache")
    built = tmp_path / "cache" / f"{build.source_hash(native.variant())}-{build.library_name(native.variant())}"
    built.parent.mkdir()
    shutil.copy(native.module().path, built)
    k = library.find(native.variant())
    assert k.path != old and k.source_hash == build.source_hash(native.variant())
    assert library._source_hash(old) == "older" and library._source_hash(src) is None


def test_top_k_equals_torch_s(kernels):
    """Sampling's top-k: the k largest, largest first; equal values in index order; NaN as largest."""
    g = torch.Generator().manual_seed(5)
    for n in (3, 17, 49152):
        x = torch.randn(n, generator=g)
        for k in {1, 2, min(8, n), min(40, n), n}:
            values, indices = kernels.top_k(x, k)
            want = x.topk(k)
            assert torch.equal(values, want.values) and torch.equal(x[indices], values)
            # equal values in index order; torch.topk leaves ties unordered (49152 normals hold a few)
            ties = values[1:] == values[:-1]
            assert bool((indices[1:][ties] > indices[:-1][ties]).all())
            assert torch.equal(indices.sort().values, want.indices.sort().values)
    # long rows (a floor from chunks' maxima first): ties at the top, NaNs, masked, all equal
    ties = (torch.randn(49152, generator=g) * 2).round() / 2  # hundreds of equal values at each top value
    nans = torch.randn(49152, generator=g)
    nans[[7, 30000, 49151]] = float("nan")
    masked = torch.full((49152,), float("-inf"))
    masked[[5, 17000, 40000]] = torch.tensor([1.0, 3.0, 2.0])
    for x in (ties, nans, masked, torch.zeros(49152)):
        for k in (1, 2, 8, 40, 300):
            values, indices = kernels.top_k(x, k)
            mapped = np.nan_to_num(x.numpy(), nan=np.inf, posinf=np.inf, neginf=-np.inf)
            order = np.lexsort((np.arange(len(x)), -mapped))[:k]  # larger first, then the earlier index
            assert indices.tolist() == order.tolist(), k
            assert torch.equal(values.nan_to_num(), x[indices].nan_to_num())
    x = torch.tensor([1.0, 3.0, 3.0, float("nan"), 2.0, 3.0, float("-inf")])
    values, indices = kernels.top_k(x, 4)
    assert indices.tolist() == [3, 1, 2, 5] and values[1:].tolist() == [3.0, 3.0, 3.0]
    x = torch.full((100,), float("-inf"))
    x[70] = 1.0
    assert kernels.top_k(x, 3)[1].tolist() == [70, 0, 1]  # the masked ones in index order
    with pytest.raises(ValueError):
        kernels.top_k(x, 101)
