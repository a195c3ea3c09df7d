// The float vectors of the avxvnni and avx2 variants: 8 floats (vec.h's primitives, see there).
#pragma once
#include "simd.h"

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
static inline vf vload_half(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
static inline vf vload_bf16(const uint16_t* p) {  // each to the top half of a float
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
static inline void reduce4(const vf acc[4], float out[4]) {
    for (int j = 0; j < 4; ++j) out[j] = vsum(acc[j]);
}

constexpr int kAccumulators = 8;  // vectors a loop may keep summing in registers (half of AVX2's 16)
// Activation rows an F16/BF16 micro-tile takes against 4 weight rows (float_rows.h): 12 sums, 4 weights
// (the inputs as the multiply-adds' memory operands)
constexpr int kFloatCols = 3;
