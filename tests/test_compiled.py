"""The compiled decode step against the eager model (tiny models: compiling a real one takes minutes)."""

from __future__ import annotations

import pytest
import torch

from llmcli.runtime.compiled_step import CompiledStep
from llmcli.runtime.runtime import Runtime


@pytest.mark.slow
def test_compiled_and_eager_steps_give_the_same_logits(tiny_gguf):
    """The compiled step of a GGUF model in bfloat16 (its blocks kept packed, as SmolLM2's are) gives the
    eager model's logits at every position, from a prompt prefilled eagerly. A tiny model compiles the
    same graph, layer by layer, as a real one, in seconds rather than minutes (cpp_wrapper's C++)."""
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    loaded = load_model(tiny_gguf, place("cpu", "bfloat16"))
    loaded.model.fuse()
    rt = Runtime(loaded, 64)
    ids = rt.prompt_ids([{"role": "user", "content": "Name the planets of the solar system."}])
    step = CompiledStep(loaded.model)
    caches = [rt.new_cache(), rt.new_cache()]
    with torch.inference_mode():
        for cache in caches:
            loaded.model(torch.tensor([ids]), cache)
        for token in range(5, 21):
            eager = loaded.model(torch.tensor([[token]]), caches[0], last_only=True).float()
            compiled = step(torch.tensor([[token]]), caches[1], last_only=True).float()
            torch.testing.assert_close(compiled, eager, rtol=0, atol=0.01 * eager.abs().max().item())
            assert int(compiled.argmax()) == int(eager.argmax())
    assert step.fallback_reason is None  # it really ran compiled


def test_compile_failure_falls_back_to_eager(tmp_path, monkeypatch):
    """Without a working compiler the step runs eagerly, says why, and the cache is not advanced twice."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from tiny import hf_model, save_hf

    from llmcli.cache.static import StaticKVCache
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    monkeypatch.setenv("LLMCLI_HOME", str(tmp_path))
    loaded = load_model(save_hf(hf_model("llama"), tmp_path / "m"), place("cpu", "float32"))
    step = CompiledStep(loaded.model)

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    step._compiled = broken
    cache = StaticKVCache.for_model(loaded.args, 16, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        loaded.model(torch.tensor([[5, 6, 7]]), cache)
        out = step(torch.tensor([[8]]), cache, last_only=True)
    assert step.fallback_reason.startswith("RuntimeError") and cache.length == 4 and out.shape == (1, 1, loaded.args.vocab_size)


def test_quantized_and_offloaded_caches_decode_eagerly(tmp_path):
    """Compiling does not pay with them (measured slower): --compile keeps the eager model there."""
    from tiny import hf_model, save_hf

    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model
    from llmcli.runtime.plan import CacheChoice

    loaded = load_model(save_hf(hf_model("llama"), tmp_path / "m"), place("cpu", "float32"))

    class Plan:
        def __init__(self, choice):
            self.choice = choice

    for choice, compiles in ((CacheChoice(), True), (CacheChoice("f16"), True), (CacheChoice("int8"), False),
                             (CacheChoice("int4"), False), (CacheChoice(None, 1), False)):
        rt = Runtime(loaded, 64, Plan(choice))
        assert rt.compiles_well is compiles
        assert (rt.decode_step(True) is loaded.model) is not compiles


@pytest.mark.slow
@pytest.mark.parametrize("model_type, overrides", [
    ("gemma3_text", {"num_hidden_layers": 2}),  # scaled embeddings, two RoPE tables, a local and a global layer
    ("phi3", {"original_max_position_embeddings": 8, "rope_parameters": {
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "original_max_position_embeddings": 8,
        "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 4.0, 8.0, 16.0]}}),
])
def test_compiled_step_runs_the_new_architectures(tmp_path, monkeypatch, model_type, overrides):
    """The compiled one-token step of gemma3 and phi3 (LongRoPE, partial rotary) gives the eager logits."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from tiny import hf_model, save_hf

    from llmcli.cache.static import StaticKVCache
    from llmcli.runtime.device import place
    from llmcli.runtime.loader import load_model

    monkeypatch.setenv("LLMCLI_HOME", str(tmp_path))
    loaded = load_model(save_hf(hf_model(model_type, **overrides), tmp_path / "m"), place("cpu", "float32"))
    loaded.model.fuse()
    step = CompiledStep(loaded.model)
    caches = [StaticKVCache.for_model(loaded.args, 24, torch.device("cpu"), torch.float32) for _ in range(2)]
    with torch.no_grad():
        for cache in caches:
            loaded.model(torch.tensor([[5, 6, 7, 8, 9, 10]]), cache)
        for t in range(11, 20):  # past gemma3's window of 8
            eager = loaded.model(torch.tensor([[t]]), caches[0], last_only=True)
            compiled = step(torch.tensor([[t]]), caches[1], last_only=True)
            torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
    assert step.fallback_reason is None


def test_the_kernel_cache_is_kept_apart_per_cpu_kind(tmp_path, monkeypatch, cpu_kind):
    """inductor's cache does not key on ATEN_CPU_CAPABILITY: kernels cached under one setting decoded
    garbage under another. llmcli's cache folder is one per CPU feature set and torch ISA choice."""
    from llmcli.runtime.compiled_step import compile_cache

    here = compile_cache(tmp_path)
    assert here.parent == tmp_path and compile_cache(tmp_path) == here
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert compile_cache(tmp_path) != here
