"""The kernels as torch operators, for torch.compile only: a compiled graph cannot call ctypes, so
there native.mm and friends call these (llmcli_native::mm, ...), which keep their place in the graph
(shapes from the fake kernels below) and call the active library. Eager code calls the library
directly, without the dispatcher's cost a call."""

from __future__ import annotations

import torch

_lib = None


def register(active) -> None:
    """Defines the operators once; `active()` returns the Kernels in use when an operator runs."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("llmcli_native", "DEF")
    _lib.define("mm(Tensor x, Tensor blocks, int type, int K, bool refined=False) -> Tensor")
    _lib.define("dequantize(Tensor blocks, int type, int K) -> Tensor")
    _lib.define("attend_one(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale) -> Tensor")
    _lib.impl("mm", lambda x, blocks, type_id, K, refined=False: active().mm(x, blocks, type_id, K, refined), "CPU")
    _lib.impl("dequantize", lambda blocks, type_id, K: active().dequantize(blocks, type_id, K), "CPU")
    _lib.impl("attend_one", lambda q, k, v, mask, scale: active().attend_one(q, k, v, mask, scale), "CPU")

    @torch.library.register_fake("llmcli_native::mm", lib=_lib)
    def _(x, blocks, type_id, K, refined=False):
        return x.new_empty(x.shape[0], blocks.shape[0], dtype=torch.float32)

    @torch.library.register_fake("llmcli_native::dequantize", lib=_lib)
    def _(blocks, type_id, K):
        return blocks.new_empty(blocks.shape[0], K, dtype=torch.float32)

    @torch.library.register_fake("llmcli_native::attend_one", lib=_lib)
    def _(q, k, v, mask, scale):
        return q.new_empty(q.shape, dtype=torch.float32)
