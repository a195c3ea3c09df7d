"""One variant's compiled library, found or built, and its calls on torch tensors through ctypes.

Where a library comes from, in order: the one `pip install` built beside these sources (lib/, by
build_hook.py) if it was built from these very sources; one built earlier into the user cache
(the platform's cache folder, kernels/); else it is built there now, in seconds. ctypes releases the
GIL for each call, and a call through it costs less than one through a TORCH_LIBRARY operator (the
torch extension these kernels once were) or a Python custom op (docs/performance-choices.md).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import build
from .checks import ROW_BYTES, array, check_blocks
from .step import Step, declare

if TYPE_CHECKING:
    import torch

KEPT = 4  # builds of one variant kept in the cache (other versions' sources)
_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


def cache_dir() -> Path:
    """Where libraries built at run time go: the user's cache folder, whatever LLMCLI_HOME says (a
    few hundred kB that every model store of the user's, and every test's, can share)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("llmcli", appauthor=False)) / "kernels"


def installed(variant: str) -> Path:
    return Path(__file__).parent / "lib" / build.library_name(variant)


def find(variant: str, on_build=None) -> "Kernels":
    """The variant's library, built into the cache first if need be (`on_build()` is called before
    a build). Raises build.BuildError when it cannot be built."""
    want = build.source_hash(variant)
    path = installed(variant)
    if path.exists() and _source_hash(path) == want:
        return Kernels(path)
    name = build.library_name(variant)
    cached = cache_dir() / f"{want}-{name}"
    if not cached.exists():
        from filelock import FileLock

        cached.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(cache_dir() / f"{variant}.lock")):  # another process (a test worker) may be building it
            if not cached.exists():
                if on_build is not None:
                    on_build()
                build.compile_variant(variant, cached)
                _prune(cached, name)
    return Kernels(cached)


def _source_hash(path: Path) -> str | None:
    """The hash of the sources a library was built from, read before anything else is looked up in it:
    a library built from older sources may lack the newer functions. None if it is not one of ours."""
    try:
        return _fn(ctypes.CDLL(str(path)), "llmcli_source_hash", ctypes.c_char_p)().decode()
    except (OSError, AttributeError):
        return None


