// x86 helpers every x86 variant has (AVX2 is in all of them): activation quantization, code
// unpacking, horizontal sums.
#pragma once
#include "../../src/blocks.h"

// One block of 32 floats -> int8 codes, scale and scaled sum: the bytes quantize_block_scalar gives;
// with n4, also the codes' 8 negated sums of 4 (sums_of_four's, from the codes in registers: the
// scalar sums were a fifth of a block's quantization)
#if defined(LLMCLI_AVX512VNNI)
static inline void quantize_block(const float* x, int8_t* q8, float& d_out, float& s_out, int32_t* n4 = nullptr) {  // two 16-float halves
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    const __m512 vid = _mm512_set1_ps(id);
    constexpr int even = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;  // round half to even, as nearbyint
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v0, vid), even));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v1, vid), even));
    const __m256i codes = _mm256_set_m128i(_mm512_cvtsepi32_epi8(q1), _mm512_cvtsepi32_epi8(q0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q8), codes);
    if (n4) {
        const __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), codes);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(n4), _mm256_sub_epi32(_mm256_setzero_si256(), sums));
    }
    d_out = d;
    s_out = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
}
#else
static inline void quantize_block(const float* x, int8_t* q8, float& d_out, float& s_out, int32_t* n4 = nullptr) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes packs' lane interleave
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) { v[j] = _mm256_loadu_ps(x + 8 * j); amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j])); }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.f, id = d > 0.f ? 1.f / d : 0.f;
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
#endif

static inline __m256i nibbles(const uint8_t* qs) {  // 16 bytes -> 32 codes: low nibbles, then high ones
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

static inline __m256i bytes_from_bits(const uint8_t* p) {  // bit j of 32 -> byte j: 0xFF if set, else 0
    uint32_t x; std::memcpy(&x, p, 4);
    const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bytes = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuffle),
                                          _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

static inline float hsum8(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline float hsum4(__m128 r) {
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

// Four float16 values `stride` bytes apart (the d of four consecutive blocks) as floats. Put
// together in a register: four 2-byte stores read back as one 8-byte load would miss store forwarding.
static inline __m128 four_halves(const uint8_t* p, int64_t stride) {
    uint64_t v = 0;
    for (int j = 0; j < 4; ++j) {
        uint16_t h;
        std::memcpy(&h, p + j * stride, 2);
        v |= (uint64_t)h << (16 * j);
    }
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)v));
}

// The float16 pairs (d, m) at the start of four blocks `stride` bytes apart: [d0..d3 | m0..m3]
static inline __m256 four_pairs(const uint8_t* p, int64_t stride) {
    uint32_t u[4];
    for (int j = 0; j < 4; ++j) std::memcpy(&u[j], p + j * stride, 4);
    const __m256 dm = _mm256_cvtph_ps(_mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]));  // d0 m0 d1 m1 ...
    return _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
}
