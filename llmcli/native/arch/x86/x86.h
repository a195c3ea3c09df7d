// Block helpers every x86 variant's kernels use (AVX2 is in all of them): code unpacking, horizontal
// sums, four blocks' scales at once.
#pragma once
#include "../../src/blocks.h"
#include "simd.h"

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

// A row group's fetches while its block b (`bytes` bytes) is worked on: the next group's block b
// (`ahead`, a whole group on: tens of KB) into L2 only, and this group's bytes kFetchOn on into L1.
// Fetched into L1 a group ahead, most lines were evicted again before their turn, and each held one
// of the core's few fill buffers while it came: one thread read memory well below the rate plain
// loads reach (docs/performance-log.md, 2026-11-28, "Prefetching the row groups").
constexpr int64_t kFetchOn = 2048;
template <int bytes>
static inline void fetch_for_block(const uint8_t* w, const uint8_t* ahead, int64_t b) {
    for (int at = 0; at < bytes; at += 64) {
        if (ahead) _mm_prefetch(reinterpret_cast<const char*>(ahead + b * bytes + at), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(w + kFetchOn + b * bytes + at), _MM_HINT_T0);
    }
}
