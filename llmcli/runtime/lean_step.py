"""The torch-free CPU path's model: a GGUF file's Llama-family, Gemma 3, mixture-of-experts or gpt-oss
model as the native decode step (native/step.py), built straight from the file's blocks with numpy,
never a torch module.

    model = LeanModel.open(model_file, threads, kernels)    None where the file is not for this path
    cache = model.new_cache(ctx)                             numpy float16 KV (cache/host.py)
    logits, top = model(ids, cache, last_only=True, top=8)   float32 (n, vocab); the k largest

The numbers are native_step.py's (the torch path's step for the same file): the same C++ step, the
same weights (interleaved once at load from the file's blocks, its pages released as they are
copied, llama's Q/K rows taken in HF order; experts too where the file fits in memory), the same norms,
embedding and RoPE tables (models/rope.py), gpt-oss's sinks, biases and router bias. What it does
not cover (another family, a block type the step does not multiply, LongRoPE) stays on the torch
path: open() says None and the caller loads the model with torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..cache.host import HostKVCache
from ..formats import gguf
from ..models import rope
from ..native.checks import TYPE_IDS
from ..native.step import SWIGLU_OAI
from ..quant import precision
from ..native.interleave import interleave_rows, unpermute_blocks, unpermuted_order

ACTIVATIONS = {"llama": "silu", "mistral": "silu", "qwen2": "silu", "qwen3": "silu", "gemma3_text": "gelu_tanh",
               "qwen3_moe": "silu", "mixtral": "silu", "qwen2_moe": "silu",  # (mixtures of experts: every layer's)
               "olmoe": "silu", "gpt_oss": "swiglu_oai"}  # (api.h's act 2: gpt-oss's clamped SwiGLU, SWIGLU_OAI)
MAX_TOKENS = 512  # tokens of one call (native_step.MAX_TOKENS): a longer prompt goes in several
TABLE_POSITIONS = 1 << 16  # RoPE rows made once (native_step.TABLE_POSITIONS); a longer context: not this path
_EMPTY = np.empty(0, np.float32)


@dataclass
class Weight:
    """One matrix as the step reads it: `data` (the file's blocks (N, row bytes), or their interleaved
    copy, 1-d), its type id, K and N, and its bias (float32, or empty)."""

    data: np.ndarray
    type_id: int
    K: int
    N: int
    bias: np.ndarray = field(default_factory=lambda: _EMPTY)
    stored: np.ndarray | None = None  # the file's blocks (rescoring reads the head's rows from them)
    heads: int | None = None  # rows stored in llama.cpp's Q/K order, of this many heads (copied in HF order)

    def spec(self) -> tuple:
        return self.data, self.type_id, self.K, self.bias, self.N


@dataclass
class Layer:
    qkv: list[Weight]
    o: list[Weight]
    gate_up: list[Weight]
    down: list[Weight]
    norms: dict  # in_norm, post_norm, q_norm, k_norm, attn_out_norm, mlp_out_norm: float32 vectors or None
    window: int
    router: np.ndarray | None = None  # a mixture of experts: (E, hidden) float32
    experts: list | None = None  # [(gate, up, down) Weights], each expert's rows of the file's 3-D tensors
    shared: tuple | None = None  # qwen2moe's shared expert: (its gate (hidden,) float32, (gate, up, down) Weights)
    sinks: np.ndarray | None = None  # gpt-oss: (heads,) float32 logits joining each head's softmax
    router_bias: np.ndarray | None = None  # gpt-oss: (E,) float32 on the router's logits


class LeanModel:
    """A GGUF model on the CPU as one C++ call a step, without torch."""

    native = True
    torch_free = True  # (bench's measurements and others ask)

    def __init__(self, args, kernels, threads: int, layers: list[Layer], head: Weight, head_norm: np.ndarray,
                 embedding: tuple[np.ndarray, int | None], scale: float, act: str, copy_experts: bool = True):
        self.args, self.kernels, self.threads = args, kernels, threads
        self.layers, self.head, self.head_norm = layers, head, head_norm
        self.embedding, self.embed_scale, self.act = embedding, scale, act
        self.gemma = args.model_type == "gemma3_text"
        self.attn_scale = args.query_pre_attn_scalar ** -0.5 if self.gemma else args.head_dim ** -0.5
        self.interleaved = (0, 0.0)  # bytes copied for the kernels at load, seconds
        self.refined = 0  # the activations made int8x2 (native/step.py's REFINE mask; quant/precision.py chooses)
        # a mixture's experts interleaved as the dense weights are (their pages released: in memory once),
        # else read as stored: 1.5x the prefill and 1.17x the decode of the blocks as stored
        # (docs/performance-log.md, 2026-11-28)
        self.copy_experts = copy_experts
        # (the cache, the C++ step built on it), replaced whole: a server's embedding thread builds
        # steps of its own beside the decoding thread's (each step has its own team of threads)
        self._built = (None, None)
        self._tables: list[np.ndarray] | None = None  # cos, sin (and the local pair) of positions [0, L)

    # ------------------------------------------------------------------ building

    @classmethod
    def open(cls, model_file, threads: int, kernels, release=None, copy_experts: bool = True) -> "LeanModel | None":
        """The model of a GGUF file, its weights copied for the kernels (`release(address, nbytes)`:
        the file's pages under what was copied are dropped); None where this path does not run it.
        `copy_experts`: a mixture's experts copied too (False where the file does not fit in memory:
        then read as the file stores them, paged in as tokens choose them)."""
        if not model_file.is_gguf or kernels is None:
            return None
        args, arch = model_file.args, model_file.architecture
        if args.model_type not in ACTIVATIONS or (args.rope_scaling or {}).get("rope_type") == "longrope" \
                or getattr(args, "clip_qkv", None) is not None:  # (OLMoE's clamp of q, k, v: not in the step)
            return None
        if args.model_type == "gpt_oss" and (args.swiglu_alpha, args.swiglu_limit) != SWIGLU_OAI:
            return None
        tensors = {t.name: t for t in model_file.reader.tensors}
        t0 = time.perf_counter()
        found = _read(tensors, args, arch)
        if found is None:
            return None
        layers, head, head_norm, embedding = found
        scale = float(np.float32(args.hidden_size ** 0.5)) if args.model_type == "gemma3_text" else 1.0
        model = cls(args, kernels, threads, layers, head, head_norm, embedding, scale, ACTIVATIONS[args.model_type],
                    copy_experts)
        model.refined = precision.choose(model_file.nbytes)  # (the torch path's step alike: runtime/loader.py)
        made = model._prepare(release)
        model.interleaved = (made, time.perf_counter() - t0)
        return model

    def _prepare(self, release) -> int:
        """Interleave what the row-group kernels take (a projection starting a row group of its
        group), un-permute llama's Q/K rows read as stored; -> bytes copied."""
        made, R = 0, self.kernels.group_rows
        groups = [g for layer in self.layers
                  for g in ((layer.qkv, layer.o) if layer.experts else (layer.qkv, layer.o, layer.gate_up, layer.down))]
        groups.append([self.head])
        if self.copy_experts:  # each expert's gate/up, then its down (qwen2moe's shared expert: as stored)
            groups += [g for layer in self.layers for x in (layer.experts or ()) for g in (list(x[:-1]), [x[-1]])]
        for group in groups:
            base = 0
            for w in group:
                heads, copy = w.heads, None
                if R and base % R == 0:  # (a variant without row-group kernels reads every weight as stored)
                    copy = interleave_rows(self.kernels, w.data, w.type_id, w.K, heads, self.threads, release)
                if copy is not None:
                    w.data, made = copy, made + copy.nbytes
                elif heads is not None:  # read as stored: in HF order, once
                    w.data = unpermute_blocks(w.data, heads)
                    if release is not None:
                        release(w.stored.ctypes.data, w.stored.nbytes)
                base += w.N
        return made

    def held_bytes(self) -> int:
        """The weights' bytes as the step reads them: each matrix's copy or blocks, the norms, the
        embedding table (a tied head's blocks counted once)."""
        seen, total = set(), 0
        arrays = [w.data for layer in self.layers for g in (layer.qkv, layer.o, layer.gate_up, layer.down) for w in g]
        arrays += [w.data for layer in self.layers for x in (layer.experts or ()) for w in x]
        arrays += [a for layer in self.layers if layer.shared for a in (layer.shared[0], *(w.data for w in layer.shared[1]))]
        arrays += [a for layer in self.layers for a in (layer.router, layer.sinks, layer.router_bias) if a is not None]
        arrays += [n for layer in self.layers for n in layer.norms.values() if n is not None]
        arrays += [self.head.data, self.head_norm, self.embedding[0]]
        for a in arrays:
            if a.ctypes.data not in seen:
                seen.add(a.ctypes.data)
                total += a.nbytes
        return total

    def float_types(self) -> set[str]:
        """The block types among the matrices that take float32 activations as they are (F16, BF16,
        Q5_K: native/README.md), whatever `refined` says."""
        names = {v: k for k, v in TYPE_IDS.items()}
        ws = [w for layer in self.layers for g in (layer.qkv, layer.o, layer.gate_up, layer.down) for w in g]
        ws += [w for layer in self.layers for x in (layer.experts or ()) for w in x] + [self.head]
        return {names[w.type_id] for w in ws} & {"F16", "BF16", "Q5_K"}

    # ------------------------------------------------------------------ running

    def new_cache(self, max_len: int, rows: int = 1) -> HostKVCache:
        return HostKVCache.for_model(self.args, max_len, np.float16, rows)

    def __call__(self, ids: list[int], cache: HostKVCache, last_only: bool = True, top: int = 0):
        """Run `ids` at the cache's next slots (a one-row cache) -> (logits (1 or n, vocab) float32,
        the final normed hidden states of the same tokens (1 or n, hidden), (values, indices) of each
        logit row's `top` largest, or None)."""
        n = len(ids)
        if n == 0 or n > MAX_TOKENS or cache.length + n > cache.max_len:
            raise ValueError(f"{n} tokens do not fit one call at slot {cache.length} of {cache.max_len}")
        step = self._step_for(cache)
        at = np.arange(cache.length, cache.length + n, dtype=np.int64)
        first = n - 1 if last_only else 0
        logits, h, found = step.run_ids(np.asarray(ids, dtype=np.int64), np.zeros(n, np.int64), at, at, first, top)
        cache.length += n
        return logits, h[first:], found

    def pieces(self, pieces: list[tuple[int, int, list[int]]], cache: HostKVCache, top: int = 0):
        """Several rows of several tokens in one call: pieces (row, slot, token ids), each row's tokens
        at consecutive slots from `slot`, which are their positions too (batched.py's rows) -> (logits
        (P, vocab), final normed hidden states (P, hidden), (values, indices) (P, top) or None) of each
        piece's last token. Each token's numbers are those it gets alone."""
        n = sum(len(ids) for _, _, ids in pieces)
        if not pieces or n > MAX_TOKENS or any(not ids or not 0 <= row < cache.k[0].shape[0]
                                               or at < 0 or at + len(ids) > cache.max_len for row, at, ids in pieces):
            raise ValueError("pieces that do not fit one call or the cache")
        # the pieces' earlier tokens first, then each one's last: the logits are the last P rows'
        order = [(row, at + i, t) for row, at, ids in pieces for i, t in enumerate(ids[:-1])]
        order += [(row, at + len(ids) - 1, ids[-1]) for row, at, ids in pieces]
        rows, at, ids = (np.asarray(c, dtype=np.int64) for c in zip(*order))
        first = n - len(pieces)
        logits, h, found = self._step_for(cache).run_ids(ids, rows, at, at, first, top)
        return logits, h[first:], found

    def prefill(self, ids: list[int], cache: HostKVCache, top: int = 0):
        """A prompt of any length into the cache, MAX_TOKENS a call -> the last call's outputs (the
        last token's logits, hidden state and top)."""
        for i in range(0, len(ids), MAX_TOKENS):
            out = self(ids[i:i + MAX_TOKENS], cache, last_only=True, top=top)
        return out

    def prefill_row(self, ids: list[int], cache: HostKVCache, row: int, start: int):
        """A prompt into row `row` of a cache of rows from slot `start`, MAX_TOKENS a call -> the last
        call's pieces() outputs (batched.py's prompt prefilled alone)."""
        for i in range(0, len(ids), MAX_TOKENS):
            out = self.pieces([(row, start + i, ids[i:i + MAX_TOKENS])], cache)
        return out

    def window_logits(self, ids: list[int], first: int) -> np.ndarray:
        """A text alone through a cache of its own, as a prompt's prefill runs it -> the logits
        (len(ids) - first, vocab) float32 of positions first.. (only those rows go through the head):
        what perplexity scores."""
        cache = self.new_cache(max(len(ids), 1))
        step = self._build(cache)  # (its own step, as hidden_states')
        out = []
        for i in range(0, len(ids), MAX_TOKENS):
            piece = np.asarray(ids[i:i + MAX_TOKENS], dtype=np.int64)
            at = np.arange(i, i + len(piece), dtype=np.int64)
            skip = min(max(first - i, 0), len(piece))
            logits, _, _ = step.run_ids(piece, np.zeros(len(piece), np.int64), at, at, skip, 0)
            cache.length += len(piece)
            out.append(logits)
        return np.concatenate(out)

    def hidden_states(self, ids: list[int]) -> np.ndarray:
        """The final normed hidden states (n, hidden) of a text, run alone through a cache of its own
        (no logits made): what an embedding pools."""
        cache = self.new_cache(max(len(ids), 1))
        step = self._build(cache)  # (its own step: it may run beside another thread's decode step)
        out = []
        for i in range(0, len(ids), MAX_TOKENS):
            piece = np.asarray(ids[i:i + MAX_TOKENS], dtype=np.int64)
            at = np.arange(cache.length, cache.length + len(piece), dtype=np.int64)
            _, h, _ = step.run_ids(piece, np.zeros(len(piece), np.int64), at, at, len(piece), 0)
            cache.length += len(piece)
            out.append(h)
        return np.concatenate(out)

    def warm_up(self, cache: HostKVCache) -> float:
        """One token through the step on `cache` (then forgotten): the C++ side's buffers and threads
        made while the model loads, not while a user waits on a first token. -> seconds."""
        t0 = time.perf_counter()
        self([0], cache)
        cache.truncate(0)
        return time.perf_counter() - t0

    def rescore(self, logits: np.ndarray, h: np.ndarray, ids) -> None:
        """logits[ids] recomputed from the head's rows (dequantized, float64 sums) and the hidden state
        `h` (hidden,), in place: near-tied candidates decided by exact arithmetic (decode/picker.py)."""
        w = self.head
        self.kernels.dot_rows_into(w.stored, w.type_id, w.K, np.asarray(ids, dtype=np.int64), h, logits)

    def _step_for(self, cache: HostKVCache):
        built, step = self._built
        if built is cache:
            return step
        step = self._build(cache)
        self._built = (cache, step)
        return step

    def _build(self, cache: HostKVCache):
        if cache.max_len > TABLE_POSITIONS:
            raise ValueError(f"a context of {cache.max_len} is past the RoPE tables")
        a = self.args
        step = self.kernels.step(a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.rotary_dim, a.rms_norm_eps,
                                 self.attn_scale, self.act, self.threads, self.refined)
        for i, layer in enumerate(self.layers):
            nm = layer.norms
            step.add_layer(nm["in_norm"], [w.spec() for w in layer.qkv], nm["q_norm"], nm["k_norm"],
                           [w.spec() for w in layer.o], nm["post_norm"], [w.spec() for w in layer.gate_up],
                           [w.spec() for w in layer.down], cache.k[i], cache.v[i], layer.window,
                           attn_out_norm=nm["attn_out_norm"], mlp_out_norm=nm["mlp_out_norm"],
                           local_rope=self.gemma and a.layer_types[i] == "sliding_attention", sinks=layer.sinks,
                           whole_qk_norm=getattr(a, "whole_qk_norm", False))  # (OLMoE: norms of all heads at once)
            if layer.experts:
                step.set_experts(i, layer.router, [tuple(w.spec() for w in x) for x in layer.experts],
                                 a.num_experts_per_tok, a.norm_topk_prob or not a.softmax_first)
            if layer.router_bias is not None:
                step.set_router_bias(i, layer.router_bias)
            if layer.shared:
                step.set_shared_expert(i, layer.shared[0], tuple(w.spec() for w in layer.shared[1]))
        step.set_head(self.head_norm, [self.head.spec()])
        step.set_embedding(self.embedding[0], self.embedding[1], self.embed_scale)
        if self._tables is None or self._tables[0].shape[0] < cache.max_len:
            self._tables = self._make_tables(max(cache.max_len, 1024))
        step.set_rope(self._tables)
        return step

    def _make_tables(self, L: int) -> list[np.ndarray]:
        at = np.arange(min(L, TABLE_POSITIONS))
        tables = list(rope.cos_sin(rope.inv_freq(self.args), at, rope.attention_factor(self.args)))
        if self.gemma:
            tables += rope.cos_sin(rope.inv_freq(self.args, theta=self.args.rope_local_base_freq, scaling={}), at)
        return tables


