"""Cache kinds on a tiny random model: the same logits as the static cache (exactly when nothing is
rounded), through prefill chunks, decode steps, truncation into quantized groups and context shifts;
byte counts that are the tensors allocated."""

from __future__ import annotations

import pytest
import torch
from tiny import hf_model, save_hf

from llmcli.cache import StaticKVCache, new_cache
from llmcli.cache.offload import OffloadedKVCache, Transfer
from llmcli.cache.quantized import GROUP, dequantize_keys_into, dequantize_values_into, quantize_keys, quantize_values
from llmcli.decode.generate import prefill
from llmcli.runtime.device import place
from llmcli.runtime.loader import load_model
from llmcli.runtime.plan import CacheChoice, kv_parts

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = save_hf(hf_model("llama", num_hidden_layers=5, max_position_embeddings=512), tmp_path_factory.mktemp("kv") / "m")
    return load_model(folder, place("cpu", "float32", threads=1))


def run(model, cache, ids, truncate_to=None, steps=60):
    """Prefill 70 tokens in chunks of 16, then decode `steps` tokens (teacher-forced); optionally
    truncate back to `truncate_to` half way. Returns the logits of every step (steps + 1, V)."""
    out = []
    with torch.inference_mode():
        out.append(prefill(model, ids[:70], cache, CPU, chunk=16))
        for i in range(steps):
            if truncate_to is not None and i == steps // 2:
                cache.truncate(truncate_to)
            out.append(model(torch.tensor([[ids[70 + i]]]), cache, last_only=True)[0, -1])
    return torch.stack(out)


def ids_for(n=200, seed=1):
    return torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# kind -> (kv_type, device_layers, max |logit - static| on this model)
KINDS = {"offload-all": (None, 0, 0.0), "offload-1": (None, 1, 0.0), "offload-2": (None, 2, 0.0),
         "offload-4": (None, 4, 0.0), "bf16": ("bf16", None, 0.05), "f16": ("f16", None, 0.01),
         "int8": ("int8", None, 0.05), "int4": ("int4", None, 1.0)}


@pytest.mark.parametrize("truncate_to", [None, 45, 64])
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_follows_the_static_cache(tiny, kind, truncate_to):
    kv_type, layers, bound = KINDS[kind]
    ids = ids_for()
    expected = run(tiny.model, StaticKVCache.for_model(tiny.args, 200, CPU, torch.float32), ids, truncate_to)
    got = run(tiny.model, new_cache(tiny.args, 200, CPU, torch.float32, kv_type, layers), ids, truncate_to)
    if bound == 0.0:
        assert torch.equal(got, expected)
    else:
        assert (got - expected).abs().max() <= bound


def test_offload_runs_through_the_transfer_one_layer_ahead(tiny):
    """On the CPU the offload path is the GPU's: host layers fetched into two slots, one layer ahead."""
    calls = []

    class Recording(Transfer):
        def fetch(self, slot, dst, src, n):
            calls.append(("fetch", slot, n))
            super().fetch(slot, dst, src, n)

        def ready(self, slot):
            calls.append(("ready", slot))

    cache = OffloadedKVCache.for_model(tiny.args, 64, CPU, torch.float32, device_layers=1)
    cache.transfer = Recording(CPU)
    with torch.inference_mode():
        prefill(tiny.model, ids_for(10), cache, CPU)
        calls.clear()
        tiny.model(torch.tensor([[5]]), cache, last_only=True)
    # 4 host layers: the last one (slot 1) fetched layer 1 for this step at the end of the prefill;
    # each host layer then fetches the next (k and v) after waiting for its own
    assert calls[0] == ("ready", 0)
    assert calls[1:3] == [("fetch", 1, 10), ("fetch", 1, 10)] and calls[3] == ("ready", 1)
    assert calls[4:6] == [("fetch", 0, 10), ("fetch", 0, 10)]
    assert calls[-2:] == [("fetch", 0, 11), ("fetch", 0, 11)]  # layer 1 for the next step
    assert all(t.device == CPU for t in cache.k + [s for pair in cache.slots for s in pair])
    assert cache.host_nbytes == 4 * 2 * 64 * tiny.args.num_key_value_heads * tiny.args.head_dim * 4


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_groups_round_trip_within_half_a_step(bits):
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4 * GROUP, 64) * torch.linspace(0.1, 20, 64)  # channels of very different size
    out = torch.empty_like(x)
    codes, scale, zero = quantize_keys(x, bits, torch.float32)
    dequantize_keys_into(out, codes, scale, zero, bits)
    step = scale.repeat_interleave(GROUP, dim=2)  # per channel and group of tokens
    assert ((out - x).abs() <= step / 2 + 1e-6).all()
    codes, scale, zero = quantize_values(x, bits, torch.float32)
    dequantize_values_into(out, codes, scale, zero, bits)
    step = scale.repeat_interleave(32, dim=3)  # per token and group of channels
    assert ((out - x).abs() <= step / 2 + 1e-6).all()


