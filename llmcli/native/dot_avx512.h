// Block dot products with AVX-512 VNNI (Zen 4/5, Ice Lake and later): vpdpbusd multiplies 64
// unsigned weight codes by 64 signed activation codes into 16 int32 lanes, two 32-blocks (or two
// sub-blocks) a vector. Codes with a zero point (Q4_0's q - 8, Q5_0's q - 16, Q6_K's q - 32, Q8_0's
// q as q + 128) go in unsigned as stored, and the accumulator starts at -zero * (each 4 activation
// codes' sum): the offset costs one shift, where the sign trick of the 256-bit variants costs two
// instructions per vector (and AVX-512 has no vpsignb).
#pragma once
#include "x86.h"

static inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
static inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The zero point of a 32-block's unsigned codes (w = d * (code - zero)); Q4_1/Q5_1 have m instead
template <int T> constexpr int zero_shift = T == kQ4_0 ? 3 : T == kQ5_0 ? 4 : T == kQ8_0 ? 7 : T == kQ6_K ? 5 : -1;

template <int T>
static inline __m512i start512(const int32_t* n4) {  // 16 lanes: -zero * sum of 4 activation codes, or 0
    if constexpr (zero_shift<T> < 0) return _mm512_setzero_si512();
    else return _mm512_slli_epi32(load512(n4), zero_shift<T>);
}

template <int T>
static inline __m256i start256(const int32_t* n4) {
    if constexpr (zero_shift<T> < 0) return _mm256_setzero_si256();
    else return _mm256_slli_epi32(load256(n4), zero_shift<T>);
}

// Two 32-blocks' codes as 64 unsigned bytes in element order (block a's 32, then b's)
template <int T>
static inline __m512i codes2(const uint8_t* a, const uint8_t* b) {
    if constexpr (T == kQ8_0) {  // q + 128
        const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(load256(a + 2)), load256(b + 2), 1);
        return _mm512_xor_si512(z, _mm512_set1_epi8((char)0x80));
    } else {
        constexpr int at = T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : 8;  // where qs starts
        const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + at))),
                                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + at)), 1);
        const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1);  // [a, b, a>>4, b>>4]
        __m512i c = _mm512_and_si512(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)), _mm512_set1_epi8(0x0F));
        if constexpr (T == kQ5_0 || T == kQ5_1) {  // the 5th bits: bit j of qh is element j's
            uint32_t ha, hb;
            std::memcpy(&ha, a + at - 4, 4); std::memcpy(&hb, b + at - 4, 4);
            c = _mm512_mask_add_epi8(c, (__mmask64)ha | ((__mmask64)hb << 32), c, _mm512_set1_epi8(16));
        }
        return c;
    }
}

template <int T>
static inline __m256i codes1(const uint8_t* a) {  // one 32-block's codes, as codes2's
    if constexpr (T == kQ8_0) return _mm256_xor_si256(load256(a + 2), _mm256_set1_epi8((char)0x80));
    constexpr int at = T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : 8;
    __m256i c = nibbles(a + at);
    if constexpr (T == kQ5_0 || T == kQ5_1) {
        uint32_t h;
        std::memcpy(&h, a + at - 4, 4);
        c = _mm256_mask_add_epi8(c, (__mmask32)h, c, _mm256_set1_epi8(16));
    }
    return c;
}

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 for one activation row, four blocks a step: two vectors of two
// blocks, their 8-lane halves scaled by d * dx of their block (one permute from 4 scales each)
template <int T>
static float dot32_row(const uint8_t* row, const Q8& x, int64_t nb) {
    constexpr int bytes = Block<T>::bytes;
    const __m512i lo2 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i hi2 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    __m512 acc = _mm512_setzero_ps();
    __m128 off = _mm_setzero_ps();
    int64_t k = 0;
    for (; k + 4 <= nb; k += 4) {
        const uint8_t* b = row + k * bytes;
        const __m512i p01 = _mm512_dpbusd_epi32(start512<T>(x.n4 + 8 * k), codes2<T>(b, b + bytes), load512(x.q + 32 * k));
        const __m512i p23 = _mm512_dpbusd_epi32(start512<T>(x.n4 + 8 * k + 16), codes2<T>(b + 2 * bytes, b + 3 * bytes), load512(x.q + 32 * k + 64));
        const __m512 s = _mm512_castps128_ps512(_mm_mul_ps(four_halves(b, bytes), _mm_loadu_ps(x.d + k)));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p01), _mm512_permutexvar_ps(lo2, s), acc);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p23), _mm512_permutexvar_ps(hi2, s), acc);
        if constexpr (T == kQ4_1 || T == kQ5_1) off = _mm_fmadd_ps(four_halves(b + 2, bytes), _mm_loadu_ps(x.s + k), off);
    }
    float tail = 0.f;
    for (; k < nb; ++k) {
        const uint8_t* b = row + k * bytes;
        const __m256i p = _mm256_dpbusd_epi32(start256<T>(x.n4 + 8 * k), codes1<T>(b), load256(x.q + 32 * k));
        tail += h2f(b) * x.d[k] * hsum8(_mm256_cvtepi32_ps(p));
        if constexpr (T == kQ4_1 || T == kQ5_1) tail += h2f(b + 2) * x.s[k];
    }
    return _mm512_reduce_add_ps(acc) + hsum4(off) + tail;
}

