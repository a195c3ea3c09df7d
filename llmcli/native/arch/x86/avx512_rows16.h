// AVX-512 VNNI kernels for the copy of the weights interleaved 16 rows at a time (row_groups.h;
// part of avx512.h's kernels). A decode step keeps such a copy of each projection of the
// nibble types, Q8_0, MXFP4 and the K-quants: one vpdpbusd multiplies 4 codes of 16 rows by 4 activation
// codes broadcast from memory, 8 of them sum a block's (K: a sub-block's) 32 products in each lane,
// and one conversion and one multiply-add scale them, with no sums across lanes at all.
// The same code serves one activation row and several (a batch, a prompt), each row through the
// same operations in the same order, so a row's numbers never depend on the rows beside it.
// Several times faster than the kernels on the blocks as stored (avx512.h), where the unpacking, the
// sums across lanes and the scaling were most of the work (docs/performance-choices.md).
#pragma once
#include "../../src/row_groups.h"
#include "avx512_blocks.h"
#include "cols.h"

#define LLMCLI_GROUPED 1
constexpr int kGroupRows = 16;  // weight rows a group (a vector's lanes)
constexpr int kGroupCols = 8;  // activation rows a tile
constexpr int R16 = kGroupRows;

static inline __m512 bytes_times(const uint8_t* p, const uint8_t* half, bool sign = false) {  // 16 bytes times 16 float16
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(sign ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v)), _mm512_cvtph_ps(load256(half)));
}
// Block b's 16 rows' scales d (Q6_K: half h's, the scale of codes 16h..16h + 15), and for
// grouped_min types their m, as they add (Q4_K's -dmin * m)
// 16 e8m0 bytes as blocks.h's e8m0_half: 2^(e - 128), (e - 1) << 23 as float bits (e < 2: denormals)
static inline __m512 e8m0_halves16(const uint8_t* p) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i small = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), normal, small));
}

template <int T>
static inline __m512 rows16_d(const uint8_t* w, int64_t b, int h = 0) {
    if constexpr (T == kMXFP4) return e8m0_halves16(group_halves<T, R16>(w, b));
    else if constexpr (is_k45<T>) return bytes_times(group_block<T, R16>(w, b), group_halves<T, R16>(w, b));
    else if constexpr (T == kQ6_K) return bytes_times(group_block<T, R16>(w, b) + 16 * h, group_halves<T, R16>(w, b), true);
    else return _mm512_cvtph_ps(load256(group_halves<T, R16>(w, b)));
}
template <int T>
static inline __m512 rows16_m(const uint8_t* w, int64_t b) {
    if constexpr (is_k45<T>) {
        const __m512 m = bytes_times(group_block<T, R16>(w, b) + 16, group_halves<T, R16>(w, b) + 32);
        return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(m), _mm512_set1_epi32(INT32_MIN)));  // -m, exactly
    } else {
        return _mm512_cvtph_ps(load256(group_halves<T, R16>(w, b) + group_min_at<T, R16>));
    }
}

static inline __m512i broadcast4(const int8_t* p) { int32_t v; std::memcpy(&v, p, 4); return _mm512_set1_epi32(v); }

// Block b's codes for the 16 rows of the group at w: u[p] lane r holds row r's codes 4p..4p+3
// (p < 4) or 16 + 4(p - 4).. (p >= 4), unsigned
template <int T>
static LLMCLI_INLINE void rows16_codes(const uint8_t* w, int64_t b, __m512i u[8]) {
    const uint8_t* codes = group_codes<T, R16>(w, b);
    if constexpr (T == kQ8_0) {
        for (int p = 0; p < 8; ++p) u[p] = load512(codes + 64 * p);
    } else {
        const __m512i low4 = _mm512_set1_epi8(0x0F);
        for (int p = 0; p < 4; ++p) {
            const __m512i v = load512(codes + 64 * p);
            u[p] = _mm512_and_si512(v, low4);
            u[p + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        }
        if constexpr (T == kQ6_K) {  // the top 2 bits to bits 4, 5: u | (H_a shifted & 0x30)
            const __m512i top2 = _mm512_set1_epi8(0x30);
            for (int a = 0; a < 2; ++a) {
                const __m512i h = load512(codes + 256 + 64 * a);
                const __m512i at[4] = {_mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 2), h, _mm512_srli_epi16(h, 2)};
                for (int k = 0; k < 4; ++k) u[4 * a + k] = _mm512_ternarylogic_epi32(u[4 * a + k], at[k], top2, 0xF8);  // A | (B & C)
            }
        }
        if constexpr (T == kMXFP4) {  // looked up as kMXFP4Values + 128 (zero_point's)
            const __m512i values = _mm512_broadcast_i32x4(_mm_xor_si128(
                _mm_load_si128(reinterpret_cast<const __m128i*>(kMXFP4Values)), _mm_set1_epi8((char)0x80)));
            for (int p = 0; p < 8; ++p) u[p] = _mm512_shuffle_epi8(values, u[p]);
        }
        if constexpr (fifth_bits<T>) {
            const __m512i fifth = _mm512_set1_epi8(16);
            const uint8_t* masks = group_masks<T, R16>(w, b);
            for (int p = 0; p < 8; ++p) {
                uint64_t m;
                std::memcpy(&m, masks + 8 * p, 8);
                u[p] = _mm512_mask_add_epi8(u[p], (__mmask64)m, u[p], fifth);
            }
        }
    }
}

