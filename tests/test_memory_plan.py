"""The memory planner on given budgets: each outcome in order, byte counts that are what gets
allocated, the registry's default context as a soft default, what-if plans for a GPU not here."""

from __future__ import annotations

import pytest
import torch

from llmcli.cache.offload import OffloadedKVCache
from llmcli.quant.presets import load_preset
from llmcli.runtime.plan import CacheChoice, NotEnoughMemoryError, activation_bytes, kv_parts, plan
from llmcli.runtime.probe import Budget, model_shapes, parse_size, weights_bytes, weights_from_files

CPU = torch.device("cpu")
BF16 = torch.bfloat16
MIB = 2**20
HEADROOM = 64 * MIB  # budgets below 1.25 GiB keep 64 MiB free


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    return weights_from_files(smollm2_gguf, None, BF16, CPU)


def need(info, choice: CacheChoice, ctx: int = 8192, where: str | None = None) -> int:
    """Device bytes of a plan with `choice` (host bytes with where="host")."""
    kv = kv_parts(info.args, ctx, BF16, choice, "x")
    if where == "host":
        return sum(p.nbytes for p in kv if p.where == "host")
    return (info.nbytes + sum(p.nbytes for p in kv if p.where != "host") + activation_bytes(info.args, ctx, BF16)
            + HEADROOM)


def make_plan(info, budget, ctx=8192, **kw):
    return plan(info.args, info.nbytes, info.label, budget, BF16, ctx, **kw)


def test_the_first_choice_that_keeps_the_context(smollm2):
    static, int8, int4 = (need(smollm2, CacheChoice(k)) for k in (None, "int8", "int4"))
    assert static > int8 > int4
    for free, expected in ((static, None), (static - 1, "int8"), (int8, "int8"), (int8 - 1, "int4"), (int4, "int4")):
        p = make_plan(smollm2, Budget("cpu", free))
        assert (p.ctx, p.choice) == (8192, CacheChoice(expected))
        assert p.taken_bytes <= free
        assert bool(p.notes) == (expected is not None)  # a quantized cache is never chosen silently


def test_offloads_as_few_layers_as_needed_on_a_gpu(smollm2):
    host = 8 * 2**30
    int4 = need(smollm2, CacheChoice("int4"))
    # between int4 on the device and nothing: 5 layers on the device and the rest in host memory
    free = need(smollm2, CacheChoice(None, 5))
    assert free < int4
    p = make_plan(smollm2, Budget("cuda", free, host))
    assert p.choice == CacheChoice(None, 5)
    assert p.host_bytes == need(smollm2, CacheChoice(None, 5), where="host")
    assert "5 of 30 layers on cuda" in p.table()
    assert make_plan(smollm2, Budget("cuda", need(smollm2, CacheChoice(None, 0)), host)).choice == CacheChoice(None, 0)
    # not on the CPU (host and device are one memory), nor with --kv-offload off
    assert make_plan(smollm2, Budget("cpu", free), ctx_given=False).ctx < 8192
    assert make_plan(smollm2, Budget("cuda", free, host), kv_offload="off").ctx < 8192
    # host memory counts too
    assert make_plan(smollm2, Budget("cuda", free, 10 * MIB)).ctx < 8192


def test_then_a_smaller_context_saying_so_or_an_error_when_it_was_asked_for(smollm2):
    free = need(smollm2, CacheChoice(None, 0)) - 1
    p = make_plan(smollm2, Budget("cpu", free))
    assert 256 <= p.ctx < 8192 and p.ctx % 256 == 0
    assert p.taken_bytes <= free
    assert p.requested == 8192 and "using a context of" in p.notes[0]
    with pytest.raises(NotEnoughMemoryError, match=rf"a context of 8192 tokens needs at least .* --ctx-size {p.ctx} "
                                                   r"with --kv-type int4 fits"):
        make_plan(smollm2, Budget("cpu", free), ctx_given=True)
    with pytest.raises(NotEnoughMemoryError, match="the weights need"):
        make_plan(smollm2, Budget("cpu", smollm2.nbytes))


