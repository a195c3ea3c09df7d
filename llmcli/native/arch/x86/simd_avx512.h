// The float vectors of the avx512vnni variant: 16 floats (vec.h's primitives, see there).
#pragma once
#include "simd.h"

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
static inline vf vload_half(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
static inline vf vload_bf16(const uint16_t* p) {  // each to the top half of a float
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// out[j] = the sum of acc[j]'s lanes, the four reduced together (a transpose's adds, as the block
// kernels reduce four rows)
static inline void reduce4(const vf acc[4], float out[4]) {
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(acc[0], acc[1]), _mm512_unpackhi_ps(acc[0], acc[1]));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(acc[2], acc[3]), _mm512_unpackhi_ps(acc[2], acc[3]));
    const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, 0x44), _mm512_shuffle_ps(t0, t1, 0xEE));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

constexpr int kAccumulators = 16;  // vectors a loop may keep summing in registers (half of AVX-512's 32)
// Activation rows an F16/BF16 micro-tile takes against 4 weight rows (float_rows.h): 24 sums, 4 weights, 1 input
constexpr int kFloatCols = 6;

// The first n lanes of p (zeros beyond), and into p
static inline vf vloadn(const float* p, int n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
static inline void vstoren(float* p, vf v, int n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v); }

// F16/BF16 rows with a vector's lanes over 16 weight rows (half_rows.h's columns): 32 elements of
// each row at once, as pairs (32 bits) transposed 16 x 16, then split into floats
#define LLMCLI_HALF_COLS 1
// r[i] lane j -> r[j] lane i (16 x 16 32-bit lanes)
static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

// 32 2-byte floats of each of 16 rows as 16 vectors of pairs (32 bits: elements 2j, 2j + 1)
using vpairs = __m512i;
// Rows w + r * ldw (r < rows <= 16; the lanes beyond repeat the last row), elements [k, k + 32):
// p[j] lane r = row r's elements k + 2j (low half) and k + 2j + 1 (high half)
static inline void load_pairs16(const uint16_t* w, int64_t ldw, int rows, int64_t k, vpairs p[16]) {
    for (int i = 0; i < 16; ++i) p[i] = _mm512_loadu_si512(w + (i < rows ? i : rows - 1) * ldw + k);
    transpose16(p);
}
// A pair's first and second elements as floats, exactly (float16 where f16, else bfloat16)
template <bool f16> static inline vf pair_first(vpairs p) {
    if constexpr (f16) return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(p));
    else return _mm512_castsi512_ps(_mm512_slli_epi32(p, 16));
}
template <bool f16> static inline vf pair_second(vpairs p) {
    if constexpr (f16) return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(p, 16)));
    else return _mm512_castsi512_ps(_mm512_and_si512(p, _mm512_set1_epi32((int)0xffff0000u)));
}
