"""Decode steps in one C++ call (native/decode.cpp) for Llama-family models held as GGUF blocks on the CPU.

A one-token step runs ~300 small operations. Compiled, their dispatch, graph wrapper and dynamo's
guards still cost ~4.5 ms of SmolLM2's ~15 on 2 threads. Here everything from the token's embedding
to the logits runs in C++; only the embedding lookup and the RoPE tables (the model's own, so
scaled or shifted positions come out as the model computes them) stay torch ops. The cache is the
model's own StaticKVCache (float32), written in place, so prefill, rollback and context shift work
on it as before. A cache other than the last one seen (a new conversation) rebuilds the C++ side's
list of tensors, about a millisecond.

Runtime.decode_step uses it where `supports` and `fits` say so; a call it does not cover (a batch, several
tokens, another kind of cache) runs the model eagerly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import native
from ..cache.static import StaticKVCache
from ..models import llama
from ..quant.gguf_blocks import TYPE_IDS, GGUFBlockWeight


ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")  # GGUF general.architecture the step runs


class NativeStep:
    """Callable like the model (`step(tokens, cache, positions, last_only, hidden)`), for one-token steps."""

    native = True  # chat/session.py decode_mode says so

    def __init__(self, model: llama.Transformer, threads: int | None = None):
        self.model = model
        self.threads = threads or torch.get_num_threads()
        self._cache = None  # the cache _steps was built on (it holds that cache's tensors)
        self._steps = None

    @staticmethod
    def decodes(model_file) -> bool:
        """Whether a model file, loaded as stored on the CPU, will decode through this step (read
        from its header): a Llama-family GGUF whose matrices are all blocks the step multiplies."""
        if not model_file.is_gguf or model_file.architecture not in ARCHITECTURES or native.module() is None:
            return False
        matrices = [t for t in model_file.reader.tensors if len(t.shape) > 1 and t.name != "token_embd.weight"]
        return bool(matrices) and all(t.tensor_type.name in TYPE_IDS for t in matrices)

    @staticmethod
    def supports(model) -> bool:
        """Whether every layer is the plain Llama decoder with GGUF-block projections on the CPU."""
        if type(model) is not llama.Transformer or native.module() is None:
            return False
        if model.inv_freq.device.type != "cpu" or model.model.norm.weight.dtype != torch.float32:
            return False
        for layer in model.model.layers:
            if type(layer) is not llama.DecoderLayer or layer.mlp.act is not F.silu:
                return False
            projections = _projections(layer)
            if projections is None or not all(_is_blocks(m) for group in projections for m in group):
                return False
        return _is_blocks(model.lm_head)

    @staticmethod
    def fits(cache) -> bool:
        """Whether `cache` is what the C++ step writes: a float32 static cache of one row on the CPU,
        stored as computed (no conversion buffers)."""
        return (type(cache) is StaticKVCache and cache.out is None and cache.k[0].dtype == torch.float32
                and cache.k[0].shape[0] == 1 and cache.k[0].device.type == "cpu")

    def __call__(self, tokens, cache, positions=None, last_only: bool = False, hidden: bool = False):
        if tokens.shape != (1, 1) or not self.fits(cache) or cache.length >= cache.max_len:
            return self.model(tokens, cache, positions, last_only, hidden)
        if cache is not self._cache:
            self._steps, self._cache = self._build(cache), cache
        slot = cache.length
        if positions is None:
            positions = torch.tensor([slot])
        cos, sin = self.model.rope(positions.reshape(1), cache, torch.float32)  # (1, rotary_dim) each
        x = self.model.model.embed_tokens(tokens).reshape(-1)
        logits, h = self._steps.run(x, slot, cos, sin)
        cache.length = slot + 1
        logits, h = logits.view(1, 1, -1), h.view(1, 1, -1)
        return (logits, h) if hidden else logits

    def _build(self, cache: StaticKVCache):
        args = self.model.args
        attn = self.model.model.layers[0].self_attn
        scale = attn.scale if attn.scale is not None else args.head_dim ** -0.5
        steps = native.module().DecodeSteps(args.num_attention_heads, args.num_key_value_heads, args.head_dim,
                                            args.rotary_dim, args.rms_norm_eps, scale, self.threads)
        for i, layer in enumerate(self.model.model.layers):
            qkv, o, gate_up, down = (list(map(_spec, group)) for group in _projections(layer))
            a = layer.self_attn
            q_norm = a.q_norm.weight if hasattr(a, "q_norm") else _EMPTY
            k_norm = a.k_norm.weight if hasattr(a, "k_norm") else _EMPTY
            steps.add_layer(layer.input_layernorm.weight.detach(), qkv, q_norm.detach(), k_norm.detach(), o,
                            layer.post_attention_layernorm.weight.detach(), gate_up, down, cache.k[i], cache.v[i],
                            a.window or 0)
        steps.set_head(self.model.model.norm.weight.detach(), [_spec(self.model.lm_head)])
        return steps


_EMPTY = torch.empty(0)


def _projections(layer):
    """The layer's projection modules in four groups (q/k/v, o, gate/up, down), fused or not."""
    a, m = layer.self_attn, layer.mlp
    qkv = [a.qkv_proj] if hasattr(a, "qkv_proj") else [getattr(a, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    gate_up = [m.gate_up_proj] if hasattr(m, "gate_up_proj") else [getattr(m, n, None) for n in ("gate_proj", "up_proj")]
    groups = (qkv, [a.o_proj], gate_up, [m.down_proj])
    return None if any(p is None for g in groups for p in g) else groups


def _is_blocks(module) -> bool:
    packed = getattr(module, "packed", None)
    return isinstance(packed, GGUFBlockWeight) and packed.device.type == "cpu" and packed.shape[1] % 32 == 0


def _spec(module):
    """(blocks, type id, K, bias or empty) as DecodeSteps.add_layer takes a projection."""
    p = module.packed
    bias = module.bias.detach() if module.bias is not None else _EMPTY
    return p.blocks, TYPE_IDS[p.type_name], p.shape[1], bias
