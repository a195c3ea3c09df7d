"""Step: src/step.cpp's decode step of a Llama-family model (or Gemma 3) for n tokens at once, through
ctypes (runtime/native_step.py's NativeStep drives it). The C side keeps pointers into the tensors
given here (weights, norms, the cache); this object keeps them alive. It takes numpy arrays (the
torch-free CPU path) or CPU torch tensors (runtime/native_step.py's; viewed as arrays, never copied)
and returns numpy arrays."""

from __future__ import annotations

import ctypes

import numpy as np

from .checks import array, check_blocks

_P, _I64 = ctypes.c_void_p, ctypes.c_int64


class Projection(ctypes.Structure):  # api.h's LlmcliProjection
    _fields_ = [("blocks", _P), ("bias", _P), ("type", _I64), ("N", _I64), ("K", _I64), ("grouped", _I64)]


class Layer(ctypes.Structure):  # api.h's LlmcliLayer
    _fields_ = [("in_norm", _P), ("post_norm", _P), ("q_norm", _P), ("k_norm", _P),
                ("attn_out_norm", _P), ("mlp_out_norm", _P),
                ("qkv", ctypes.POINTER(Projection)), ("o", ctypes.POINTER(Projection)),
                ("gate_up", ctypes.POINTER(Projection)), ("down", ctypes.POINTER(Projection)),
                ("n_qkv", _I64), ("n_o", _I64), ("n_gate_up", _I64), ("n_down", _I64),
                ("k_cache", _P), ("v_cache", _P), ("k_strides", _I64 * 3), ("v_strides", _I64 * 3),
                ("rows", _I64), ("max_len", _I64), ("window", _I64), ("local_rope", _I64), ("kv_half", _I64),
                ("sinks", _P), ("whole_qk_norm", _I64)]


ACTIVATIONS = {"silu": 0, "gelu_tanh": 1, "swiglu_oai": 2}  # api.h's act (2: gpt-oss's clamped SwiGLU)
SWIGLU_OAI = (1.702, 7.0)  # act 2's (alpha, limit), fixed in the C++ step: a model with others is not its to run
# api.h's kRefine*: the activations a step makes int8x2 (16-bit codes as two int8 rows, ~15 bits)
# rather than int8. "normed": the layers' norms' outputs (q/k/v, gate/up); "attention": o's input;
# "mlp": down's input; "head": the final norm's output (the output projection's input)
REFINE = {"normed": 1, "attention": 2, "mlp": 4, "head": 8}
REFINE_ALL = 15


def refine_mask(refined) -> int:
    """A step's `refined`: True (all), False (none), a mask, or names of REFINE -> the mask."""
    if isinstance(refined, bool):
        return REFINE_ALL if refined else 0
    if isinstance(refined, int):
        return refined & REFINE_ALL
    return sum(REFINE[name] for name in set(refined))


def refined_names(mask: int) -> list[str]:
    return [name for name, bit in REFINE.items() if mask & bit]
KV_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # a cache the step reads and writes


def declare(lib) -> None:
    """The step's C signatures on a freshly loaded library (library.Kernels does this)."""
    lib.llmcli_step_new.restype = _P
    lib.llmcli_step_new.argtypes = [_I64, _I64, _I64, _I64, ctypes.c_float, ctypes.c_float, _I64, ctypes.c_int,
                                    ctypes.c_int]
    lib.llmcli_step_add_layer.argtypes = [_P, ctypes.POINTER(Layer)]
    lib.llmcli_step_set_head.argtypes = [_P, _P, ctypes.POINTER(Projection), _I64]
    lib.llmcli_step_set_experts.argtypes = [_P, _I64, _P, _I64, _I64, _I64, ctypes.POINTER(Projection)]
    lib.llmcli_step_set_router_bias.argtypes = [_P, _I64, _P]
    lib.llmcli_step_set_shared_expert.argtypes = [_P, _I64, _P, ctypes.POINTER(Projection)]
    lib.llmcli_step_run.argtypes = [_P, _I64, _P, _P, _P, _P, _P, _P, _P, _I64, _P, _P, _I64, _P, _P]
    lib.llmcli_step_set_embedding.argtypes = [_P, _P, ctypes.c_int, _I64, ctypes.c_float]
    lib.llmcli_step_set_rope.argtypes = [_P, _P, _P, _P, _P, _I64]
    lib.llmcli_step_run_ids.argtypes = [_P, _I64, _P, _P, _P, _P, _I64, _P, _P, _I64, _P, _P]
    lib.llmcli_step_free.argtypes = [_P]
    lib.llmcli_step_free.restype = None


