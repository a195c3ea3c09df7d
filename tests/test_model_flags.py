"""runtime.ModelFlags checks its own fields when built: a wrong flag ends a command before anything
is located, opened or loaded, so runtime.open_model reads locate -> open -> plan -> load."""

import pytest

from llmcli.errors import LlmcliError
from llmcli.runtime.runtime import ModelFlags, open_model


@pytest.mark.parametrize("fields, message", [
    (dict(ctx_size=0), "--ctx-size must be at least 1"),
    (dict(threads=0), "--threads must be at least 1"),
    (dict(device="tpu"), "unknown device 'tpu'"),
    (dict(dtype="int3"), "unknown dtype 'int3'"),
    (dict(kv_type="int2"), "unknown --kv-type 'int2'"),
    (dict(kv_offload="maybe"), "--kv-offload must be one of"),
    (dict(kv_type="int8", kv_offload="on"), "--kv-offload on keeps the cache in floating point"),
    (dict(quant="q3_nonsense"), "unknown preset 'q3_nonsense'"),
])
def test_a_wrong_field_is_refused_when_the_flags_are_built(fields, message):
    with pytest.raises(LlmcliError, match=message):
        ModelFlags("/nonexistent/model.gguf", **fields)
    with pytest.raises(LlmcliError, match=message):  # before the missing file is noticed
        open_model("/nonexistent/model.gguf", **fields)


def test_the_preset_is_loaded_once_and_follows_with_():
    flags = ModelFlags("m", quant="q4")
    assert flags.preset.name == "q4" and ModelFlags("m").preset is None
    assert flags.with_(quant="q8").preset.name == "q8" and flags.with_(quant=None).preset is None
