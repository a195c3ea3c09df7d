// The element-wise work written once over float vectors as wide as the variant's registers (16
// floats with AVX-512, 8 with AVX2, 4 with NEON and in the portable build): dot products, e^x, SiLU,
// GELU, RMSNorm, RoPE, attention's pieces. The primitives come from the variant's arch header
// (isa.h): vf, vload, vstore, vset1, vfma (a * b + c), vmax, vmin, vround (to nearest even), vpow2i
// (2^n for integral n), vsum (of the lanes), vany_above(v, t) (some lane above t, or NaN),
// vload_half (float16 bits -> floats), vload_bf16 (bfloat16 bits -> floats), reduce4 (four vectors'
// sums) and kAccumulators (vectors a loop may keep summing in registers); to_halves and h2f beside them.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "half.h"
#include "isa.h"

constexpr int kVW = sizeof(vf) / sizeof(float);

// A KV cache's rows as floats: float32 as they are, float16 converted
static inline vf vload_kv(const float* p) { return vload(p); }
static inline vf vload_kv(const uint16_t* p) { return vload_half(p); }
static inline float kv_at(const float* p) { return *p; }
static inline float kv_at(const uint16_t* p) { return half_to_float(*p); }

// e^x lane by lane (Cephes' polynomial, as in avx_mathfun): relative error ~1e-7; below -87, ~1e-38
static inline vf vexp(vf x) {
    x = vmax(vmin(x, vset1(88.f)), vset1(-87.f));  // 2^n stays a normal float
    const vf n = vround(x * vset1(1.44269504088896341f));
    x = vfma(n, vset1(-0.693359375f), x);  // x - n ln 2, in two parts
    x = vfma(n, vset1(2.12194440e-4f), x);
    vf y = vset1(1.9875691500E-4f);
    y = vfma(y, x, vset1(1.3981999507E-3f));
    y = vfma(y, x, vset1(8.3334519073E-3f));
    y = vfma(y, x, vset1(4.1665795894E-2f));
    y = vfma(y, x, vset1(1.6666665459E-1f));
    y = vfma(y, x, vset1(5.0000001201E-1f));
    y = vfma(y, x * x, x + vset1(1.f));
    return y * vpow2i(n);
}

// sum of a[i] * b[i]: four independent chains (one would wait on each multiply-add); b: floats, or
// a float16 KV cache's row, converted as it is read
template <typename E>
static inline float dot_kv(const float* a, const E* b, int64_t n) {
    int64_t i = 0;
    vf acc[4] = {vset1(0.f), vset1(0.f), vset1(0.f), vset1(0.f)};
    for (; i + 4 * kVW <= n; i += 4 * kVW)
        for (int j = 0; j < 4; ++j) acc[j] = vfma(vload(a + i + kVW * j), vload_kv(b + i + kVW * j), acc[j]);
    for (; i + kVW <= n; i += kVW) acc[0] = vfma(vload(a + i), vload_kv(b + i), acc[0]);
    float s = vsum((acc[0] + acc[1]) + (acc[2] + acc[3]));
    for (; i < n; ++i) s += a[i] * kv_at(b + i);
    return s;
}
static inline float dot_f32(const float* a, const float* b, int64_t n) { return dot_kv(a, b, n); }

// out[h][j] = a_h . b_j for NH rows a_h = a + h * lda and four rows b_j = b + j * stride (n floats
// each): each b row loaded once for the NH (attention's query heads that share a key head), one
// chain a pair, reduced by reduce4. Each a_h's results do not depend on NH.
template <int NH, typename E>
static inline void dot4_f32_heads(const float* a, int64_t lda, const E* b, int64_t stride, int64_t n, float out[][4]) {
    vf acc[NH][4];
    for (int h = 0; h < NH; ++h)
        for (int j = 0; j < 4; ++j) acc[h][j] = vset1(0.f);
    int64_t i = 0;
    for (; i + kVW <= n; i += kVW) {
        const vf k[4] = {vload_kv(b + i), vload_kv(b + stride + i), vload_kv(b + 2 * stride + i), vload_kv(b + 3 * stride + i)};
        for (int h = 0; h < NH; ++h) {
            const vf x = vload(a + h * lda + i);
            for (int j = 0; j < 4; ++j) acc[h][j] = vfma(x, k[j], acc[h][j]);
        }
    }
    for (int h = 0; h < NH; ++h) {
        reduce4(acc[h], out[h]);
        for (int64_t t = i; t < n; ++t)
            for (int j = 0; j < 4; ++j) out[h][j] += a[h * lda + t] * kv_at(b + j * stride + t);
    }
}

// Columns [c, c + W * kVW) of weighted_rows_heads, held in registers: NH * W chains of multiply-adds,
// each over the slots in order
template <int NH, int W, typename E>
static inline void weighted_columns(const float* w, int64_t ldw, const E* V, int64_t stride, int64_t S, int64_t c,
                                    float* o, int64_t ldo) {
    vf acc[NH][W];
    for (int h = 0; h < NH; ++h)
        for (int j = 0; j < W; ++j) acc[h][j] = vset1(0.f);
    for (int64_t s = 0; s < S; ++s) {
        const E* vs = V + s * stride + c;
        vf x[W];
        for (int j = 0; j < W; ++j) x[j] = vload_kv(vs + kVW * j);
        for (int h = 0; h < NH; ++h) {
            const vf ws = vset1(w[h * ldw + s]);
            for (int j = 0; j < W; ++j) acc[h][j] = vfma(ws, x[j], acc[h][j]);
        }
    }
    for (int h = 0; h < NH; ++h)
        for (int j = 0; j < W; ++j) vstore(o + h * ldo + c + kVW * j, acc[h][j]);
}