# ---------------------------------------------------------------------- reading the file


def _read(tensors: dict, args, arch: str):
    """(layers, head, head norm, (embedding table, type id or None)) from the file's tensors; None where
    a matrix is of a type the step does not multiply or a tensor is missing."""
    gemma = args.model_type == "gemma3_text"
    permuted = gguf.permuted(arch)

    def norm(name: str) -> np.ndarray | None:
        t = tensors.get(name)
        if t is None:
            return None
        v = np.asarray(t.data, dtype=np.float32).reshape(-1)
        # gemma3's converter stores 1 + w; the torch path reads w (HF's) and gives the step 1 + w back
        return (np.float32(1.0) + (v - np.float32(1.0))).astype(np.float32) if gemma else v

    def matrix(name: str, heads: int | None = None) -> Weight | None:
        t = tensors.get(name + ".weight")
        if t is None or t.tensor_type.name not in TYPE_IDS:
            return None
        type_name = t.tensor_type.name
        N, K = gguf.tensor_shape(t)
        if K % 32:
            return None
        blocks = t.data if type_name != "F16" else t.data.view(np.uint8)
        bias_t = tensors.get(name + ".bias")
        bias = _EMPTY if bias_t is None else np.asarray(bias_t.data, dtype=np.float32).reshape(-1)
        heads = heads if permuted else None
        if heads is not None and bias.size:  # in HF order, as the rows will be
            bias = bias[unpermuted_order(N, heads)]
        return Weight(blocks, TYPE_IDS[type_name], K, N, bias, stored=blocks, heads=heads)

    def vectors(name: str) -> np.ndarray | None:
        """A float32 tensor of the file as it is (2-D: rows of vectors), or None."""
        t = tensors.get(name)
        return None if t is None else np.ascontiguousarray(np.asarray(t.data, dtype=np.float32))

    def experts(b: str):
        """A layer's router (float32) and each expert's (gate, up, down), rows of the 3-D tensors (with
        their rows of gpt-oss's (E, N) bias tensors)."""
        router = tensors.get(b + "ffn_gate_inp.weight")
        parts = [tensors.get(f"{b}ffn_{kind}_exps.weight") for kind in ("gate", "up", "down")]
        if router is None or any(t is None or t.tensor_type.name not in TYPE_IDS for t in parts):
            return None, None
        gguf.check_router(router, args)  # (shapes against the metadata: one error line naming the tensor)
        for kind, t in zip(("gate", "up", "down"), parts):
            next(gguf.expert_tensors(t, b, kind, args))
        stacks = [(t.data if t.tensor_type.name != "F16" else t.data.view(np.uint8), t) for t in parts]
        biases = [vectors(f"{b}ffn_{kind}_exps.bias") for kind in ("gate", "up", "down")]
        out = []
        for e in range(args.num_experts):
            ws = []
            for (data, t), bias in zip(stacks, biases):
                _, N, K = gguf.tensor_shape(t)
                if K % 32 or (bias is not None and bias.shape != (args.num_experts, N)):
                    return None, None
                ws.append(Weight(data[e], TYPE_IDS[t.tensor_type.name], K, N, _EMPTY if bias is None else bias[e],
                                 stored=data[e]))
            out.append(tuple(ws))
        return np.ascontiguousarray(gguf.dequantize(router), dtype=np.float32), out

    layers = []
    moe = getattr(args, "num_experts", None) is not None
    for i in range(args.num_hidden_layers):
        b = f"blk.{i}."
        q, k, v = (matrix(b + "attn_q", args.num_attention_heads), matrix(b + "attn_k", args.num_key_value_heads),
                   matrix(b + "attn_v"))
        router, chosen = experts(b) if moe else (None, None)
        if moe and chosen is None:
            return None
        o = matrix(b + "attn_output")
        gate, up, down = chosen[0] if moe else (matrix(b + "ffn_gate"), matrix(b + "ffn_up"), matrix(b + "ffn_down"))
        if any(m is None for m in (q, k, v, o, gate, up, down)):
            return None
        norms = {"in_norm": norm(b + "attn_norm.weight"), "q_norm": norm(b + "attn_q_norm.weight"),
                 "k_norm": norm(b + "attn_k_norm.weight"), "attn_out_norm": None, "mlp_out_norm": None}
        if gemma:
            norms.update(post_norm=norm(b + "ffn_norm.weight"), attn_out_norm=norm(b + "post_attention_norm.weight"),
                         mlp_out_norm=norm(b + "post_ffw_norm.weight"))
        else:  # (gpt-oss's norm before its experts is post_attention_norm)
            before_mlp = "post_attention_norm" if args.model_type == "gpt_oss" else "ffn_norm"
            norms["post_norm"] = norm(b + before_mlp + ".weight")
        if norms["in_norm"] is None or norms["post_norm"] is None or (args.qk_norm and norms["q_norm"] is None):
            return None
        shared = None
        if getattr(args, "shared_expert_intermediate_size", 0):
            shared = (norm(b + "ffn_gate_inp_shexp.weight"), tuple(matrix(f"{b}ffn_{kind}_shexp") for kind in ("gate", "up", "down")))
            if shared[0] is None or shared[0].size != args.hidden_size or any(w is None for w in shared[1]):
                return None
        sinks, router_bias = vectors(b + "attn_sinks.weight"), vectors(b + "ffn_gate_inp.bias")
        if args.model_type == "gpt_oss" and (sinks is None or router_bias is None):
            return None
        layers.append(Layer([q, k, v], [o], [gate, up], [down], norms, args.layer_window(i) or 0, router, chosen,
                            shared, sinks, router_bias))
    embd = tensors.get("token_embd.weight")
    head = matrix("output") if "output.weight" in tensors else matrix("token_embd")
    head_norm = norm("output_norm.weight")
    if embd is None or head is None or head_norm is None:
        return None
    if embd.tensor_type.name == "F32":
        embedding = (np.asarray(embd.data), None)
    elif embd.tensor_type.name in TYPE_IDS:
        embedding = (embd.data if embd.tensor_type.name != "F16" else embd.data.view(np.uint8),
                     TYPE_IDS[embd.tensor_type.name])
    else:
        return None
    return layers, head, head_norm, embedding