def test_a_kv_type_asked_for_is_the_only_one_tried(smollm2):
    free = need(smollm2, CacheChoice("int8")) - 1
    assert make_plan(smollm2, Budget("cpu", free), kv_type="int8").ctx < 8192
    p = make_plan(smollm2, Budget("cpu", 2**34), kv_type="f16")
    assert p.choice == CacheChoice("f16") and not p.notes
    assert make_plan(smollm2, Budget("cuda", 2**34, 2**34), kv_offload="on").choice == CacheChoice(None, 0)


def test_planned_bytes_are_what_is_allocated(smollm2_loaded, smollm2_gguf, smollm2):
    """Weights: the loaded model's tensors; KV cache: what the cache of each planned outcome allocates."""
    info = weights_from_files(smollm2_gguf, load_preset("f32"), torch.float32, CPU)  # as smollm2_loaded holds it
    tensors = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
               for t in list(smollm2_loaded.model.parameters()) + list(smollm2_loaded.model.buffers())}
    assert info.nbytes == sum(tensors.values())
    host = 8 * 2**30
    for choice, device in ((CacheChoice(), "cpu"), (CacheChoice("int8"), "cpu"), (CacheChoice("int4"), "cpu"),
                           (CacheChoice(None, 5), "cuda"), (CacheChoice(None, 0), "cuda")):
        p = make_plan(smollm2, Budget(device, need(smollm2, choice), host))
        assert p.choice == choice
        cache = p.new_cache(CPU)  # the same tensors a GPU would hold, here in CPU memory
        assert p.kv_bytes == cache.nbytes
        if isinstance(cache, OffloadedKVCache):
            assert p.host_bytes == cache.host_nbytes


@pytest.mark.parametrize("preset_name", ["q4", "q8", "q4_mixed"])
def test_quantized_weights_are_planned_at_their_packed_size(tmp_path, preset_name):
    from tiny import hf_model, save_hf

    from llmcli.quant.presets import load_preset
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    folder = save_hf(hf_model("llama", hidden_size=128, intermediate_size=256, num_hidden_layers=3), tmp_path / "m")
    preset = load_preset(preset_name)
    loaded = load_model(folder, place("cpu", "bfloat16", threads=1), preset)
    tensors = {}
    for m in loaded.model.modules():
        owned = list(m.parameters(recurse=False)) + list(m.buffers(recurse=False))
        packed = getattr(m, "packed", None)
        while packed is not None:
            owned += [v for v in vars(packed).values() if isinstance(v, torch.Tensor)]
            packed = getattr(packed, "halves", None)
        tensors.update({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in owned})
    assert weights_from_files(folder, preset, BF16, CPU).nbytes == sum(tensors.values())


def test_gguf_blocks_kept_as_stored_are_planned_at_their_size(smollm2_gguf):
    """The default 16-bit load keeps the file's Q4_1/Q8_0 blocks packed: the plan counts them so, and
    bench's weight size (the tensors held) agrees."""
    from llmcli.bench.measure import weights_bytes
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    loaded = load_model(smollm2_gguf, place("cpu", "bfloat16", threads=1))
    info = weights_from_files(smollm2_gguf, None, BF16, CPU)
    assert "as stored" in info.label
    assert info.nbytes == weights_bytes(loaded.model) < 110 * 2**20  # not the ~260 MB of bfloat16


def test_registry_default_context_is_kept_unless_it_does_not_fit(smollm2_gguf, monkeypatch):
    from llmcli.runtime.device import place
    from llmcli.runtime.runtime import plan_memory

    class Entry:
        context_length = 4096

    placement = place("cpu", "bfloat16", threads=1)
    p = plan_memory(smollm2_gguf, placement, entry=Entry())
    assert (p.ctx, p.ctx_source) == (4096, "the registry's default context")
    assert plan_memory(smollm2_gguf, placement, ctx_size=8192, entry=Entry()).ctx == 8192
    monkeypatch.setenv("LLMCLI_MEMORY_LIMIT", "190MiB")  # weights, activations, the margin and a little
    p = plan_memory(smollm2_gguf, placement, entry=Entry())
    assert p.ctx < 4096 and "the registry's default context of 4096 tokens" in p.notes[0]


