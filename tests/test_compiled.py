"""The compiled decode step against the eager model on the real small model."""

from __future__ import annotations

import pytest
import torch

from llmcli.compiled import CompiledStep
from llmcli.generate import generate
from llmcli.runtime import Runtime
from llmcli.sampling import SamplingParams


@pytest.mark.slow
def test_compiled_and_eager_decode_give_the_same_greedy_tokens(smollm2_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMCLI_HOME", str(tmp_path))
    from llmcli.device import place
    from llmcli.loader import load_model

    loaded = load_model(smollm2_gguf, place("cpu", "bfloat16"))  # the default path: Q4_1 blocks kept packed
    loaded.model.fuse()
    rt = Runtime(loaded, 512)
    ids = rt.prompt_ids([{"role": "user", "content": "Name the planets of the solar system."}])

    def tokens(step):
        chunks = generate(loaded.model, loaded.tokenizer, ids, SamplingParams(temperature=0), rt.new_cache(),
                          max_tokens=48, step=step)
        return [t for c in chunks for t in c.tokens]

    step = CompiledStep(loaded.model)
    compiled = tokens(step)
    assert step.fallback_reason is None  # it really ran compiled
    assert compiled == tokens(loaded.model)
    assert len(compiled) > 8


def test_compile_failure_falls_back_to_eager(tmp_path, monkeypatch):
    """Without a working compiler the step runs eagerly, says why, and the cache is not advanced twice."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from tiny import hf_model, save_hf

    from llmcli.device import place
    from llmcli.kv_cache import StaticKVCache
    from llmcli.loader import load_model

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

    from llmcli.device import place
    from llmcli.loader import load_model
    from llmcli.memory_plan import CacheChoice

    loaded = load_model(save_hf(hf_model("llama"), tmp_path / "m"), place("cpu", "float32"))

    class Plan:
        def __init__(self, choice):
            self.choice = choice

    for choice, compiles in ((CacheChoice(), True), (CacheChoice("f16"), True), (CacheChoice("int8"), False),
                             (CacheChoice("int4"), False), (CacheChoice(None, 1), False)):
        rt = Runtime(loaded, 64, Plan(choice))
        assert rt.compiles_well is compiles
        assert (rt.decode_step(True) is loaded.model) is not compiles
