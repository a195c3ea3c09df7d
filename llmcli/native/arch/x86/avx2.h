// The avx2 and avxvnni variants' kernels (isa.h). Block dot products with 256-bit integer
// multiply-adds: AVX2 (Haswell+, Zen 1-3) and AVX-VNNI (Alder Lake+), which differ in one
// instruction: 32 products of unsigned weight codes and signed activation codes summed into 8 int32
// lanes take maddubs + madd with AVX2, one vpdpbusd with VNNI. Signed codes (Q8_0, Q5_0, Q6_K)
// multiply as |w| times y with w's sign (maddubs takes one unsigned side). A decode step reads a copy
// of the weights interleaved 8 rows at a time instead, through avx2_rows8.h's kernels.
#pragma once
#include "avx2_rows8.h"
#include "simd.h"
#include "x86.h"

#define LLMCLI_DOT_ROW 1  // dot_row and quantize_block with n4 (dot.h)
#define LLMCLI_DOT_ROWS4 1

// A block's 32 floats into v, and their largest magnitude
static inline float load_block(const float* x, __m256 v[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) { v[j] = _mm256_loadu_ps(x + 8 * j); amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j])); }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

// One block of 32 floats -> int8 codes, scale and scaled sum: the bytes quantize_block_scalar gives;
// with n4, also the codes' 8 negated sums of 4 (sums_of_four's, from the codes in registers: the
// scalar sums were a fifth of a block's quantization)
static inline void quantize_block(const float* x, int8_t* q8, float& d_out, float& s_out, int32_t* n4 = nullptr) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes packs' lane interleave
    __m256 v[4];
    const float amax = load_block(x, v);
    const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    __m256i q[4];
    for (int j = 0; j < 4; ++j)  // round half to even, as nearbyint
        q[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], _mm256_set1_ps(id)),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s4 = _mm_hadd_epi32(s4, s4); s4 = _mm_hadd_epi32(s4, s4);
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    const __m256i codes = _mm256_permutevar8x32_epi32(packed, order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q8), codes);
    if (n4) {
        const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), codes), _mm256_set1_epi16(1));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(n4), _mm256_sub_epi32(_mm256_setzero_si256(), sums));
    }
    d_out = d; s_out = d * (float)_mm_cvtsi128_si32(s4);
}

// One block of 32 floats -> int8x2's high and low codes, their d and s and negated sums of 4: the
// bytes quantize_pair_scalar (blocks.h) and sums_of_four give
static inline void quantize_pair(const float* x, int8_t* hi, int8_t* lo, float* d, float* s, int32_t* n4_hi, int32_t* n4_lo) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes packs' lane interleave
    __m256 v[4];
    const float amax = load_block(x, v);
    const float e = amax / 127.f * (1.f / 256.f), ie = e > 0.f ? 1.f / e : 0.f;
    const __m256i top = _mm256_set1_epi32(32512), bottom = _mm256_set1_epi32(-32512), low = _mm256_set1_epi32(-127);
    __m256i h[4], l[4], sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
        const __m256i q = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_round_ps(
            _mm256_mul_ps(v[j], _mm256_set1_ps(ie)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)), top), bottom);
        h[j] = _mm256_srai_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(128)), 8);
        l[j] = _mm256_max_epi32(_mm256_sub_epi32(q, _mm256_slli_epi32(h[j], 8)), low);
        sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_slli_epi32(h[j], 8), l[j]));
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_hadd_epi32(s4, s4); s4 = _mm_hadd_epi32(s4, s4);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1), zero = _mm256_setzero_si256();
    for (int k = 0; k < 2; ++k) {
        const __m256i* c = k ? l : h;
        const __m256i codes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3])), order);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(k ? lo : hi), codes);
        const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, codes), ones16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(k ? n4_lo : n4_hi), _mm256_sub_epi32(zero, sums));
    }
    d[0] = 256.f * e, d[1] = e;
    s[0] = e * (float)_mm_cvtsi128_si32(s4), s[1] = 0.f;
}