// Column c's accumulator start for codes stored with a zero point z (q - z): -z * (the block's codes'
// sum; Q6_K's, whose scales go by 16: half h's)
template <int T>
static inline __m512i rows16_start(const Q8Cols& x, int64_t b, int h, int c) {
    constexpr int z = zero_point<T>;
    if constexpr (T == kQ6_K) return _mm512_set1_epi32(z * x.n16[2 * kColGroup * b + kColGroup * h + c]);
    return z ? _mm512_set1_epi32(z * x.n32[kColGroup * b + c]) : _mm512_setzero_si512();
}

// The interleaved group of 16 rows at w (nb blocks) against the activation rows of x, columns
// [0, C) (Q8Cols: side by side, one pointer for all): out[16 * c + r] = row r . column c. Each (row, activation row) lane: for each block in order, the 32 products summed
// in int32, times (d * the activation's d) added to its sum; Q4_1's, Q5_1's and Q4_K's m * the
// activation's s added to another sum, block by block, then to the first. The activation rows' sums go side by
// side, a vpdpbusd of each in turn: one row's 8 in a row wait on each other (5 cycles each), and the
// scheduler did not look far enough ahead to overlap the rows.
// `ahead`: the next group (or null), fetched into L2 block by block as this one is read (x86.h fetch_for_block).
// `Pairs`: columns 2j and 2j + 1 are one int8x2 row's high and low bytes (blocks.h's quantize_pair_scalar):
// their sums add in int32 as 256 s_h + s_l and scale once, at the low row's d, into out[16 j + r];
// the m sums take the high row's s, the whole block's.
template <int T, int C, bool Pairs = false>
static void group_tile(const uint8_t* w, int64_t nb, const Q8Cols& x, float* out, const uint8_t* ahead) {
    constexpr int bytes = group_stride<T, R16>, O = Pairs ? C / 2 : C, step = Pairs ? 2 : 1;
    static_assert(!Pairs || C % 2 == 0, "pairs come whole");
    __m512 acc[O];
    for (int c = 0; c < O; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        fetch_for_block<bytes>(w, ahead, b);
        __m512i u[8], s[C], s2[C];
        rows16_codes<T>(w, b, u);
        constexpr int H = scale_parts<T>, P = 8 / H;  // (Q6_K: codes 0-15, then 16-31, each half scaled alone)
        // one column: its 8 multiply-adds in two chains (even p, odd p), added after: one chain of 8
        // waited on each link where nothing else was left to overlap (with two columns, two chains)
        constexpr bool split = C == 1;
#pragma GCC unroll 2
        for (int h = 0; h < H; ++h) {
            for (int c = 0; c < C; ++c) s[c] = rows16_start<T>(x, b, h, c), s2[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int p = P * h; p < P * h + P; ++p)
#pragma GCC unroll 8
                for (int c = 0; c < C; ++c) {
                    if (split && p % 2) s2[c] = _mm512_dpbusd_epi32(s2[c], u[p], broadcast4(x.q + kColGroup * (32 * b + 4 * p) + 4 * c));
                    else s[c] = _mm512_dpbusd_epi32(s[c], u[p], broadcast4(x.q + kColGroup * (32 * b + 4 * p) + 4 * c));
                }
            if (split)
                for (int c = 0; c < C; ++c) s[c] = _mm512_add_epi32(s[c], s2[c]);
            const __m512 d = rows16_d<T>(w, b, h);
#pragma GCC unroll 8
            for (int c = 0; c < O; ++c) {
                const __m512i sc = Pairs ? _mm512_add_epi32(_mm512_slli_epi32(s[2 * c], 8), s[2 * c + 1]) : s[c];
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sc), _mm512_mul_ps(d, _mm512_set1_ps(x.d[kColGroup * b + step * c + step - 1])), acc[c]);
            }
        }
    }
    if constexpr (grouped_min<T>) {
        __m512 off[O];
        for (int c = 0; c < O; ++c) off[c] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            const __m512 m = rows16_m<T>(w, b);
#pragma GCC unroll 8
            for (int c = 0; c < O; ++c) off[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(x.s[kColGroup * b + step * c]), off[c]);
        }
        for (int c = 0; c < O; ++c) acc[c] = _mm512_add_ps(acc[c], off[c]);
    }
    for (int c = 0; c < O; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
}
