// Activation rows to their columns (blocks.h's Q8Cols), as the row-group kernels (avx2_rows8.h,
// avx512_rows16.h) read them: kernels.h's Q8Rows::to_cols calls these, block by block.
#pragma once
#include "../../src/blocks.h"
#include "simd.h"

static_assert(kColGroup == 8, "block_to_cols transposes groups of 8");

// The codes of one block of the eight rows at `rows` (K bytes apart; rows >= n: zeros) to the
// group's columns at `to` (Q8Cols: 4 codes j of column c at 32 j + 4 c): a transpose of 8 x 8 int32;
// minus the sums of each column's first and last 16 codes to n16 (kColGroup apart), and of all 32 to n32
static inline void block_to_cols(const int8_t* rows, int64_t K, int n, int8_t* to, int32_t* n32, int32_t* n16) {
    __m256i v[8];
    for (int r = 0; r < 8; ++r)
        v[r] = r < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + r * K)) : _mm256_setzero_si256();
    __m256i t[8], u[8];
    for (int r = 0; r < 8; r += 2) {
        t[r] = _mm256_unpacklo_epi32(v[r], v[r + 1]);
        t[r + 1] = _mm256_unpackhi_epi32(v[r], v[r + 1]);
    }
    for (int r = 0; r < 8; r += 4) {
        u[r] = _mm256_unpacklo_epi64(t[r], t[r + 2]);
        u[r + 1] = _mm256_unpackhi_epi64(t[r], t[r + 2]);
        u[r + 2] = _mm256_unpacklo_epi64(t[r + 1], t[r + 3]);
        u[r + 3] = _mm256_unpackhi_epi64(t[r + 1], t[r + 3]);
    }
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i half[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    // codes 4j..4j+3 of every row (j and 4 + j from the same two vectors), stored as they are made:
    // gcc kept an array of the eight in memory and moved them through general registers
    const auto put = [&](int j, __m256i codes) __attribute__((always_inline)) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 32 * j), codes);
        half[j / 4] = _mm256_sub_epi32(half[j / 4], _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, codes), ones16));
    };
    for (int j = 0; j < 4; ++j) {
        put(j, _mm256_permute2x128_si256(u[j], u[4 + j], 0x20));
        put(4 + j, _mm256_permute2x128_si256(u[j], u[4 + j], 0x31));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(n16), half[0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(n16 + kColGroup), half[1]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(n32), _mm256_add_epi32(half[0], half[1]));
}

// Row m's block b alone to its column (a one-token step's: an eighth of block_to_cols' stores)
static inline void block_to_col(const int8_t* qb, const int32_t* n4, int8_t* to, int32_t* n32, int32_t* n16) {
    for (int j = 0; j < 8; ++j) std::memcpy(to + kColGroup * 4 * j, qb + 4 * j, 4);
    const int32_t lo = n4[0] + n4[1] + n4[2] + n4[3], hi = n4[4] + n4[5] + n4[6] + n4[7];
    *n32 = lo + hi;
    n16[0] = lo;
    n16[kColGroup] = hi;
}