def _prune(newest: Path, name: str) -> None:
    """Drop builds of other sources beyond the KEPT most recent: two installs of llmcli (a checkout and
    a release, two virtual environments) each keep theirs rather than rebuilding every time the other
    ran. A process using a dropped one keeps its copy."""
    builds = sorted(newest.parent.glob(f"*-{name}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [b for b in builds if b != newest][KEPT - 1:]:
        old.unlink(missing_ok=True)


def _fn(lib, name: str, restype, *argtypes):
    f = getattr(lib, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


_WEIGHT_DTYPES = {"torch.float32": 0, "torch.bfloat16": 1, "torch.float16": 2}  # llmcli_quantize_weights' dtype codes
_QUANTIZED_TO = {6: 34, 5: 20, 4: 18}  # Q8_0, Q4_1, Q4_0 (gguf_blocks.TYPE_IDS) -> bytes a block of 32


class Kernels:
    """A loaded library: mm, dequantize, attend_one, quantize_rows and top_k on torch tensors (torch is
    imported by the first of them), interleave on arrays or tensors, and the decode step (step())."""

    def __init__(self, path: Path):
        self.path = path
        self.lib = lib = ctypes.CDLL(str(path))
        self.variant = _fn(lib, "llmcli_variant", ctypes.c_char_p)().decode()
        self.source_hash = _fn(lib, "llmcli_source_hash", ctypes.c_char_p)().decode()
        self._mm = _fn(lib, "llmcli_mm", _I32, _P, _I64, _P, _I64, _I64, _I32, _P, _I32, _I32)
        self._mm_grouped = _fn(lib, "llmcli_mm_grouped", _I32, _P, _I64, _P, _I64, _I64, _I32, _P, _I32, _I32)
        self._grouped_takes = _fn(lib, "llmcli_grouped_takes", _I32, _I32, _I64)
        self.group_rows = _fn(lib, "llmcli_group_rows", _I32)()
        self._grouped_bytes = _fn(lib, "llmcli_grouped_bytes", _I64, _I32, _I64, _I64)
        self._interleave = _fn(lib, "llmcli_interleave", _I32, _I32, _P, _I64, _I64, _P, _P, _I32)
        self._dequantize = _fn(lib, "llmcli_dequantize", _I32, _P, _I64, _I64, _I32, _P, _I32)
        self._quantize = _fn(lib, "llmcli_quantize_rows", _I32, _P, _I64, _I64, _P, _P, _P, _I32)
        self._quantize_weights = _fn(lib, "llmcli_quantize_weights", _I32, _P, _I32, _I64, _I64, _I32, _P, _I32)
        self._top_k = _fn(lib, "llmcli_top_k", _I32, _P, _I64, _I64, _P, _P)
        self._dot_rows = _fn(lib, "llmcli_dot_rows", _I32, _P, _I64, _I64, _I32, _P, _I64, _P, _P)
        self._attend = _fn(lib, "llmcli_attend_one", _I32, _P, _I64, _I64, _I64, _P, _P, _P, _P, _I64, _I64, _P,
                           _I64, _F32, _P, _I32)
        declare(lib)

    def __repr__(self) -> str:
        return f"Kernels({self.variant}, {self.path})"

    def mm(self, x: torch.Tensor, blocks: torch.Tensor, type_id: int, K: int, refined: bool = False) -> torch.Tensor:
        """x (M, K) any float dtype, blocks (N, row bytes) uint8 -> (M, N) float32, with int8 activations
        (int8x2 where `refined`). A decode step calls this ~120 times a token: the checks are the
        cheapest that keep the kernel inside the tensors."""
        import torch

        if x.dtype is not torch.float32 or not x.is_contiguous():
            x = x.to(torch.float32).contiguous()
        if not blocks.is_contiguous():
            blocks = blocks.contiguous()
        M, k = x.shape
        N, row = blocks.shape
        row_bytes = ROW_BYTES.get(type_id)
        if k != K or blocks.dtype is not torch.uint8 or not blocks.is_cpu or row_bytes is None or row != row_bytes(K):
            check_blocks(blocks, type_id, K)
            raise ValueError(f"x has {k} columns, the weight {K}")
        y = torch.empty(M, N)
        self._mm(x.data_ptr(), M, blocks.data_ptr(), N, K, type_id, y.data_ptr(), _threads(), int(refined))
        return y

    def grouped_takes(self, type_id: int, N: int) -> bool:
        """Whether this variant's row-group kernels (groups of `group_rows` weight rows: 16 with AVX-512,
        8 with AVX2 and AVX-VNNI) take N rows of the type (then mm takes Q5_K through them, with int8
        activations, as the decode step does)."""
        return bool(self._grouped_takes(type_id, N))

    def interleaved_bytes(self, type_id: int, N: int, K: int) -> int:
        """The bytes interleave makes of N rows (0: this variant's row-group kernels do not take them)."""
        return self._grouped_bytes(type_id, N, K)

    def interleave(self, blocks, type_id: int, K: int, order=None, threads: int | None = None, out=None):
        """blocks (N, row bytes) uint8 -> their rows interleaved for the row-group kernels, a 1-d uint8
        array the decode step reads (its projection's `grouped`), row n taken from blocks' row
        order[n] (a permutation of N; None: row n); None where this variant's kernels do not take them.
        `out`: where to write them (interleaved_bytes(type_id, N, K) bytes, e.g. a slice of a larger
        copy: rows [n0, n1) of a weight, n0 a multiple of group_rows, go at n0 / N of its copy).
        Numpy arrays or CPU torch tensors; the copy is made as a torch tensor where blocks is one."""
        check_blocks(blocks, type_id, K)
        N = blocks.shape[0]
        size = self._grouped_bytes(type_id, N, K)
        if not size:
            return None
        if order is not None:
            order = np.ascontiguousarray(array(order), dtype=np.int64)
            if order.shape != (N,) or not np.array_equal(np.sort(order), np.arange(N)):
                raise ValueError("order is not a permutation of the rows")
        if out is None:
            if isinstance(blocks, np.ndarray):
                out = np.empty(size, np.uint8)
            else:
                import torch

                out = torch.empty(size, dtype=torch.uint8)
        dest = array(out)
        if dest.dtype != np.uint8 or dest.shape != (size,) or not dest.flags.c_contiguous:
            raise ValueError(f"out must be {size} contiguous bytes")
        src = np.ascontiguousarray(array(blocks))
        self._interleave(type_id, src.ctypes.data, N, K, None if order is None else order.ctypes.data, dest.ctypes.data,
                         threads or _threads())
        return out

    def mm_grouped(self, x: torch.Tensor, blocks: torch.Tensor, type_id: int, K: int,
                   refined: bool = False) -> torch.Tensor | None:
        """mm through the row-group kernels a decode step takes (on a copy of the blocks interleaved for
        them), or None where this variant has none for this type or row count."""
        import torch

        x = x.to(torch.float32).contiguous()
        blocks = blocks.contiguous()
        check_blocks(blocks, type_id, K)
        if x.shape[1] != K:
            raise ValueError(f"x has {x.shape[1]} columns, the weight {K}")
        y = torch.empty(x.shape[0], blocks.shape[0])
        rc = self._mm_grouped(x.data_ptr(), x.shape[0], blocks.data_ptr(), blocks.shape[0], K, type_id, y.data_ptr(),
                             _threads(), int(refined))
        return None if rc == 2 else y

    def dequantize(self, blocks: torch.Tensor, type_id: int, K: int) -> torch.Tensor:
        """(N, row bytes) uint8 -> (N, K) float32."""
        import torch

        blocks = blocks.contiguous()
        check_blocks(blocks, type_id, K)
        y = torch.empty(blocks.shape[0], K)
        self._dequantize(blocks.data_ptr(), blocks.shape[0], K, type_id, y.data_ptr(), _threads())
        return y

    def quantize_rows(self, x: torch.Tensor, refined: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (M, K) -> int8 codes (M, K), scales d and scaled sums s (M, K/32): mm's int8 activations;
        refined: int8x2's, 2M rows of each (row m's high codes, then its low ones)."""
        import torch

        x = x.to(torch.float32).contiguous()
        M, K = x.shape
        if K % 32:
            raise ValueError("K must be a multiple of 32")
        rows = 2 * M if refined else M
        q, d, s = torch.empty(rows, K, dtype=torch.int8), torch.empty(rows, K // 32), torch.empty(rows, K // 32)
        self._quantize(x.data_ptr(), M, K, q.data_ptr(), d.data_ptr(), s.data_ptr(), int(refined))
        return q, d, s

    def quantize_weights(self, w: torch.Tensor, type_id: int) -> torch.Tensor | None:
        """w (N, K) float32, bfloat16 or float16 on the CPU -> (N, row bytes) uint8 blocks of Q8_0,
        Q4_1 or Q4_0 with min/max scales (quant/primitives.py's, byte for byte), on torch's threads;
        None where a scale is beyond float16's range."""
        import torch

        dtype = _WEIGHT_DTYPES.get(str(w.dtype))
        N, K = w.shape
        if dtype is None or not w.is_cpu or K % 32 or type_id not in _QUANTIZED_TO:
            raise ValueError("quantize_weights takes float32/bfloat16/float16 CPU rows of a multiple of 32 "
                             "into Q8_0, Q4_1 or Q4_0")
        w = w.contiguous()
        out = torch.empty(N, K // 32 * _QUANTIZED_TO[type_id], dtype=torch.uint8)
        rc = self._quantize_weights(w.data_ptr(), dtype, N, K, type_id, out.data_ptr(), _threads())
        return out if rc == 0 else None

    def top_k(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x (n,) float32 on the CPU -> (values, indices) of its k largest, largest first (torch.topk's)."""
        import torch

        x = x.detach().contiguous()
        if x.dtype != torch.float32 or x.dim() != 1 or not x.is_cpu or not 1 <= k <= x.numel():
            raise ValueError("top_k takes a float32 CPU vector and 1 <= k <= its length")
        values, indices = torch.empty(k), torch.empty(k, dtype=torch.int64)
        self._top_k(x.data_ptr(), x.numel(), k, values.data_ptr(), indices.data_ptr())
        return values, indices

    def dot_rows_into(self, blocks, type_id: int, K: int, ids, x, out) -> None:
        """out[ids] = rows ids of the blocks (N, row bytes), dequantized, . x (K,): float64 sums rounded
        once. out: a float32 CPU vector of N, written in place. numpy arrays or CPU torch tensors."""
        check_blocks(blocks, type_id, K)
        blocks = np.ascontiguousarray(array(blocks))
        ids = np.ascontiguousarray(array(ids), dtype=np.int64).reshape(-1)
        x = np.ascontiguousarray(array(x), dtype=np.float32)
        dest = array(out)
        if x.shape != (K,) or dest.dtype != np.float32 or dest.ndim != 1 or dest.shape[0] != blocks.shape[0] \
                or not dest.flags.c_contiguous or not dest.flags.writeable:
            raise ValueError("dot_rows_into takes x (K,) and out, a float32 CPU vector of the blocks' rows")
        if self._dot_rows(blocks.ctypes.data, blocks.shape[0], K, type_id, ids.ctypes.data, ids.size, x.ctypes.data,
                          dest.ctypes.data):
            raise ValueError("a row id outside the blocks")

    def attend_one(self, q, k, v, mask, scale: float) -> torch.Tensor:
        """q (B, H, 1, D), k and v (B, KV, S, D) float32 with rows of D contiguous, mask bool (1 or B, S)
        or None -> (B, H, 1, D) float32."""
        import torch

        B, H, _, D = q.shape
        KV, S = k.shape[1], k.shape[2]
        if k.dtype != torch.float32 or v.dtype != torch.float32 or k.stride(-1) != 1 or v.stride(-1) != 1:
            raise ValueError("a float32 cache with rows of D contiguous")
        if H % KV or k.shape[-1] != D or v.shape[-1] != D:
            raise ValueError("q, k and v do not match")
        qf = q.to(torch.float32).contiguous()
        out = torch.empty(B, H, 1, D)
        m = None if mask is None else mask.to(torch.uint8).contiguous()
        ks = (ctypes.c_int64 * 3)(k.stride(0), k.stride(1), k.stride(2))
        vs = (ctypes.c_int64 * 3)(v.stride(0), v.stride(1), v.stride(2))
        rc = self._attend(qf.data_ptr(), B, H, D, k.data_ptr(), ks, v.data_ptr(), vs, KV, S,
                          None if m is None else m.data_ptr(), 0 if m is None else m.shape[0], scale, out.data_ptr(),
                          _threads())
        if rc:
            raise ValueError(f"attend_one: mask of {m.shape[0]} rows for a batch of {B}")
        return out

    def step(self, n_heads: int, n_kv: int, head_dim: int, rotary_dim: int, eps: float, scale: float, act: str,
             threads: int, refined=False) -> Step:
        """A new decode step of this library (step.py's Step): add_layer, set_head, then run."""
        return Step(self.lib, n_heads, n_kv, head_dim, rotary_dim, eps, scale, act, threads, refined)


def _threads() -> int:
    """The threads a call runs on where none are given: torch's (which runtime/device.place() sets)
    where torch is loaded, else the physical cores."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.get_num_threads()
    from .cpu import physical_cores

    return physical_cores()
