"""DecodeSteps: decode.cpp's one-token step of a Llama-family model, through ctypes. The C side
keeps pointers into the tensors given here (weights, norms, the cache); this object keeps them alive."""

from __future__ import annotations

import ctypes

import torch

_P, _I64 = ctypes.c_void_p, ctypes.c_int64


class Projection(ctypes.Structure):  # api.h's LlmcliProjection
    _fields_ = [("blocks", _P), ("bias", _P), ("type", _I64), ("N", _I64), ("K", _I64)]


class Layer(ctypes.Structure):  # api.h's LlmcliLayer
    _fields_ = [("in_norm", _P), ("post_norm", _P), ("q_norm", _P), ("k_norm", _P),
                ("qkv", ctypes.POINTER(Projection)), ("o", ctypes.POINTER(Projection)),
                ("gate_up", ctypes.POINTER(Projection)), ("down", ctypes.POINTER(Projection)),
                ("n_qkv", _I64), ("n_o", _I64), ("n_gate_up", _I64), ("n_down", _I64),
                ("k_cache", _P), ("v_cache", _P), ("k_strides", _I64 * 2), ("v_strides", _I64 * 2),
                ("max_len", _I64), ("window", _I64)]


BLOCKS = {0: (32, 22), 1: (32, 24), 2: (256, 176), 3: (256, 210), 4: (32, 18), 5: (32, 20), 6: (32, 34), 7: (256, 144)}

def declare(lib) -> None:
    """The step's C signatures on a freshly loaded library (library.Kernels does this)."""
    lib.llmcli_steps_new.restype = _P
    lib.llmcli_steps_new.argtypes = [_I64, _I64, _I64, _I64, ctypes.c_float, ctypes.c_float, ctypes.c_int]
    lib.llmcli_steps_add_layer.argtypes = [_P, ctypes.POINTER(Layer)]
    lib.llmcli_steps_set_head.argtypes = [_P, _P, ctypes.POINTER(Projection), _I64]
    lib.llmcli_steps_run.argtypes = [_P, _P, _I64, _P, _P, _P, _P]
    lib.llmcli_steps_free.argtypes = [_P]
    lib.llmcli_steps_free.restype = None