class Step:
    """`Step(n_heads, n_kv, head_dim, rotary_dim, eps, scale, act, threads, refined)`, then `add_layer`
    per layer and `set_head`; `run(x, rows, slots, cos, sin, ...) -> (logits, hidden, top)` per step of
    n tokens. `refined`: which activations go into the integer dot products as int8x2 (native.mm's),
    the others int8 (refine_mask: True for all)."""

    def __init__(self, lib, n_heads: int, n_kv: int, head_dim: int, rotary_dim: int, eps: float, scale: float,
                 act: str, threads: int, refined=False):
        if n_heads % n_kv or rotary_dim % 2 or rotary_dim > head_dim or act not in ACTIVATIONS:
            raise ValueError("inconsistent shapes")
        self._lib = lib
        self.H, self.KV, self.D, self.R = n_heads, n_kv, head_dim, rotary_dim
        self._h = lib.llmcli_step_new(n_heads, n_kv, head_dim, rotary_dim, eps, scale, ACTIVATIONS[act], threads,
                                      refine_mask(refined))
        self.refined = refine_mask(refined)  # (a mask: truthy where any activation is int8x2)
        self._keep = []  # every tensor and ctypes array the C side points into
        self.hidden = self.inter = self.vocab = None
        self.max_len = self.rows = None
        self.local = False  # some layer turns by the second RoPE table
        self.embedding = None  # set_embedding's table (run_ids looks tokens up in it)
        self.table_len = 0  # positions set_rope's tables cover
    def __del__(self):
        if getattr(self, "_h", None):
            self._lib.llmcli_step_free(self._h)
            self._h = None

    def _floats(self, t) -> int | None:
        if t is None:
            return None
        t = np.ascontiguousarray(array(t), dtype=np.float32)
        if t.size == 0:
            return None
        self._keep.append(t)
        return t.ctypes.data

    def _group(self, specs) -> tuple[ctypes.Array, int, int]:
        """[(blocks, GGUF type id, K, bias or an empty tensor, N)] -> (array of projections, rows, K).
        blocks: (N, row bytes) as stored, or a 1-d uint8 tensor, their copy interleaved for the row-group
        kernels (library.Kernels.interleave)."""
        if not specs:
            raise ValueError("a projection group is empty")
        arr = (Projection * len(specs))()
        for p, (blocks, type_id, K, bias, N) in zip(arr, specs):
            blocks, bias = array(blocks), array(bias)
            grouped = blocks.ndim == 1
            if grouped:
                if blocks.dtype != np.uint8 or blocks.size != self._lib.llmcli_grouped_bytes(type_id, N, K) \
                        or not blocks.flags.c_contiguous:
                    raise ValueError("an interleaved copy does not match its projection")
            else:
                blocks = np.ascontiguousarray(blocks)
                check_blocks(blocks, type_id, K)
            if K % 32 or K != specs[0][2] or (not grouped and blocks.shape[0] != N):
                raise ValueError("a group's projections read inputs of one size, a multiple of 32")
            if bias.size and bias.size != N:
                raise ValueError("bias does not match the rows")
            self._keep.append(blocks)
            p.blocks, p.bias, p.type, p.N, p.K, p.grouped = blocks.ctypes.data, self._floats(bias), type_id, N, K, grouped
        self._keep.append(arr)
        return ctypes.cast(arr, ctypes.POINTER(Projection)), sum(p.N for p in arr), specs[0][2]

    def add_layer(self, in_norm, qkv, q_norm, k_norm, o, post_norm, gate_up, down, k_cache, v_cache,
                  window: int, attn_out_norm=None, mlp_out_norm=None, local_rope: bool = False, sinks=None,
                  whole_qk_norm: bool = False) -> None:
        """The norms are (hidden,) float32 vectors as the C side multiplies by them (a model that scales
        by 1 + w passes 1 + w); q_norm, k_norm, attn_out_norm, mlp_out_norm may be empty or None.
        q_norm, k_norm: (head_dim,), each head normed alone; with whole_qk_norm (OLMoE) (heads * head_dim,)
        and (kv_heads * head_dim,), all of a token's q heads normed as one vector, all its k heads as another.
        sinks: (heads,) float32 logits that join each head's softmax (gpt-oss), or None.
        k_cache, v_cache: (rows, KV, max_len, D) float32, or both float16, with rows of D contiguous."""
        H, KV, D = self.H, self.KV, self.D
        in_norm, k_cache, v_cache = array(in_norm), array(k_cache), array(v_cache)
        q_norm, k_norm, post_norm, attn_out_norm, mlp_out_norm = (
            None if n is None else array(n) for n in (q_norm, k_norm, post_norm, attn_out_norm, mlp_out_norm))
        hidden = in_norm.size
        groups = [self._group(g) for g in (qkv, o, gate_up, down)]
        (qkv_a, qkv_n, qkv_k), (o_a, o_n, o_k), (gu_a, gu_n, gu_k), (down_a, down_n, down_k) = groups
        if qkv_n != (H + 2 * KV) * D or qkv_k != hidden:
            raise ValueError("q, k, v do not match the heads")
        if o_n != hidden or o_k != H * D:
            raise ValueError("o does not match the heads")
        if gu_n % 2 or gu_k != hidden or down_n != hidden or down_k != gu_n // 2:
            raise ValueError("MLP shapes do not match")
        if self.hidden is not None and (hidden != self.hidden or gu_n // 2 != self.inter):
            raise ValueError("layers differ in shape")
        for c in (k_cache, v_cache):
            if (c.dtype not in KV_DTYPES or c.dtype != k_cache.dtype or c.ndim != 4 or c.shape[1] != KV
                    or c.shape[3] != D or c.strides[3] != c.itemsize or c.shape != k_cache.shape):
                raise ValueError("the KV cache must be float32 or float16 (rows, KV, max_len, D) on the CPU")
        sinks = None if sinks is None else array(sinks)
        q_width, k_width = (H * D, KV * D) if whole_qk_norm else (D, D)
        for norm, n in ((q_norm, q_width), (k_norm, k_width), (post_norm, hidden), (attn_out_norm, hidden),
                        (mlp_out_norm, hidden), (sinks, H)):
            if norm is not None and norm.size not in (0, n):
                raise ValueError("a norm does not match its vector")
        self.hidden, self.inter = hidden, gu_n // 2
        self._keep += [k_cache, v_cache]
        layer = Layer(self._floats(in_norm), self._floats(post_norm), self._floats(q_norm), self._floats(k_norm),
                      self._floats(attn_out_norm), self._floats(mlp_out_norm),
                      qkv_a, o_a, gu_a, down_a, len(qkv), len(o), len(gate_up), len(down),
                      k_cache.ctypes.data, v_cache.ctypes.data, (_I64 * 3)(*_elements(k_cache.strides[:3], k_cache)),
                      (_I64 * 3)(*_elements(v_cache.strides[:3], v_cache)), k_cache.shape[0], k_cache.shape[2], window,
                      int(local_rope), int(k_cache.dtype == np.float16), self._floats(sinks), int(whole_qk_norm))
        self.max_len = layer.max_len if self.max_len is None else min(self.max_len, layer.max_len)
        self.rows = layer.rows if self.rows is None else min(self.rows, layer.rows)
        self.local |= bool(local_rope)
        if self._lib.llmcli_step_add_layer(self._h, ctypes.byref(layer)):
            raise ValueError("layers differ in shape, or an interleaved copy is not where a row group starts")

    def set_experts(self, layer: int, router, experts, used: int, renormalize: bool) -> None:
        """Layer `layer`'s MLP as a mixture of experts (after its add_layer): router (E, hidden) float32,
        experts [(gate spec, up spec, down spec)] as _group takes specs (blocks as stored, or their
        interleaved copies); a token runs the `used` experts of highest softmax probability, weighted
        by them (renormalized to sum to one where `renormalize`)."""
        router = np.ascontiguousarray(array(router), dtype=np.float32)
        if router.shape != (len(experts), self.hidden):
            raise ValueError("the router does not match the experts and the hidden size")
        arr = (Projection * (3 * len(experts)))()
        for i, specs in enumerate(experts):
            group, _, _ = self._group(list(specs[:2]))
            down, _, _ = self._group([specs[2]])
            arr[3 * i], arr[3 * i + 1], arr[3 * i + 2] = group[0], group[1], down[0]
        self._keep += [router, arr]
        if self._lib.llmcli_step_set_experts(self._h, layer, router.ctypes.data, len(experts), used, int(renormalize),
                                             ctypes.cast(arr, ctypes.POINTER(Projection))):
            raise ValueError("the experts do not match the layer, or one is an interleaved copy")

    def set_router_bias(self, layer: int, bias) -> None:
        """A bias (E,) float32 on layer `layer`'s router scores (after its set_experts)."""
        bias = np.ascontiguousarray(array(bias), dtype=np.float32)
        self._keep.append(bias)
        if bias.ndim != 1 or self._lib.llmcli_step_set_router_bias(self._h, layer, bias.ctypes.data):
            raise ValueError("the router bias does not match the layer's experts")

    def set_shared_expert(self, layer: int, gate, specs) -> None:
        """Layer `layer`'s shared expert (after set_experts): gate (hidden,) float32 and its (gate, up,
        down) specs, blocks as stored; every token adds its output times sigmoid(gate . input)."""
        gate = np.ascontiguousarray(array(gate), dtype=np.float32).reshape(-1)
        if gate.shape != (self.hidden,):
            raise ValueError("the shared expert's gate does not match the hidden size")
        group, _, _ = self._group(list(specs[:2]))
        down, _, _ = self._group([specs[2]])
        arr = (Projection * 3)(group[0], group[1], down[0])
        self._keep += [gate, arr]
        if self._lib.llmcli_step_set_shared_expert(self._h, layer, gate.ctypes.data, ctypes.cast(arr, ctypes.POINTER(Projection))):
            raise ValueError("the shared expert does not match the layer, or is an interleaved copy")

    def set_head(self, norm, head) -> None:
        arr, rows, K = self._group(head)
        if K != array(norm).size:
            raise ValueError("the head does not read the hidden state")
        if self._lib.llmcli_step_set_head(self._h, self._floats(norm), arr, len(head)):
            raise ValueError("an interleaved copy of the head is not where a row group starts")
        self.vocab = rows

    def run(self, x, rows, slots, cos, sin, cos_local=None, sin_local=None, logits_from: int = 0,
            top: int = 0) -> tuple[np.ndarray, np.ndarray, tuple | None]:
        """x (n, hidden) the tokens' embeddings -> (logits (n - logits_from, vocab) of the tokens from
        `logits_from` on, the final normed hidden states (n, hidden), and with `top` > 0 the (values,
        indices) (n - logits_from, top) of each logit row's `top` largest, largest first, as
        native.top_k gives them (else None)). Token i's keys and values go to
        cache row rows[i], slot slots[i], and it sees that row's slots up to its own; cos, sin (n, R)
        are the model's RoPE tables for the tokens' positions (half-split: entries j and j + R/2 are
        equal), cos_local, sin_local the same for the local layers."""
        if self.hidden is None or self.vocab is None:
            raise ValueError("no layers or no head")
        n = x.shape[0]
        rows, slots = _longs(rows), _longs(slots)
        x, cos, sin, cos_local, sin_local = (None if t is None else array(t) for t in (x, cos, sin, cos_local, sin_local))
        if x.shape != (n, self.hidden) or rows.shape != (n,) or slots.shape != (n,) or not 0 <= logits_from <= n \
                or not 0 <= top <= self.vocab:
            raise ValueError("bad step")
        if n == 0 or int(rows.min()) < 0 or int(rows.max()) >= self.rows or int(slots.min()) < 0 \
                or int(slots.max()) >= self.max_len:
            raise ValueError("a token's row or slot is outside the cache")
        tables = [cos, sin] + ([cos_local, sin_local] if self.local else [])
        if any(t is None or t.shape != (n, self.R) for t in tables):
            raise ValueError("RoPE tables do not match the tokens and the rotary dims")
        x = np.ascontiguousarray(x, dtype=np.float32)
        tables = [np.ascontiguousarray(t, dtype=np.float32) for t in tables] + [None, None]
        out, ptrs = _outputs(n, logits_from, self.vocab, self.hidden, top)
        if self._lib.llmcli_step_run(self._h, n, x.ctypes.data, rows.ctypes.data, slots.ctypes.data,
                                     *(None if t is None else t.ctypes.data for t in tables[:4]), logits_from, *ptrs):
            raise ValueError("bad step")
        return out


    def set_embedding(self, table, type_id: int | None, scale: float = 1.0) -> None:
        """The table run_ids looks token ids up in: GGUF blocks of `type_id` (rows, bytes a row), or
        float32 rows (type_id None), each value times `scale` (after every add_layer)."""
        table = np.ascontiguousarray(array(table))
        if type_id is None and table.dtype != np.float32:
            raise ValueError("an embedding table of floats is float32")
        if self._lib.llmcli_step_set_embedding(self._h, table.ctypes.data, -1 if type_id is None else type_id,
                                               table.shape[0], scale):
            raise ValueError("the embedding table does not match the layers")
        self.embedding = table

    def set_rope(self, tables: list) -> None:
        """cos, sin (L, R) of positions [0, L) (and the local layers' pair): the RoPE rows run_ids
        takes. Kept alive here until the next set_rope."""
        tables = [np.ascontiguousarray(array(t), dtype=np.float32) for t in (tables if self.local else tables[:2])]
        if len({t.shape for t in tables}) != 1 or tables[0].shape[1] != self.R or len(tables) != (4 if self.local else 2):
            raise ValueError("RoPE tables do not match the rotary dims")
        ptrs = [t.ctypes.data for t in tables] + [None, None]
        if self._lib.llmcli_step_set_rope(self._h, *ptrs[:4], tables[0].shape[0]):
            raise ValueError("bad RoPE tables")
        self._rope_tables, self.table_len = tables, tables[0].shape[0]

    def run_ids(self, ids, rows, slots, positions, logits_from: int = 0,
                top: int = 0) -> tuple[np.ndarray, np.ndarray, tuple | None] | None:
        """run() for token ids (n,) int64 at RoPE `positions`, their embeddings and RoPE rows taken
        in C++ from set_embedding's and set_rope's tables; None where a position is beyond the tables
        (nothing run). The C side checks the ids, rows and slots."""
        n = ids.shape[0]
        if self.embedding is None or not 0 <= logits_from <= n or not 0 <= top <= self.vocab \
                or rows.shape != (n,) or slots.shape != (n,) or positions.shape != (n,):
            raise ValueError("bad step")
        ids, rows, slots, positions = (_longs(t) for t in (ids, rows, slots, positions))
        out, ptrs = _outputs(n, logits_from, self.vocab, self.hidden, top)
        rc = self._lib.llmcli_step_run_ids(self._h, n, ids.ctypes.data, rows.ctypes.data, slots.ctypes.data,
                                           positions.ctypes.data, logits_from, *ptrs)
        if rc == 2:
            return None
        if rc:
            raise ValueError("bad step: a token id, row or slot outside the model or the cache")
        return out


def _outputs(n: int, logits_from: int, vocab: int, hidden: int, top: int):
    """A step's outputs, (logits, hidden, (top values, top indices) or None), and the pointers the C
    calls take for them: logits, hidden, top, values, indices."""
    logits, h = np.empty((n - logits_from, vocab), np.float32), np.empty((n, hidden), np.float32)
    found = (np.empty((n - logits_from, top), np.float32), np.empty((n - logits_from, top), np.int64)) if top else None
    ptrs = (logits.ctypes.data, h.ctypes.data, top, *((found[0].ctypes.data, found[1].ctypes.data) if found else (None, None)))
    return (logits, h, found), ptrs


def _longs(t) -> np.ndarray:
    if isinstance(t, np.ndarray) and t.dtype == np.int64 and t.ndim == 1 and t.flags.c_contiguous:
        return t  # (as callers give them)
    return np.ascontiguousarray(array(t), dtype=np.int64).reshape(-1)


def _elements(strides, a: np.ndarray) -> list[int]:
    """numpy's strides (bytes) as the C side takes them (elements)."""
    return [s // a.itemsize for s in strides]