// Q4_K: per 256-block, 4 vectors of two sub-blocks (a 32-byte run's low nibbles, then its high ones,
// as the activations lie); each 8-lane half scaled by d * sc * dx of its sub-block
static float q4k_row(const uint8_t* row, const Q8& x, int64_t nb) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512i pick[4];  // lanes 0-7 from sub-block 2c's scale, 8-15 from 2c + 1's
    for (int c = 0; c < 4; ++c) pick[c] = _mm512_inserti64x4(_mm512_set1_epi32(2 * c), _mm256_set1_epi32(2 * c + 1), 1);
    __m512 acc = _mm512_setzero_ps();
    __m256 off = _mm256_setzero_ps();
    for (int64_t k = 0; k < nb / 8; ++k) {
        const uint8_t* b = row + k * 144;
        uint8_t sc[8], mn[8];
        k_scales(b + 4, sc, mn);
        const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc))));
        const __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn))));
        const __m512 s = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_mul_ps(scf, _mm256_set1_ps(h2f(b))), _mm256_loadu_ps(x.d + 8 * k)));
        off = _mm256_fmadd_ps(_mm256_mul_ps(mnf, _mm256_set1_ps(h2f(b + 2))), _mm256_loadu_ps(x.s + 8 * k), off);
        for (int c = 0; c < 4; ++c) {
            const __m256i raw = load256(b + 16 + 32 * c);
            const __m512i w = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1), low4);
            const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, load512(x.q + 256 * k + 64 * c));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_permutexvar_ps(pick[c], s), acc);
        }
    }
    return _mm512_reduce_add_ps(acc) - hsum8(off);
}

// Q6_K: per half of a block (128 weights), two vectors of two quarters; ql's 64 bytes give the low
// four bits of quarters 0, 1 (low nibbles) and 2, 3 (high), qh's 32 bytes their top two (bit pairs
// 0, 1, 2, 3 for the quarters). Codes 0..63 with zero point 32; each 4 lanes share one scale.
static float q6k_row(const uint8_t* row, const Q8& x, int64_t nb) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
    const __m512i pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);  // scale i is in x block i / 2
    __m512i pick[4];  // lane l of the vector for quarters (2v, 2v + 1): scale 4v + l / 4
    for (int v = 0; v < 4; ++v)
        pick[v] = _mm512_add_epi32(_mm512_set1_epi32(4 * v), _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2));
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < nb / 8; ++k) {
        const uint8_t* b = row + k * 210;
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192))));
        const __m512 dx = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(_mm256_loadu_ps(x.d + 8 * k)));
        const __m512 s = _mm512_mul_ps(_mm512_mul_ps(sc, _mm512_set1_ps(h2f(b + 208))), dx);  // d * sc * dx per 16 weights
        for (int h = 0; h < 2; ++h) {
            const __m512i l = load512(b + 64 * h);
            const __m256i qh = load256(b + 128 + 32 * h);
            const __m512i hb = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);  // [qh, qh >> 2]
            const __m512i w01 = _mm512_or_si512(_mm512_and_si512(l, low4), _mm512_and_si512(_mm512_slli_epi16(hb, 4), top2));
            const __m512i w23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4), _mm512_and_si512(hb, top2));
            const int64_t at = 256 * k + 128 * h;  // this half's activations
            const __m512i p01 = _mm512_dpbusd_epi32(start512<kQ6_K>(x.n4 + at / 4), w01, load512(x.q + at));
            const __m512i p23 = _mm512_dpbusd_epi32(start512<kQ6_K>(x.n4 + at / 4 + 16), w23, load512(x.q + at + 64));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p01), _mm512_permutexvar_ps(pick[2 * h], s), acc);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p23), _mm512_permutexvar_ps(pick[2 * h + 1], s), acc);
        }
    }
    return _mm512_reduce_add_ps(acc);
}

// One weight row against one activation row of K = 32 * nb
template <int T>
static float dot_row(const uint8_t* row, const Q8& x, int64_t nb) {
    if constexpr (T == kQ4_K) return q4k_row(row, x, nb);
    else if constexpr (T == kQ6_K) return q6k_row(row, x, nb);
    else return dot32_row<T>(row, x, nb);
}
