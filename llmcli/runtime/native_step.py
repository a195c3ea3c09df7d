"""Decode steps in one C++ call (native/src/step.cpp) for Llama-family and Gemma 3 models held as GGUF
blocks on the CPU.

A one-token step runs ~300 small operations. Compiled, their dispatch, graph wrapper and dynamo's
guards still cost a third of a small model's step. Here everything from the tokens' embeddings
to the logits runs in C++; only the embedding lookup and the RoPE tables (the model's own, so
scaled or shifted positions come out as the model computes them) stay torch ops, and Gemma's final
soft-capping. The cache is the model's own StaticKVCache (float16 by default, `--kv-type auto`'s
choice where this step decodes; or float32), written in place, so prefill, rollback and context
shift work on it as before. A cache other than the last one seen (a new conversation) rebuilds
the C++ side's list of tensors, about a millisecond.

One call takes several tokens as well: the rows of a batch (`slots`, batched.py), or the tokens of
one row at consecutive slots (a prompt's prefill, a speculative pass checking its guesses; a row
may be a batch-1 view of a row of the cache, StaticKVCache.row). Each weight is read once for all
of them, and each token's numbers are those it gets alone. Prefill this way is faster than the
model's on the CPU, whose blocks it would dequantize for a float32 GEMM first.

Runtime.decode_step uses it where `supports` and `fits` say so; a call it does not cover (another
kind of cache, several rows of several tokens) runs the model eagerly.
"""

from __future__ import annotations

import time
import weakref

import torch
import torch.nn.functional as F

from .. import native
from ..native.step import REFINE_ALL, SWIGLU_OAI
from ..cache.static import StaticKVCache
from ..models import gemma3, gpt_oss, llama, moe, olmoe, phi3, rope
from ..quant import float_rows
from ..quant.gguf_blocks import STEP_TYPES, TYPE_IDS, GGUFBlockWeight
from ..quant.held import model_formats, step_multiplies

# the families it runs (GGUF's gemma3 is gemma3_text)
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text", "qwen3_moe", "mixtral", "qwen2_moe",
               "gpt_oss", "olmoe")
TABLE_POSITIONS = 1 << 16  # RoPE rows kept (at most 32 MiB a pair of tables for head_dim 64); past them, computed
KV_DTYPES = (torch.float32, torch.float16)  # a cache the C++ step reads and writes
MAX_TOKENS = 512  # tokens of one row a call takes (a speculative pass: 1 + its guesses); more: the model's prefill
# Each model's RoPE tables (_cover's), with the inverse frequencies they were made from: a step made
# for a new cache (a session's first, after the warm-up at load) takes them instead of making them
_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_FAMILIES = {llama.Transformer: (llama.DecoderLayer, F.silu, "silu"),
             phi3.Transformer: (llama.DecoderLayer, F.silu, "silu"),  # fused projections, LongRoPE's tables
             gemma3.Transformer: (gemma3.DecoderLayer, gemma3.gelu_tanh, "gelu_tanh"),
             moe.Transformer: (moe.DecoderLayer, F.silu, "silu"),  # (every layer's experts: qwen3moe, mixtral, qwen2moe)
             olmoe.Transformer: (olmoe.DecoderLayer, F.silu, "silu"),  # q and k normed over all heads at once
             # sinks, a biased router, experts with biases and the clamped SwiGLU of api.h's act 2
             gpt_oss.Transformer: (gpt_oss.DecoderLayer, gpt_oss.Expert.act, "swiglu_oai")}