namespace ymm {

static inline __m256i mul_sum(__m256i u, __m256i s) {  // (32 u8) x (32 s8) -> 8 int32, each the sum of 4 products
#if defined(LLMCLI_AVXVNNI)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

template <int T> constexpr bool signed_codes = T == kQ8_0 || T == kQ5_0 || T == kMXFP4;

// A 32-block's codes: signed (Q8_0, Q5_0: nibble - 16 where the 5th bit is 0; MXFP4: its nibbles
// looked up in kMXFP4Values, one vpshufb) or 0..15 / 0..31
template <int T>
static inline __m256i block_codes(const uint8_t* b) {
    if constexpr (T == kQ8_0) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    if constexpr (T == kMXFP4)
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kMXFP4Values))),
                                   nibbles(b + 1));
    if constexpr (T == kQ5_0) return _mm256_or_si256(nibbles(b + 6), _mm256_andnot_si256(bytes_from_bits(b + 2), _mm256_set1_epi8((char)0xF0)));
    if constexpr (T == kQ5_1) return _mm256_or_si256(nibbles(b + 8), _mm256_and_si256(bytes_from_bits(b + 4), _mm256_set1_epi8(0x10)));
    return nibbles(b + (T == kQ4_1 ? 4 : 2));
}

template <int T>
static inline __m256i block_dot(__m256i w, __m256i y) {  // 8 int32 lanes
    if constexpr (signed_codes<T>) return mul_sum(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w));
    return mul_sum(w, y);
}

// The weights' offset per unit of sum(x): Q4_0 -8d, Q4_1 and Q5_1 m, signed codes none
template <int T>
static inline float block_offset(const uint8_t* b, float d) {
    if constexpr (T == kQ4_0) return -8.f * d;
    if constexpr (T == kQ4_1 || T == kQ5_1) return h2f(b + 2);
    return 0.f;
}

// Sums of 4 vectors' int32 lanes: low 128 bits [a0..a3 of m0..m3 summed], high [a4..a7 of m0..m3]
static inline __m256 reduce4(__m256i m0, __m256i m1, __m256i m2, __m256i m3) {
    return _mm256_cvtepi32_ps(_mm256_hadd_epi32(_mm256_hadd_epi32(m0, m1), _mm256_hadd_epi32(m2, m3)));
}

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4 for one activation row, four blocks a step: their int32 products
// reduced together (hadd) and scaled by one vector, where one block at a time spends a conversion,
// a broadcast and a multiply-add on each.
template <int T>
static float dot32_row(const uint8_t* row, const Q8& x, int64_t nb) {
    constexpr int bytes = Block<T>::bytes;
    __m256 acc = _mm256_setzero_ps();
    __m128 off = _mm_setzero_ps();
    int64_t k = 0;
    for (; k + 4 <= nb; k += 4) {
        const uint8_t* b = row + k * bytes;
        __m256i m[4];
        for (int j = 0; j < 4; ++j)
            m[j] = block_dot<T>(block_codes<T>(b + j * bytes), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + (k + j) * 32)));
        const __m256 h = reduce4(m[0], m[1], m[2], m[3]);  // blocks 0..3 over their low 16 codes, then high 16
        __m128 dw;
        if constexpr (T == kQ4_1 || T == kQ5_1) {
            const __m256 dm = four_pairs(b, bytes);
            dw = _mm256_castps256_ps128(dm);
            off = _mm_fmadd_ps(_mm256_extractf128_ps(dm, 1), _mm_loadu_ps(x.s + k), off);
        } else if constexpr (T == kMXFP4) {
            dw = _mm_setr_ps(e8m0_half(b[0]), e8m0_half(b[bytes]), e8m0_half(b[2 * bytes]), e8m0_half(b[3 * bytes]));
        } else {
            dw = four_halves(b, bytes);
        }
        const __m128 s4 = _mm_mul_ps(dw, _mm_loadu_ps(x.d + k));
        acc = _mm256_fmadd_ps(h, _mm256_set_m128(s4, s4), acc);
        if constexpr (T == kQ4_0) off = _mm_fmadd_ps(_mm_mul_ps(dw, _mm_set1_ps(-8.f)), _mm_loadu_ps(x.s + k), off);
    }
    float o = 0.f;
    for (; k < nb; ++k) {
        const uint8_t* b = row + k * bytes;
        const float d = block_d<T>(b);
        const __m256 p = _mm256_cvtepi32_ps(block_dot<T>(block_codes<T>(b), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + k * 32))));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * x.d[k]), p, acc);
        o += block_offset<T>(b, d) * x.s[k];
    }
    return hsum8(acc) + hsum4(off) + o;
}