def test_what_if_plan_for_a_7b_model_at_32k_on_a_24_gb_gpu():
    """A GPU that is not here: shapes from known arguments (Qwen2.5-7B), a given budget."""
    from llmcli.models.llama import ModelArgs
    from llmcli.quant.presets import load_preset

    args = ModelArgs(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                     num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                     max_position_embeddings=32768, qkv_bias=True)
    cuda = torch.device("cuda")
    bf16 = weights_bytes(model_shapes(args), args, None, BF16, cuda)
    q4 = weights_bytes(model_shapes(args), args, load_preset("q4"), BF16, cuda)
    assert 15e9 < bf16 < 15.5e9 and 4.5e9 < q4 < 5.5e9
    gpu = Budget("cuda", parse_size("24G") - parse_size("1GiB"), parse_size("64G"))  # a desktop still showing
    p = plan(args, bf16, "bfloat16", gpu, BF16, 32768)
    assert p.choice == CacheChoice() and p.kv_bytes == 28 * 2 * 4 * 128 * 32768 * 2
    small = Budget("cuda", parse_size("6G"), parse_size("64G"))
    p = plan(args, q4, "q4", small, BF16, 32768)  # int4 on the device would need 5.87 GiB: offload
    assert (p.ctx, p.choice) == (32768, CacheChoice(None, 3))
    with pytest.raises(NotEnoughMemoryError, match="the weights need 14.19 GiB"):
        plan(args, bf16, "bfloat16", small, BF16, 32768)


def test_a_cuda_budget_is_what_the_process_may_still_take(monkeypatch):
    """torch.cuda.set_per_process_memory_fraction caps torch's allocator at fraction x total of its
    reserved memory, which mem_get_info does not see: the budget is the smaller of the two (faked
    here: no GPU needed). The CUDA tests (test_cuda.py) cap a real one and the plan offloads."""
    from llmcli.runtime import probe

    GIB = 2**30
    cuda = torch.device("cuda")
    state = {"fraction": 1.0, "reserved": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: state["fraction"])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: state["reserved"])
    monkeypatch.delenv(probe.MEMORY_LIMIT_ENV, raising=False)
    b = probe.detect_budget(cuda)
    assert (b.device, b.free, b.source) == ("cuda", 70 * GIB, "torch.cuda.mem_get_info") and b.host_free > 0
    state.update(fraction=0.25, reserved=3 * GIB)  # 20 GiB allowed, 3 of them already reserved
    b = probe.detect_budget(cuda)
    assert (b.free, b.source) == (17 * GIB, "set_per_process_memory_fraction(0.25) of 80.00 GiB")
    state.update(fraction=0.95, reserved=0)  # a cap above what is free changes nothing
    assert probe.detect_budget(cuda).free == 70 * GIB
    state.update(fraction=0.01, reserved=GIB)  # more reserved than the cap allows: nothing left
    assert probe.detect_budget(cuda).free == 0
    monkeypatch.setenv(probe.MEMORY_LIMIT_ENV, "2G")  # the environment's figure still replaces it
    assert probe.detect_budget(cuda).free == 2 * 10**9
    monkeypatch.delattr(torch.cuda, "get_per_process_memory_fraction")  # a torch without the query: no cap seen
    monkeypatch.delenv(probe.MEMORY_LIMIT_ENV)
    assert probe.detect_budget(cuda).free == 70 * GIB


def test_sizes_parse_like_people_write_them():
    assert parse_size("24G") == 24 * 10**9 and parse_size("1.5GiB") == 3 * 2**29 and parse_size("500m") == 5 * 10**8
    assert parse_size("1000") == 1000
    with pytest.raises(Exception, match="LLMCLI_MEMORY_LIMIT must be a size"):
        parse_size("lots")