class NativeStep:
    """Callable like the model (`step(tokens, cache, positions, last_only, hidden, slots)`): for one
    token, a batch's tokens (one a row, `slots`), or up to MAX_TOKENS of one row. With `top=k`, a
    call also finds the k largest logits of each row it returns (`last_top`), as the head makes
    them: the pickers take those instead of a pass over each row's logits afterwards."""

    native = True  # chat/session.py decode_mode says so

    def __init__(self, model, threads: int | None = None):
        self.model = model
        self.threads = threads or torch.get_num_threads()
        self._cache = None  # the cache _native was built on (it holds that cache's tensors)
        self._native = None  # native.step.Step: the C++ side, built on that cache
        self._gemma = type(model) is gemma3.Transformer
        self._tables = None  # _rope's cos, sin (and local cos, sin) for positions [0, L)
        self._tables_of = None  # the inverse frequencies they were made from (phi3's depend on the cache size)
        # the last call's (values, indices) (rows, k) of each returned logit row's k largest, where it
        # asked for them (top=k) and the C++ step ran (not the model; no soft-capped logits); else None
        self.last_top = None
        # int8x2 activations into the integer dot products, as the loader marked the model (quant/held.py)
        # (native/step.py's mask: a GGUF file's as precision.py chose it at load, else all or none)
        every = REFINE_ALL if getattr(model, "activations", "int8") == "int8x2" else 0
        self.refined = getattr(model, "refine_mask", every)
        self.prepare(model, self.threads)  # (done at load by the runtime; a model built by hand gets it here)

    @staticmethod
    def prepare(model, threads: int | None = None, release=None, experts: bool = True) -> tuple[int, float]:
        """Copy the weights the variant's row-group kernels read interleaved (faster than the blocks as
        stored for one activation row or eight), each held by its weight (GGUFBlockWeight.interleaved):
        made once, before a user waits on a first token, and read by every step built for a new cache.
        `release(address, nbytes)` then drops the memory-mapped file's pages under each copied weight
        (ModelFile.release_pages), so the weights are in memory once; so does a weight read as stored
        whose rows were in llama.cpp's Q/K order (un-permuted here). `experts`: a mixture's experts
        copied too (False where the file does not fit in memory: read as stored, paged in as chosen).
        -> (bytes copied, seconds); nothing to do the second time."""
        kernels, t0, made = native.module(), time.perf_counter(), 0
        if kernels is None or not kernels.group_rows or not NativeStep.supports(model):
            return 0, 0.0
        for group in _groups(model, experts):
            base = 0
            for m in group:
                p = m.packed
                stored = p.stored
                if base % kernels.group_rows == 0 and p.interleaved_by != kernels.variant \
                        and p.interleave(kernels, threads, release):
                    made += p.interleaved.numel()
                elif release is not None and p.interleaved is None and p.blocks is not stored:
                    release(stored.data_ptr(), stored.numel())  # read as stored, un-permuted here (llama's Q/K)
                base += p.shape[0]
        return made, time.perf_counter() - t0

    def warm_up(self, cache) -> float:
        """One token through the step on a scratch `cache` (made for it, one row): what a first call
        makes (the RoPE tables, the C++ side's buffers, its threads) made while the model loads, not
        while a user waits on a first token, as llama.cpp's warm-up run does. -> seconds."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            self(torch.tensor([[0]]), cache, last_only=True)
        return time.perf_counter() - t0

    @staticmethod
    def decodes(model_file, preset=None) -> bool:
        """Whether a model file (a GGUF, an HF folder, an llmcli checkpoint) loaded on the CPU with
        `preset` (None: as stored) will decode through this step, read from its headers: a
        Llama-family or Gemma 3 model whose matrices will all be blocks the step multiplies
        (quant/held.py says how each is held)."""
        if native.module() is None or model_file.args.model_type not in MODEL_TYPES \
                or getattr(model_file.args, "clip_qkv", None) is not None:  # (OLMoE's clamp: not in the step)
            return False
        formats = model_formats(model_file, preset, torch.device("cpu"))
        return step_multiplies(formats, model_file.args.tie_word_embeddings, STEP_TYPES)

    @staticmethod
    def holds_rows(model_file, device: torch.device, dtype: torch.dtype, dtype_asked: bool = False) -> bool:
        """Whether an unquantized folder loads as F16/BF16 rows (quant/float_rows.py) for this step:
        on the CPU in float32 (native_placement's choice), where the step decodes it; a float32
        folder only where float32 was not asked for (`--dtype float32` keeps its weights exact)."""
        if model_file.is_gguf or model_file.quantization is not None or device.type != "cpu" \
                or dtype != torch.float32 or not NativeStep.decodes(model_file):
            return False
        return not dtype_asked or float_rows.exact(model_file.headers)

    @staticmethod
    def supports(model) -> bool:
        """Whether every layer is the family's plain decoder with GGUF-block projections on the CPU."""
        family = _FAMILIES.get(type(model))
        if family is None or native.module() is None:
            return False
        layer_type, act, _ = family
        if model.inv_freq.device.type != "cpu" or model.model.norm.weight.dtype != torch.float32:
            return False
        for layer in model.model.layers:
            if type(layer) is not layer_type or _act(layer.mlp) is not act:
                return False
            if layer_type in (moe.DecoderLayer, gpt_oss.DecoderLayer, olmoe.DecoderLayer) \
                    and not _takes_experts(layer.mlp):
                return False
            if getattr(layer.self_attn, "clip", None) is not None:  # (OLMoE's clamp of q, k, v)
                return False
            projections = _projections(layer)
            if projections is None or not all(_is_blocks(m) for group in projections for m in group):
                return False
        return _is_blocks(model.lm_head)

    @staticmethod
    def fits(cache) -> bool:
        """Whether `cache` is what the C++ step writes: a static cache on the CPU, float32 or float16
        (the default: keys and values rounded as they are written, read back as float32), of any
        number of rows."""
        return (type(cache) is StaticKVCache and cache.k[0].dtype in KV_DTYPES and cache.k[0].device.type == "cpu")

    def __call__(self, tokens, cache, positions=None, last_only: bool = False, hidden: bool = False, slots=None,
                 top: int = 0):
        B, T = tokens.shape
        rows, target = self._rows(B, T, cache, slots)
        self.last_top = None
        if rows is None:
            return self.model(tokens, cache, positions, last_only, hidden, slots=slots)
        if slots is None:  # one row, T tokens at the next slots
            at = torch.arange(cache.length, cache.length + T)
            positions = at if positions is None else positions.reshape(T)
        else:  # a batch: row b's one token at slots[b], which is its position too
            at = positions = slots.reshape(B)
        first = B * T - 1 if last_only and slots is None else 0
        logits, h = self._run(target, cache, tokens.reshape(B * T), rows, at, positions, first, top)
        if slots is None:
            cache.length += T
        shape = (B, 1) if slots is not None or last_only else (B, T)
        logits, h = logits.view(*shape, -1), h[first:].view(*shape, -1)
        return (logits, h) if hidden else logits

    def pieces(self, pieces: list[tuple[int, int, list[int]]], cache, top: int = 0) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Several rows of several tokens in one call: pieces (row, slot, token ids), each row's tokens
        at consecutive slots from `slot`, which are their positions too (batched.py's rows: a decode
        step's one token a row beside a new sequence's prompt). -> (logits (P, V), final normed
        hidden states (P, H)) of each piece's last token, or None where this call is not the step's
        (another kind of cache, a row outside it, more than MAX_TOKENS tokens). Each token's numbers
        are those it gets alone, as in any call."""
        n = sum(len(ids) for _, _, ids in pieces)
        self.last_top = None
        if not self.fits(cache) or not pieces or n > MAX_TOKENS or any(not ids for _, _, ids in pieces) \
                or any(not 0 <= row < cache.k[0].shape[0] or at + len(ids) > cache.max_len for row, at, ids in pieces):
            return None
        # the pieces' earlier tokens first, then each one's last: the logits are the last P rows'
        order = [(row, at + i, t) for row, at, ids in pieces for i, t in enumerate(ids[:-1])]
        order += [(row, at + len(ids) - 1, ids[-1]) for row, at, ids in pieces]
        rows, at, tokens = (torch.tensor(c, dtype=torch.long) for c in zip(*order))
        first = n - len(pieces)
        logits, h = self._run(cache, cache, tokens, rows, at, at, first, top)
        return logits, h[first:]

    def _run(self, target, cache, ids, rows, at, positions, first: int, top: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The C++ step on `target` (built again for a cache it has not seen): token ids (n,) at cache
        rows `rows`, slots `at`, RoPE `positions` -> (logits of tokens `first`.., soft-capped for
        Gemma; the final normed hidden states of every token); last_top as `top` asks (not with
        soft-capped logits: capping can make equal values of unequal ones, and their order is the
        index's). The C++ side looks the ids up in the embedding and RoPE tables itself, where it
        has them: as torch ops the lookups took a twentieth of a small model's token, each op slow
        right after a step; else (an embedding it cannot read, positions past the tables) the
        model's embed and _rope's rows go in."""
        if target is not self._cache:
            inv_freq = self.model.inv_freq_for(target.max_len)
            if inv_freq is not self._tables_of:  # LongRoPE's long factors past the original context
                made_of, tables = _TABLES.get(self.model, (None, None))
                self._tables, self._tables_of = (tables if made_of is inv_freq else None), inv_freq
            self._native, self._cache = self._build(target), target
        cap = getattr(self.model.args, "final_logit_softcapping", None)
        top = min(top, self._native.vocab) if not cap else 0
        out = None
        if self._native.embedding is not None:
            out = self._native.run_ids(ids, rows, at, positions, first, top)
            if out is None and self._cover(positions, cache):  # the tables grown: again
                out = self._native.run_ids(ids, rows, at, positions, first, top)
        if out is None:
            x = self.model.embed(ids.view(1, -1)).reshape(ids.shape[0], -1)
            out = self._native.run(x, rows, at, *self._rope(positions, cache), logits_from=first, top=top)
        logits, h, found = torch.from_numpy(out[0]), torch.from_numpy(out[1]), out[2]
        self.last_top = None if found is None else (torch.from_numpy(found[0]), torch.from_numpy(found[1]))
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits, h

    def _rows(self, B: int, T: int, cache, slots):
        """(the cache row of each of the B * T tokens, the cache the C++ side writes: `cache`, or the
        cache whose row `cache` is a view of), or (None, None) where this call is not the step's."""
        target = cache.parent if getattr(cache, "parent", None) is not None else cache
        if not self.fits(target):
            return None, None
        if slots is not None:
            ok = T == 1 and target is cache and B <= cache.k[0].shape[0]
            return (torch.arange(B), target) if ok else (None, None)
        if B != 1 or T > MAX_TOKENS or cache.length + T > cache.max_len or cache.k[0].shape[0] != 1:
            return None, None
        return torch.full((T,), getattr(cache, "index", 0), dtype=torch.int64), target

    def _rope(self, positions: torch.Tensor, cache) -> list[torch.Tensor]:
        """cos, sin (n, rotary_dim) for the positions, and Gemma's local layers' pair: rows of tables
        made once for positions [0, L) (L doubles as positions pass it). torch's cos and sin on the CPU
        start OpenMP threads for any size, which then spin beside the step's own threads: computed
        each step, they took a tenth of an 8-row step's time on 2 cores. The rows are taken with
        index_select, which stays on this thread for a few rows: `t[positions]` went parallel too, and
        with the embedding rows' gather and the picker's copy of the logits, an 8-row step took a fifth
        longer than without them (docs/performance-choices.md)."""
        if not self._cover(positions, cache):  # a long shifted conversation: computed for these positions alone
            return self._cos_sin(positions, cache)
        return [t.index_select(0, positions) for t in self._tables]

    def _cover(self, positions: torch.Tensor, cache) -> bool:
        """Make the tables (given to the C++ step too) cover the positions; False past TABLE_POSITIONS."""
        top = int(positions.max()) + 1
        if top > TABLE_POSITIONS:
            return False
        if self._tables is None or top > self._tables[0].shape[0]:
            have = 0 if self._tables is None else self._tables[0].shape[0]
            at = torch.arange(min(TABLE_POSITIONS, max(top, 2 * have, 1024)))
            self._tables = [t.to(torch.float32).contiguous() for t in self._cos_sin(at, cache)]
            self._native.set_rope(self._tables)
            _TABLES[self.model] = (self._tables_of, self._tables)
        return True

    def _cos_sin(self, positions: torch.Tensor, cache) -> list[torch.Tensor]:
        """cos, sin (n, rotary_dim) float32 of the positions (and Gemma's local layers' pair), from
        models/rope.py as the torch-free path makes them (its tables and these are the same numbers)."""
        m, at = self.model, positions.numpy()
        pairs = [rope.cos_sin(m.inv_freq_for(cache.max_len).numpy(), at, getattr(m, "attention_factor", 1.0))]
        if self._gemma:
            pairs.append(rope.cos_sin(m.inv_freq_local.numpy(), at))
        return [torch.from_numpy(t) for pair in pairs for t in pair]

    def _build(self, cache: StaticKVCache):
        args = self.model.args
        attn = self.model.model.layers[0].self_attn
        scale = attn.scale if attn.scale is not None else args.head_dim ** -0.5
        act = _FAMILIES[type(self.model)][2]
        step = native.module().step(args.num_attention_heads, args.num_key_value_heads, args.head_dim,
                                    args.rotary_dim, args.rms_norm_eps, scale, act, self.threads, self.refined)
        norm = _norm_weight(self._gemma)
        for i, layer in enumerate(self.model.model.layers):
            qkv, o, gate_up, down = (list(map(_spec, group)) for group in _projections(layer))
            a = layer.self_attn
            q_norm, k_norm = (norm(getattr(a, n)) if hasattr(a, n) else None for n in ("q_norm", "k_norm"))
            if self._gemma:  # norms on attention's and the MLP's outputs; local layers turn by their own table
                mlp_in, extra = layer.pre_feedforward_layernorm, dict(
                    attn_out_norm=norm(layer.post_attention_layernorm), mlp_out_norm=norm(layer.post_feedforward_layernorm),
                    local_rope=args.layer_types[i] == "sliding_attention")
            else:
                mlp_in, extra = layer.post_attention_layernorm, {}
            if hasattr(a, "sinks"):  # gpt-oss
                extra["sinks"] = a.sinks.detach().float()
            if getattr(args, "whole_qk_norm", False):  # OLMoE: (H D,) and (KV D,) norms
                extra["whole_qk_norm"] = True
            step.add_layer(norm(layer.input_layernorm), qkv, q_norm, k_norm, o, norm(mlp_in), gate_up, down,
                            cache.k[i], cache.v[i], a.window or 0, **extra)
            if isinstance(layer.mlp, moe.SparseMoe):
                m = layer.mlp
                step.set_experts(i, _router(m.gate), [tuple(_spec(p) for p in (x.gate_proj, x.up_proj, x.down_proj))
                                                      for x in m.experts], m.top_k, m.normalize or not m.softmax_first)
                if hasattr(m, "shared_expert"):
                    x = m.shared_expert
                    step.set_shared_expert(i, _router(m.shared_expert_gate),
                                           tuple(_spec(p) for p in (x.gate_proj, x.up_proj, x.down_proj)))
                if m.gate.bias is not None:
                    step.set_router_bias(i, m.gate.bias.detach().float())
        step.set_head(norm(self.model.model.norm), [_spec(self.model.lm_head)])
        emb = self.model.model.embed_tokens  # as the model's embed gives its rows (Gemma: times its normalizer)
        scale = float(self.model.embed_scale(torch.float32)) if self._gemma else 1.0
        if getattr(emb, "dtype", None) == torch.float32 and isinstance(getattr(emb, "packed", None), GGUFBlockWeight) \
                and emb.packed.device.type == "cpu":
            step.set_embedding(emb.packed.blocks, TYPE_IDS[emb.packed.type_name], scale)
        elif isinstance(emb, torch.nn.Embedding) and emb.weight.dtype == torch.float32 and emb.weight.device.type == "cpu":
            step.set_embedding(emb.weight, None, scale)
        if self._tables is not None:
            step.set_rope(self._tables)
        return step


def _norm_weight(gemma: bool):
    """An RMSNorm module -> the float32 vector the C++ side multiplies by: Gemma's 1 + w, folded in."""
    if gemma:
        return lambda m: 1.0 + m.weight.detach().float()
    return lambda m: m.weight.detach()


def _act(mlp):
    """An MLP's activation (a mixture of experts: its experts')."""
    return mlp.experts[0].act if isinstance(mlp, moe.SparseMoe) else mlp.act


def _takes_experts(mlp) -> bool:
    """Whether the C++ step runs this MLP as its experts: a SparseMoe whose experts' matrices (and its
    shared expert's) are GGUF blocks (read as stored), routers it can read as float32; gpt-oss's
    experts with the SwiGLU's constants the C++ side has."""
    if not isinstance(mlp, moe.SparseMoe):
        return False
    if isinstance(mlp.experts[0], gpt_oss.Expert) and (mlp.experts[0].alpha, mlp.experts[0].limit) != SWIGLU_OAI:
        return False
    shared = [mlp.shared_expert] if hasattr(mlp, "shared_expert") else []
    experts = [p for x in [*mlp.experts, *shared] for p in (x.gate_proj, x.up_proj, x.down_proj)]
    routers = [mlp.gate, *([mlp.shared_expert_gate] if shared else [])]
    return all(_is_blocks(p) for p in experts) and all(_is_blocks(r) or r.weight.device.type == "cpu" for r in routers)


def _router(gate) -> torch.Tensor:
    """A router's (E, hidden) weight in float32 (its blocks dequantized: llama-quantize leaves it F32)."""
    if _is_blocks(gate):
        p = gate.packed
        return native.module().dequantize(p.blocks, TYPE_IDS[p.type_name], p.shape[1])
    return gate.weight.detach().float().contiguous()


def _projections(layer):
    """The layer's projection modules in four groups (q/k/v, o, gate/up, down), fused or not (a
    mixture of experts: its first expert's gate/up and down, which add_layer checks the shapes of;
    set_experts gives them all)."""
    a, m = layer.self_attn, layer.mlp
    if isinstance(m, moe.SparseMoe):
        m = m.experts[0]
    qkv = [a.qkv_proj] if hasattr(a, "qkv_proj") else [getattr(a, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    gate_up = [m.gate_up_proj] if hasattr(m, "gate_up_proj") else [getattr(m, n, None) for n in ("gate_proj", "up_proj")]
    groups = (qkv, [a.o_proj], gate_up, [m.down_proj])
    return None if any(p is None for g in groups for p in g) else groups


def _groups(model, experts: bool = True):
    """The model's projections in the groups the step reads them in: each layer's four, then the head
    (a mixture of experts: attention's two, then each expert's gate/up and its down where `experts`;
    a shared expert is read as stored)."""
    for layer in model.model.layers:
        groups = _projections(layer) or ()
        if isinstance(layer.mlp, moe.SparseMoe):
            yield from groups[:2]
            if experts:
                for x in layer.mlp.experts:
                    yield from ([x.gate_proj, x.up_proj], [x.down_proj])
        else:
            yield from groups
    yield [model.lm_head]


def _is_blocks(module) -> bool:
    packed = getattr(module, "packed", None)
    return isinstance(packed, GGUFBlockWeight) and packed.device.type == "cpu" and packed.shape[1] % 32 == 0


_EMPTY = torch.empty(0)


def _spec(module):
    """(blocks or their interleaved copy, type id, K, bias or empty, N) as native.step.Step.add_layer
    takes a projection."""
    p = module.packed
    bias = module.bias.detach() if module.bias is not None else _EMPTY
    copy = p.interleaved if p.interleaved_by == native.module().variant else None
    return (p.blocks if copy is None else copy), TYPE_IDS[p.type_name], p.shape[1], bias, p.shape[0]
