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
