// Float vectors as wide as the variant's registers (16 floats with AVX-512, 8 with AVX2, 4 with
// NEON and in the portable build), a handful of primitives per instruction set, and the
// element-wise work written once over them: dot products, e^x, SiLU, GELU, RMSNorm, RoPE.
#pragma once
#include <cmath>
#include <cstdint>

#include "isa.h"

#if defined(LLMCLI_AVX512VNNI)
using vf = __m512;
static inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
static inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vround(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vf vpow2i(vf n) {  // 2^n for integral n in [-126, 127]
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
static inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
static inline bool vany_above(vf v, float t) { return _mm512_cmp_ps_mask(v, _mm512_set1_ps(t), _CMP_NLE_UQ) != 0; }
#elif defined(LLMCLI_X86)
using vf = __m256;
static inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
static inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vset1(float x) { return _mm256_set1_ps(x); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf vround(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vf vpow2i(vf n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline float vsum(vf v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
}
static inline bool vany_above(vf v, float t) { return _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(t), _CMP_NLE_UQ)) != 0; }
#elif defined(LLMCLI_NEON)
using vf = float32x4_t;
static inline vf vload(const float* p) { return vld1q_f32(p); }
static inline void vstore(float* p, vf v) { vst1q_f32(p, v); }
static inline vf vset1(float x) { return vdupq_n_f32(x); }
static inline vf vfma(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
static inline vf vmax(vf a, vf b) { return vmaxq_f32(a, b); }
static inline vf vmin(vf a, vf b) { return vminq_f32(a, b); }
static inline vf vround(vf a) { return vrndnq_f32(a); }
static inline vf vpow2i(vf n) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23));
}
static inline float vsum(vf v) { return vaddvq_f32(v); }
static inline bool vany_above(vf v, float t) { return vmaxvq_u32(vmvnq_u32(vcleq_f32(v, vdupq_n_f32(t)))) != 0; }
#else  // GCC/Clang vector extensions: the compiler's baseline SIMD (SSE2 on x86-64), or scalar code
typedef float vf __attribute__((vector_size(16)));
typedef int32_t vi __attribute__((vector_size(16)));
static inline vf vload(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
static inline vf vset1(float x) { return vf{x, x, x, x}; }
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline vf vselect(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }  // m ? a : b, lane by lane
static inline vf vmax(vf a, vf b) { return vselect(a > b, a, b); }
static inline vf vmin(vf a, vf b) { return vselect(a < b, a, b); }
static inline vf vround(vf a) { return (a + vset1(12582912.f)) - vset1(12582912.f); }  // |a| < 2^22, ties to even
static inline vf vpow2i(vf n) { return (vf)((__builtin_convertvector(n, vi) + 127) << 23); }
static inline float vsum(vf v) { return (v[0] + v[1]) + (v[2] + v[3]); }
static inline bool vany_above(vf v, float t) {
    const vi le = (vi)(v <= vset1(t));  // -1 where v <= t; NaN compares false
    return (le[0] & le[1] & le[2] & le[3]) == 0;
}
#endif

constexpr int kVW = sizeof(vf) / sizeof(float);

// vany_above(v, t): some lane of v is above t, or NaN

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

// sum of a[i] * b[i]: four independent chains (one would wait on each multiply-add)
static inline float dot_f32(const float* a, const float* b, int64_t n) {
    int64_t i = 0;
    vf acc[4] = {vset1(0.f), vset1(0.f), vset1(0.f), vset1(0.f)};
    for (; i + 4 * kVW <= n; i += 4 * kVW)
        for (int j = 0; j < 4; ++j) acc[j] = vfma(vload(a + i + kVW * j), vload(b + i + kVW * j), acc[j]);
    for (; i + kVW <= n; i += kVW) acc[0] = vfma(vload(a + i), vload(b + i), acc[0]);
    float s = vsum((acc[0] + acc[1]) + (acc[2] + acc[3]));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

// out[j] = a . b_j for four rows b_j = b + j * stride (n floats each): one chain a row, the four
// reduced together (AVX-512: a transpose's adds, as the block kernels reduce four rows)
static inline void dot4_f32(const float* a, const float* b, int64_t stride, int64_t n, float out[4]) {
    vf acc[4] = {vset1(0.f), vset1(0.f), vset1(0.f), vset1(0.f)};
    int64_t i = 0;
    for (; i + kVW <= n; i += kVW) {
        const vf x = vload(a + i);
        for (int j = 0; j < 4; ++j) acc[j] = vfma(x, vload(b + j * stride + i), acc[j]);
    }
#if defined(LLMCLI_AVX512VNNI)
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(acc[0], acc[1]), _mm512_unpackhi_ps(acc[0], acc[1]));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(acc[2], acc[3]), _mm512_unpackhi_ps(acc[2], acc[3]));
    const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, 0x44), _mm512_shuffle_ps(t0, t1, 0xEE));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
#else
    for (int j = 0; j < 4; ++j) out[j] = vsum(acc[j]);
#endif
    for (; i < n; ++i)
        for (int j = 0; j < 4; ++j) out[j] += a[i] * b[j * stride + i];
}

// o[0..D) = sum over s of w[s] * V[s * stride + 0..D): 64 columns at a time held in registers, even
// and odd slots in two sets of accumulators (one set waited on each multiply-add's latency)
static inline void weighted_rows(const float* w, const float* V, int64_t stride, int64_t S, int64_t D, float* o) {
    constexpr int R = 64 / kVW;
    int64_t c = 0;
    for (; c + 64 <= D; c += 64) {
        vf acc[R], acc2[R];
        for (int j = 0; j < R; ++j) acc[j] = acc2[j] = vset1(0.f);
        int64_t s = 0;
        for (; s + 2 <= S; s += 2) {
            const vf w0 = vset1(w[s]), w1 = vset1(w[s + 1]);
            const float* v0 = V + s * stride + c;
            for (int j = 0; j < R; ++j) {
                acc[j] = vfma(w0, vload(v0 + kVW * j), acc[j]);
                acc2[j] = vfma(w1, vload(v0 + stride + kVW * j), acc2[j]);
            }
        }
        if (s < S) {
            const vf ws = vset1(w[s]);
            for (int j = 0; j < R; ++j) acc[j] = vfma(ws, vload(V + s * stride + c + kVW * j), acc[j]);
        }
        for (int j = 0; j < R; ++j) vstore(o + c + kVW * j, acc[j] + acc2[j]);
    }
    for (; c < D; ++c) {
        float acc = 0.f;
        for (int64_t s = 0; s < S; ++s) acc += w[s] * V[s * stride + c];
        o[c] = acc;
    }
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
static inline void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += (double)x[i] * x[i];
    const float r = 1.f / std::sqrt((float)(ss / n) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
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