// Q4_K (w = d*sc*q - dmin*m per sub-block of 32): the 8 sub-blocks' products reduced in two vectors
static float q4k_row(const uint8_t* row, const Q8& x, int64_t nb) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps(), off = _mm256_setzero_ps();
    for (int64_t k = 0; k < nb / 8; ++k) {
        const uint8_t* b = row + k * 144;
        uint8_t sc[8], mn[8];
        k_scales(b + 4, sc, mn);
        const int8_t* y = x.q + k * 256;
        __m256i m[8];
        for (int c = 0; c < 4; ++c) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
            m[2 * c] = mul_sum(_mm256_and_si256(raw, low4), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 64 * c)));
            m[2 * c + 1] = mul_sum(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low4), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 64 * c + 32)));
        }
        const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc))));
        const __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn))));
        const __m256 s = _mm256_mul_ps(_mm256_mul_ps(scf, _mm256_set1_ps(h2f(b))), _mm256_loadu_ps(x.d + k * 8));
        const __m128 s_lo = _mm256_castps256_ps128(s), s_hi = _mm256_extractf128_ps(s, 1);
        acc = _mm256_fmadd_ps(reduce4(m[0], m[1], m[2], m[3]), _mm256_set_m128(s_lo, s_lo), acc);
        acc = _mm256_fmadd_ps(reduce4(m[4], m[5], m[6], m[7]), _mm256_set_m128(s_hi, s_hi), acc);
        off = _mm256_fmadd_ps(_mm256_mul_ps(mnf, _mm256_set1_ps(h2f(b + 2))), _mm256_loadu_ps(x.s + k * 8), off);
    }
    return hsum8(acc) - hsum8(off);
}

// Q6_K: half h (128 weights) of block b as 4 vectors of 32 signed codes q - 32: low nibbles of ql
// and 2 bits of qh each
static inline void q6k_codes(const uint8_t* b, int h, __m256i w[4]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3), c32 = _mm256_set1_epi8(32);
    const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
    const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i lo[4] = {_mm256_and_si256(l0, low4), _mm256_and_si256(l1, low4),
                           _mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(_mm256_srli_epi16(l1, 4), low4)};
    for (int j = 0; j < 4; ++j)
        w[j] = _mm256_sub_epi8(_mm256_or_si256(lo[j], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), two), 4)), c32);
}

// Q6_K (w = d*sc*(q - 32) per 16): per half of a block, its 4 vectors' products reduced together; the
// low lanes take each vector's first 16 codes (scales 0, 2, 4, 6), the high lanes the next 16
static float q6k_row(const uint8_t* row, const Q8& x, int64_t nb) {
    const __m256i even_odd = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t k = 0; k < nb / 8; ++k) {
        const uint8_t* b = row + k * 210;
        const float d = h2f(b + 208);
        for (int h = 0; h < 2; ++h) {
            __m256i w[4];
            q6k_codes(b, h, w);
            const int64_t i = k * 8 + 4 * h;  // the x blocks of this half's 4 vectors
            __m256i m[4];
            for (int j = 0; j < 4; ++j)
                m[j] = block_dot<kQ8_0>(w[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + (i + j) * 32)));
            const __m256 sc = _mm256_permutevar8x32_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 192 + 8 * h)))), even_odd);
            const __m128 dx = _mm_mul_ps(_mm_loadu_ps(x.d + i), _mm_set1_ps(d));
            acc = _mm256_fmadd_ps(reduce4(m[0], m[1], m[2], m[3]), _mm256_mul_ps(sc, _mm256_set_m128(dx, dx)), acc);
        }
    }
    return hsum8(acc);
}

