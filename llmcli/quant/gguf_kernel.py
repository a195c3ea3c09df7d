"""A small C++ CPU kernel for GGUF blocks (gguf_blocks.py): y = x @ W.T reading the blocks, and
dequantization of rows, both over torch's thread pool.

Built on first use with torch.utils.cpp_extension.load_inline (about a minute on two cores) and
cached under torch's extensions folder (TORCH_EXTENSIONS_DIR), keyed by this source. Without a
compiler, or with LLMCLI_NO_KERNEL=1, `available()` is False and callers use the torch path.

The matmul dequantizes one block (32 or 256 weights) into registers-sized float buffers and takes
its dot products with every activation row: the weights are read once, as stored.
"""

from __future__ import annotations

import hashlib
import os

import torch

from .. import notices

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <cstring>
#include <vector>

static inline float h2f(const uint8_t* p) {
    uint16_t v; std::memcpy(&v, p, 2);
    return static_cast<float>(c10::Half(v, c10::Half::from_bits()));
}

// ggml's get_scale_min_k4: 6-bit scale and min of sub-block j from 12 bytes
static inline void scale_min(int j, const uint8_t* q, float& d, float& m) {
    if (j < 4) { d = q[j] & 63; m = q[j + 4] & 63; }
    else { d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

template <int T> struct Block;

template <> struct Block<0> {  // Q5_0
    static constexpr int size = 32, bytes = 22;
    static inline void deq(const uint8_t* b, float* y) {
        const float d = h2f(b); uint32_t qh; std::memcpy(&qh, b + 2, 4); const uint8_t* qs = b + 6;
        for (int j = 0; j < 16; ++j) {
            y[j] = d * (float)((int)((qs[j] & 15) | (((qh >> j) << 4) & 16)) - 16);
            y[j + 16] = d * (float)((int)((qs[j] >> 4) | ((qh >> (j + 12)) & 16)) - 16);
        }
    }
};

template <> struct Block<1> {  // Q5_1
    static constexpr int size = 32, bytes = 24;
    static inline void deq(const uint8_t* b, float* y) {
        const float d = h2f(b), m = h2f(b + 2); uint32_t qh; std::memcpy(&qh, b + 4, 4); const uint8_t* qs = b + 8;
        for (int j = 0; j < 16; ++j) {
            y[j] = d * (float)((qs[j] & 15) | (((qh >> j) << 4) & 16)) + m;
            y[j + 16] = d * (float)((qs[j] >> 4) | ((qh >> (j + 12)) & 16)) + m;
        }
    }
};

template <> struct Block<2> {  // Q5_K
    static constexpr int size = 256, bytes = 176;
    static inline void deq(const uint8_t* b, float* y) {
        const float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t* sc = b + 4; const uint8_t* qh = b + 16; const uint8_t* ql = b + 48;
        for (int c = 0; c < 4; ++c) {
            float s1, m1, s2, m2;
            scale_min(2 * c, sc, s1, m1); scale_min(2 * c + 1, sc, s2, m2);
            const float d1 = d * s1, o1 = dmin * m1, d2 = d * s2, o2 = dmin * m2;
            const int sh1 = 2 * c, sh2 = 2 * c + 1;
            for (int l = 0; l < 32; ++l) {
                y[l] = d1 * (float)((ql[l] & 15) | (((qh[l] >> sh1) & 1) << 4)) - o1;
                y[l + 32] = d2 * (float)((ql[l] >> 4) | (((qh[l] >> sh2) & 1) << 4)) - o2;
            }
            y += 64; ql += 32;
        }
    }
};

template <> struct Block<3> {  // Q6_K
    static constexpr int size = 256, bytes = 210;
    static inline void deq(const uint8_t* b, float* y) {
        const uint8_t* ql = b; const uint8_t* qh = b + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192); const float d = h2f(b + 208);
        for (int h = 0; h < 2; ++h) {
            for (int half = 0; half < 2; ++half) {  // l in 0..15, 16..31: one scale each
                const float s0 = d * sc[half], s1 = d * sc[half + 2], s2 = d * sc[half + 4], s3 = d * sc[half + 6];
                for (int l = 16 * half; l < 16 * half + 16; ++l) {
                    y[l] = s0 * (float)(((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32);
                    y[l + 32] = s1 * (float)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    y[l + 64] = s2 * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    y[l + 96] = s3 * (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
            y += 128; ql += 64; qh += 32; sc += 8;
        }
    }
};

template <int T>
static void mm_rows(const float* X, const uint8_t* B, float* O, int64_t M, int64_t N, int64_t K) {
    using Bk = Block<T>;
    const int64_t nb = K / Bk::size, rb = nb * Bk::bytes;
    at::parallel_for(0, N, 8, [&](int64_t begin, int64_t end) {
        alignas(64) float buf[256];
        std::vector<float> acc(M);
        for (int64_t n = begin; n < end; ++n) {
            std::fill(acc.begin(), acc.end(), 0.f);
            const uint8_t* row = B + n * rb;
            for (int64_t k = 0; k < nb; ++k) {
                Bk::deq(row + k * Bk::bytes, buf);
                const float* xb = X + k * Bk::size;
                for (int64_t m = 0; m < M; ++m) {
                    const float* xm = xb + m * K;
                    float s = 0.f;
                    #pragma omp simd reduction(+:s)
                    for (int i = 0; i < Bk::size; ++i) s += buf[i] * xm[i];
                    acc[m] += s;
                }
            }
            for (int64_t m = 0; m < M; ++m) O[m * N + n] = acc[m];
        }
    });
}

template <int T>
static void deq_rows(const uint8_t* B, float* O, int64_t N, int64_t K) {
    using Bk = Block<T>;
    const int64_t nb = K / Bk::size, rb = nb * Bk::bytes;
    at::parallel_for(0, N, 4, [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n)
            for (int64_t k = 0; k < nb; ++k) Bk::deq(B + n * rb + k * Bk::bytes, O + n * K + k * Bk::size);
    });
}

torch::Tensor mm(torch::Tensor x, torch::Tensor blocks, int64_t type, int64_t K) {
    auto xf = x.to(torch::kFloat).contiguous();
    auto b = blocks.contiguous();
    const int64_t M = xf.size(0), N = b.size(0);
    auto out = torch::empty({M, N}, xf.options());
    const float* X = xf.data_ptr<float>(); const uint8_t* B = b.data_ptr<uint8_t>(); float* O = out.data_ptr<float>();
    switch (type) {
        case 0: mm_rows<0>(X, B, O, M, N, K); break;
        case 1: mm_rows<1>(X, B, O, M, N, K); break;
        case 2: mm_rows<2>(X, B, O, M, N, K); break;
        case 3: mm_rows<3>(X, B, O, M, N, K); break;
        default: TORCH_CHECK(false, "unknown GGUF block type");
    }
    return out;
}

torch::Tensor dequantize(torch::Tensor blocks, int64_t type, int64_t K) {
    auto b = blocks.contiguous();
    const int64_t N = b.size(0);
    auto out = torch::empty({N, K}, torch::dtype(torch::kFloat));
    const uint8_t* B = b.data_ptr<uint8_t>(); float* O = out.data_ptr<float>();
    switch (type) {
        case 0: deq_rows<0>(B, O, N, K); break;
        case 1: deq_rows<1>(B, O, N, K); break;
        case 2: deq_rows<2>(B, O, N, K); break;
        case 3: deq_rows<3>(B, O, N, K); break;
        default: TORCH_CHECK(false, "unknown GGUF block type");
    }
    return out;
}
"""

_module = None  # the built extension, False when it cannot be built


def available() -> bool:
    global _module
    if _module is None:
        _module = False if os.environ.get("LLMCLI_NO_KERNEL") else _build()
    return _module is not False


def _build():
    import contextlib
    import io
    import warnings

    from torch.utils.cpp_extension import load_inline

    # -march=native: a cache shared by machines (a home folder on NFS) must not hand one CPU's build to another
    digest = hashlib.sha256((_SOURCE + torch.__version__ + _cpu_signature()).encode()).hexdigest()[:12]
    name = f"llmcli_gguf_{digest}"
    if notices.notify is not None and not _cached(name):
        notices.say("building the GGUF block kernel for this CPU (once, about a minute)")
    try:  # the library never prints: the build's output is swallowed, a failure means "use torch"
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return load_inline(name, cpp_sources=_SOURCE, functions=["mm", "dequantize"],
                               extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                               verbose=False)
    except Exception:  # no compiler, no headers, a failed build: the torch path still works
        return False


def _cpu_signature() -> str:
    """The machine and its instruction-set flags (what -march=native compiles for)."""
    import platform

    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return platform.machine() + platform.processor() + flags


def _cached(name: str) -> bool:
    try:
        from torch.utils.cpp_extension import _get_build_directory

        folder = _get_build_directory(name, verbose=False)
        return any(f.endswith((".so", ".pyd", ".dylib")) for f in os.listdir(folder))
    except Exception:
        return False


@torch.library.custom_op("llmcli::gguf_mm", mutates_args=())
def mm(x: torch.Tensor, blocks: torch.Tensor, type_id: int, K: int) -> torch.Tensor:
    """x (M, K) any float dtype, blocks (N, row bytes) -> (M, N) float32. A torch op, so that
    torch.compile (compiled.py) calls it inside its graph instead of breaking the graph there."""
    return _module.mm(x, blocks, type_id, K)


@mm.register_fake
def _(x, blocks, type_id, K):
    return x.new_empty(x.shape[0], blocks.shape[0], dtype=torch.float32)


def dequantize(blocks: torch.Tensor, type_id: int, K: int, dtype: torch.dtype) -> torch.Tensor:
    """(n, row bytes) -> (n, K) in `dtype`."""
    return _dequantize(blocks, type_id, K).to(dtype)


@torch.library.custom_op("llmcli::gguf_dequantize", mutates_args=())
def _dequantize(blocks: torch.Tensor, type_id: int, K: int) -> torch.Tensor:
    return _module.dequantize(blocks, type_id, K)


@_dequantize.register_fake
def _(blocks, type_id, K):
    return blocks.new_empty(blocks.shape[0], K, dtype=torch.float32)