class DecodeSteps:
    """`DecodeSteps(n_heads, n_kv, head_dim, rotary_dim, eps, scale, threads)`, then `add_layer` per
    layer and `set_head`; `run(x, slot, cos, sin) -> (logits, hidden)` per token."""

    def __init__(self, lib, n_heads: int, n_kv: int, head_dim: int, rotary_dim: int, eps: float, scale: float,
                 threads: int):
        if n_heads % n_kv or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError("inconsistent shapes")
        self._lib = lib
        self.H, self.KV, self.D, self.R = n_heads, n_kv, head_dim, rotary_dim
        self._h = lib.llmcli_steps_new(n_heads, n_kv, head_dim, rotary_dim, eps, scale, threads)
        self._keep = []  # every tensor and ctypes array the C side points into
        self.hidden = self.inter = self.vocab = None
        self.max_len = None

    def __del__(self):
        if getattr(self, "_h", None):
            self._lib.llmcli_steps_free(self._h)
            self._h = None

    def _floats(self, t: torch.Tensor | None) -> int | None:
        if t is None or t.numel() == 0:
            return None
        t = t.detach().to(torch.float32).contiguous()
        self._keep.append(t)
        return t.data_ptr()

    def _group(self, specs) -> tuple[ctypes.Array, int, int]:
        """[(blocks, GGUF type id, K, bias or an empty tensor)] -> (array of projections, rows, K)"""
        if not specs:
            raise ValueError("a projection group is empty")
        arr = (Projection * len(specs))()
        for p, (blocks, type_id, K, bias) in zip(arr, specs):
            blocks = blocks.contiguous()
            check_blocks(blocks, type_id, K)
            if K % 32 or K != specs[0][2]:
                raise ValueError("a group's projections read inputs of one size, a multiple of 32")
            if bias.numel() and bias.numel() != blocks.shape[0]:
                raise ValueError("bias does not match the rows")
            self._keep.append(blocks)
            p.blocks, p.bias, p.type, p.N, p.K = blocks.data_ptr(), self._floats(bias), type_id, blocks.shape[0], K
        self._keep.append(arr)
        return ctypes.cast(arr, ctypes.POINTER(Projection)), sum(p.N for p in arr), specs[0][2]

    def add_layer(self, in_norm, qkv, q_norm, k_norm, o, post_norm, gate_up, down, k_cache, v_cache,
                  window: int) -> None:
        H, KV, D = self.H, self.KV, self.D
        hidden = in_norm.numel()
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
            if (c.dtype != torch.float32 or c.dim() != 4 or c.shape[0] != 1 or c.shape[1] != KV or c.shape[3] != D
                    or c.stride(3) != 1 or c.device.type != "cpu"):
                raise ValueError("the KV cache must be float32 (1, KV, max_len, D) on the CPU")
        for norm, n in ((q_norm, D), (k_norm, D)):
            if norm.numel() not in (0, n):
                raise ValueError("q/k norms are head_dim wide")
        self.hidden, self.inter = hidden, gu_n // 2
        self._keep += [k_cache, v_cache]
        layer = Layer(self._floats(in_norm), self._floats(post_norm), self._floats(q_norm), self._floats(k_norm),
                      qkv_a, o_a, gu_a, down_a, len(qkv), len(o), len(gate_up), len(down),
                      k_cache.data_ptr(), v_cache.data_ptr(), (_I64 * 2)(k_cache.stride(1), k_cache.stride(2)),
                      (_I64 * 2)(v_cache.stride(1), v_cache.stride(2)), min(k_cache.shape[2], v_cache.shape[2]),
                      window)
        self.max_len = layer.max_len if self.max_len is None else min(self.max_len, layer.max_len)
        if self._lib.llmcli_steps_add_layer(self._h, ctypes.byref(layer)):
            raise ValueError("layers differ in shape")

    def set_head(self, norm, head) -> None:
        arr, rows, K = self._group(head)
        if K != norm.numel():
            raise ValueError("the head does not read the hidden state")
        self.vocab = rows
        self._lib.llmcli_steps_set_head(self._h, self._floats(norm), arr, len(head))

    def run(self, x: torch.Tensor, slot: int, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (hidden,) the token's embedding -> (logits (vocab,), the final normed hidden state (hidden,)).
        Its keys and values go to cache slot `slot`; cos, sin (R,) are the model's RoPE tables for the
        token's position (half-split: entries i and i + R/2 are equal)."""
        if self.hidden is None or self.vocab is None:
            raise ValueError("no layers or no head")
        if x.numel() != self.hidden or not 0 <= slot < self.max_len:
            raise ValueError("bad step")
        if cos.numel() != self.R or sin.numel() != self.R:
            raise ValueError("RoPE tables do not match the rotary dims")
        x = x.to(torch.float32).contiguous()
        cos, sin = cos.to(torch.float32).contiguous(), sin.to(torch.float32).contiguous()
        logits, hidden = torch.empty(self.vocab), torch.empty(self.hidden)
        self._lib.llmcli_steps_run(self._h, x.data_ptr(), slot, cos.data_ptr(), sin.data_ptr(), logits.data_ptr(),
                                   hidden.data_ptr())
        return logits, hidden


def check_blocks(blocks: torch.Tensor, type_id: int, K: int) -> None:
    """A wrong row length would have the kernel read past the tensor: refused here."""
    if type_id not in BLOCKS or blocks.dtype != torch.uint8 or blocks.device.type != "cpu" or blocks.dim() != 2:
        raise ValueError("blocks must be (N, row bytes) uint8 on the CPU, of a known type")
    size, nbytes = BLOCKS[type_id]
    if K % size or blocks.shape[1] != K // size * nbytes:
        raise ValueError(f"rows of {blocks.shape[1]} bytes do not hold {K} weights of type {type_id}")