def _allocated(cache) -> int:
    """Bytes of every tensor the cache holds (its attributes, lists and tuples of them)."""
    seen = {}

    def visit(v):
        if isinstance(v, torch.Tensor):
            seen[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)

    for v in vars(cache).values():
        visit(v)
    return sum(seen.values())


@pytest.mark.parametrize("ctx", [1, 31, 100, 512])
@pytest.mark.parametrize("choice", [CacheChoice(), CacheChoice("bf16"), CacheChoice("f16"), CacheChoice("int8"),
                                    CacheChoice("int4"), CacheChoice(None, 0), CacheChoice(None, 3),
                                    CacheChoice("bf16", 4)])
def test_planned_bytes_are_the_tensors_allocated(tiny, choice, ctx):
    cache = new_cache(tiny.args, ctx, CPU, torch.float32, choice.kv_type, choice.device_layers)
    if isinstance(cache, StaticKVCache) and choice.kv_type in ("bf16", "f16"):
        assert cache.nbytes == _allocated(cache) < sum(p.nbytes for p in kv_parts(tiny.args, ctx, torch.float32,
                                                                              choice, "cpu"))
        cache.out  # the conversion buffer, made at the model's first update (the plan counts it)
    parts = kv_parts(tiny.args, ctx, torch.float32, choice, "cpu")
    assert sum(p.nbytes for p in parts) == cache.nbytes == _allocated(cache)
    if isinstance(cache, OffloadedKVCache):
        assert sum(p.nbytes for p in parts if p.where == "host") == cache.host_nbytes
        assert sum(p.nbytes for p in parts if p.where != "host") == cache.device_nbytes


def test_int8_cache_is_about_half_of_bf16_at_8192():
    from llmcli.models.llama import ModelArgs

    smollm2 = ModelArgs(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                        intermediate_size=1536, vocab_size=49152)
    size = {k: sum(p.nbytes for p in kv_parts(smollm2, 8192, torch.bfloat16, CacheChoice(k), "cpu"))
            for k in (None, "int8", "int4")}
    assert 0.5 < size["int8"] / size[None] < 0.6
    assert 0.3 < size["int4"] / size[None] < 0.4


def test_shift_moves_and_rerotates_keys(tiny):
    from llmcli.cache.context_shift import rerotation

    rerotate = rerotation(tiny.model.inv_freq)
    ids = ids_for(100)
    for kv_type, layers in ((None, None), (None, 2), ("int8", None)):
        cache = new_cache(tiny.args, 128, CPU, torch.float32, kv_type, layers)
        with torch.inference_mode():
            prefill(tiny.model, ids[:100], cache, CPU)
            cache.shift(10, 40, rerotate)
            assert cache.length == 60
            # the model continues from the shifted cache as from a fresh prefill at the new positions,
            # up to what the moved tokens saw of the dropped ones: layer 0 sees only tokens themselves
            fresh = StaticKVCache.for_model(tiny.args, 128, CPU, torch.float32)
            prefill(tiny.model, ids[:10] + ids[50:100], fresh, CPU)
            k, v = cache.update(0, 60, fresh.k[0][:, :, 59:60], fresh.v[0][:, :, 59:60])
        tol = 0.05 if kv_type else 1e-5
        assert torch.allclose(k[:, :, :60], fresh.k[0][:, :, :60], atol=tol)
        assert torch.allclose(v[:, :, :60], fresh.v[0][:, :, :60], atol=tol)