// o_h[0..D) = sum over s of w_h[s] * V[s * stride + 0..D), for NH weight rows w_h = w + h * ldw into
// o_h = o + h * ldo: each V row loaded once for the NH (the query heads sharing a value head), and
// each weight broadcast once for up to 64 columns, in chunks of columns whose NH * W accumulators
// fit the registers (kAccumulators). Each column's sum is the same whatever NH: one chain over the
// slots in order.
template <int NH, typename E>
static inline void weighted_rows_heads(const float* w, int64_t ldw, const E* V, int64_t stride, int64_t S, int64_t D,
                                       float* o, int64_t ldo) {
    constexpr int most = 64 / kVW < kAccumulators / NH ? 64 / kVW : kAccumulators / NH;
    constexpr int W = most > 0 ? most : 1;
    int64_t c = 0;
    for (; c + W * kVW <= D; c += W * kVW) weighted_columns<NH, W, E>(w, ldw, V, stride, S, c, o, ldo);
    for (; c + kVW <= D; c += kVW) weighted_columns<NH, 1, E>(w, ldw, V, stride, S, c, o, ldo);
    for (; c < D; ++c)  // a head size that is not a multiple of the vector
        for (int h = 0; h < NH; ++h) {
            float sum = 0.f;
            for (int64_t s = 0; s < S; ++s) sum += w[h * ldw + s] * kv_at(V + s * stride + c);
            o[h * ldo + c] = sum;
        }
}

// Scales p[0..S) (keys where mask[s] is 0: -inf; mask may be null) and returns their largest
static inline float scale_and_max(float* p, int64_t S, const uint8_t* mask, float scale) {
    int64_t s = 0;
    float mx = -INFINITY;
    if (!mask) {
        vf m = vset1(-INFINITY);
        for (; s + kVW <= S; s += kVW) {
            const vf x = vload(p + s) * vset1(scale);
            vstore(p + s, x);
            m = vmax(m, x);
        }
        float lanes[kVW];
        vstore(lanes, m);
        for (int j = 0; j < kVW; ++j) mx = std::max(mx, lanes[j]);
    }
    for (; s < S; ++s) {
        p[s] = (mask && !mask[s]) ? -INFINITY : p[s] * scale;
        mx = std::max(mx, p[s]);
    }
    return mx;
}

// p[0..S) = exp(p - mx); returns their sum
static inline float exp_shifted(float* p, int64_t S, float mx) {
    int64_t s = 0;
    vf acc = vset1(0.f);
    for (; s + kVW <= S; s += kVW) {
        const vf e = vexp(vload(p + s) - vset1(mx));
        vstore(p + s, e);
        acc = acc + e;
    }
    float sum = vsum(acc);
    for (; s < S; ++s) { p[s] = std::exp(p[s] - mx); sum += p[s]; }
    return sum;
}

// g[i] = silu(g[i]) * u[i]
static inline void silu_mul(float* g, const float* u, int64_t n) {
    int64_t i = 0;
    for (; i + kVW <= n; i += kVW) {
        const vf x = vload(g + i);
        vstore(g + i, x / (vset1(1.f) + vexp(vset1(0.f) - x)) * vload(u + i));
    }
    for (; i < n; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

// gpt-oss's clamped SwiGLU: g = min(g, 7), (clamp(u, -7, 7) + 1) * g * sigmoid(1.702 g)
static inline void swiglu_oai_mul(float* g, const float* u, int64_t n) {
    const float alpha = 1.702f, limit = 7.f;
    for (int64_t i = 0; i < n; ++i) {
        const float x = std::min(g[i], limit), up = std::clamp(u[i], -limit, limit);
        g[i] = (up + 1.f) * x / (1.f + std::exp(-alpha * x));
    }
}

// g[i] = gelu(g[i]) * u[i], GELU's tanh approximation (torch's approximate="tanh"):
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), with tanh(z) = 1 - 2 / (e^(2z) + 1)
static inline void gelu_tanh_mul(float* g, const float* u, int64_t n) {
    const float c = 0.7978845608028654f, k = 0.044715f;
    int64_t i = 0;
    for (; i + kVW <= n; i += kVW) {
        const vf x = vload(g + i);
        const vf z = vset1(c) * vfma(vset1(k) * x, x * x, x);
        const vf t = vset1(1.f) - vset1(2.f) / (vexp(vset1(2.f) * z) + vset1(1.f));
        vstore(g + i, vset1(0.5f) * x * (vset1(1.f) + t) * vload(u + i));
    }
    for (; i < n; ++i) {
        const float x = g[i], t = std::tanh(c * (x + k * x * x * x));
        g[i] = 0.5f * x * (1.f + t) * u[i];
    }
}

// y = x * rsqrt(mean(x^2) + eps) * w, in float32 as models/llama.py's RMSNorm (squares summed in double)
// Sixteen sums side by side (which the compiler turns into vectors of doubles): one sum waited on
// each add, and a step takes many norms (16 a layer for 8 tokens).
static inline void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
    double part[16] = {};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; ++j) part[j] += (double)x[i + j] * x[i + j];
    for (int j = 8; j > 0; j /= 2)
        for (int k = 0; k < j; ++k) part[k] += part[k + j];
    double ss = part[0];
    for (; i < n; ++i) ss += (double)x[i] * x[i];
    const float r = 1.f / std::sqrt((float)(ss / n) + eps);
    for (i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
}

// RoPE in the half-split layout: channel i < R/2 turns with channel i + R/2; channels >= R pass
static inline void rope(float* v, const float* cs, const float* sn, int64_t R) {
    const int64_t half = R / 2;
    for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
    }
}