// One weight row against one activation row of K = 32 * nb
template <int T>
static float dot_row(const uint8_t* row, const Q8& x, int64_t nb) {
    if constexpr (T == kQ4_K) return q4k_row(row, x, nb);
    else if constexpr (T == kQ6_K) return q6k_row(row, x, nb);
    else return dot32_row<T>(row, x, nb);
}

// One weight row against 4 activation rows: each weight block is decoded once for the four
template <int T>
static void dot_rows4(const uint8_t* row, const Q8* x, int64_t nb, float out[4]) {
    __m256 acc[4];
    float off[4] = {0.f, 0.f, 0.f, 0.f};
    for (int t = 0; t < 4; ++t) acc[t] = _mm256_setzero_ps();
    if constexpr (T == kQ4_K) {
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        for (int64_t k = 0; k < nb / 8; ++k) {
            const uint8_t* b = row + k * 144;
            const KHead h(b);
            const float d = h.d, dmin = h.dmin;
            const uint8_t *sc = h.sc, *mn = h.mn;
            for (int c = 0; c < 4; ++c) {
                const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
                const __m256i w1 = _mm256_and_si256(raw, low4), w2 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                const int64_t i = k * 8 + 2 * c;  // x blocks of sub-blocks 2c and 2c + 1
                for (int t = 0; t < 4; ++t) {
                    const __m256 p1 = _mm256_cvtepi32_ps(mul_sum(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].q + i * 32))));
                    const __m256 p2 = _mm256_cvtepi32_ps(mul_sum(w2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].q + i * 32 + 32))));
                    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * sc[2 * c] * x[t].d[i]), p1, acc[t]);
                    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * sc[2 * c + 1] * x[t].d[i + 1]), p2, acc[t]);
                    off[t] -= dmin * mn[2 * c] * x[t].s[i] + dmin * mn[2 * c + 1] * x[t].s[i + 1];
                }
            }
        }
    } else if constexpr (T == kQ6_K) {
        for (int64_t k = 0; k < nb / 8; ++k) {
            const uint8_t* b = row + k * 210;
            const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
            const float d = h2f(b + 208);
            for (int h = 0; h < 2; ++h) {
                __m256i w[4];
                q6k_codes(b, h, w);
                for (int j = 0; j < 4; ++j) {
                    const int8_t* s = sc + 8 * h + 2 * j;  // each 32-code vector spans two scales (lanes 0-3, 4-7)
                    const __m256 scale = _mm256_set_m128(_mm_set1_ps(d * s[1]), _mm_set1_ps(d * s[0]));
                    const int64_t i = k * 8 + 4 * h + j;
                    for (int t = 0; t < 4; ++t) {
                        const __m256 p = _mm256_cvtepi32_ps(block_dot<kQ8_0>(w[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].q + i * 32))));
                        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_set1_ps(x[t].d[i])), p, acc[t]);
                    }
                }
            }
        }
    } else {
        constexpr int bytes = Block<T>::bytes;
        for (int64_t k = 0; k < nb; ++k) {
            const uint8_t* b = row + k * bytes;
            const float d = block_d<T>(b), o = block_offset<T>(b, d);
            const __m256i w = block_codes<T>(b);
            for (int t = 0; t < 4; ++t) {
                const __m256 p = _mm256_cvtepi32_ps(block_dot<T>(w, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t].q + k * 32))));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[t].d[k]), p, acc[t]);
                off[t] += o * x[t].s[k];
            }
        }
    }
    for (int t = 0; t < 4; ++t) out[t] = hsum8(acc[t]) + off[t];
}

}  // namespace ymm

using ymm::dot_row;
using ymm::dot_rows4;
