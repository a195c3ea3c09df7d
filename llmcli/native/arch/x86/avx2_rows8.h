// AVX2 and AVX-VNNI kernels for the copy of the weights interleaved 8 rows at a time (row_groups.h;
// part of avx2.h's kernels): vector lane r is weight row r, so each
// multiply-add takes 4 codes of 8 rows against 4 activation codes broadcast, a block's products add
// up within each lane, and one conversion and one multiply-add scale them: no sums across lanes,
// no scale broadcast a block and a row. A tile takes up to 4 activation rows (16 registers).
// Plain AVX2 multiplies with vpmaddubsw (pairs of u8 * s8 into int16, saturating) and widens with
// vpmaddwd: the int16 sums of a block's codes stay below 2^15 for as many vectors as the codes'
// range allows (Q4: 8, Q5: 4, Q6_K: 2), so one widening serves several. Q8_0's codes (stored + 128)
// go back to signed and multiply as |w| times x with w's sign. AVX-VNNI's vpdpbusd does it all in one.
// Each activation row goes through the same operations whatever rows come with it (exact integers,
// then the same float operations), so a row's numbers never depend on the rows beside it.
#pragma once
#include "../../src/row_groups.h"
#include "cols.h"
#include "simd.h"
#include "x86.h"

#define LLMCLI_GROUPED 1
constexpr int kGroupRows = 8;  // weight rows a group (a vector's int32 lanes)
constexpr int kGroupCols = 4;  // activation rows a tile

namespace ymm {

constexpr int R8 = kGroupRows;

static inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
static inline __m256i broadcast4(const int8_t* p) { int32_t v; std::memcpy(&v, p, 4); return _mm256_set1_epi32(v); }
static inline __m256 halves8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
static inline __m256 bytes_times8(const uint8_t* p, const uint8_t* half, bool sign = false) {  // 8 bytes times 8 float16
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(sign ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v)), halves8(half));
}

// Block b's 8 rows' scales d (Q6_K: half h's), and for grouped_min types their m as they add (Q4_K's -dmin * m)
// 8 e8m0 bytes as blocks.h's e8m0_half: 2^(e - 128), (e - 1) << 23 as float bits (e < 2: denormals)
static inline __m256 e8m0_halves8(const uint8_t* p) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, small, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}

template <int T>
static inline __m256 group8_d(const uint8_t* w, int64_t b, int h) {
    if constexpr (T == kMXFP4) return e8m0_halves8(group_halves<T, R8>(w, b));
    else if constexpr (is_k45<T>) return bytes_times8(group_block<T, R8>(w, b), group_halves<T, R8>(w, b));
    else if constexpr (T == kQ6_K) return bytes_times8(group_block<T, R8>(w, b) + R8 * h, group_halves<T, R8>(w, b), true);
    else return halves8(group_halves<T, R8>(w, b));
}
template <int T>
static inline __m256 group8_m(const uint8_t* w, int64_t b) {
    if constexpr (is_k45<T>) {
        const __m256 m = bytes_times8(group_block<T, R8>(w, b) + R8, group_halves<T, R8>(w, b) + 2 * R8);
        return _mm256_xor_ps(m, _mm256_set1_ps(-0.f));  // -m, exactly
    } else {
        return halves8(group_halves<T, R8>(w, b) + group_min_at<T, R8>);
    }
}

#if defined(LLMCLI_AVXVNNI)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif
// Codes that plain AVX2 multiplies signed, as |w| times x with w's sign (Q8_0's, MXFP4's values)
template <int T> constexpr bool signed8 = (T == kQ8_0 || T == kMXFP4) && !kVnni;

// Vector p of block b's codes for the 8 rows: lane r holds row r's codes 4p..4p+3 (p < 4) or
// 16 + 4(p - 4).. (p >= 4), unsigned (plain AVX2's Q8_0 and MXFP4: signed; MXFP4's nibbles looked
// up in kMXFP4Values, + 128 for vpdpbusd)
template <int T>
static inline __m256i code_vector(const uint8_t* w, int64_t b, int p) {
    const uint8_t* codes = group_codes<T, R8>(w, b);
    if constexpr (T == kQ8_0) {
        const __m256i u = load32(codes + 32 * p);
        return kVnni ? u : _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
    } else {
        const __m256i v = load32(codes + 32 * (p % 4));
        __m256i u = _mm256_and_si256(p < 4 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
        if constexpr (T == kQ6_K) {  // the top 2 bits to bits 4, 5: from H_a (a = p / 4), shifted by its k = p % 4
            const __m256i h = load32(codes + 128 + 32 * (p / 4));
            const int k = p % 4;  // (a constant once the loops are unrolled)
            const __m256i at = k == 0 ? _mm256_slli_epi16(h, 4) : k == 1 ? _mm256_slli_epi16(h, 2) : k == 2 ? h : _mm256_srli_epi16(h, 2);
            u = _mm256_or_si256(u, _mm256_and_si256(at, _mm256_set1_epi8(0x30)));
        }
        if constexpr (fifth_bits<T>)
            u = _mm256_or_si256(u, _mm256_and_si256(bytes_from_bits(group_masks<T, R8>(w, b) + 4 * p), _mm256_set1_epi8(16)));
        if constexpr (T == kMXFP4) {
            const __m128i values = _mm_load_si128(reinterpret_cast<const __m128i*>(kMXFP4Values));
            u = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(kVnni ? _mm_xor_si128(values, _mm_set1_epi8((char)0x80)) : values), u);
        }
        return u;
    }
}

// Vectors a part of a block may sum in int16 before widening: 2 * (largest code) * 128 each
// (MXFP4: |w| <= 12, as a 4-bit code's range)
template <int T> constexpr int int16_run = T == kQ8_0 ? 1 : T == kQ6_K ? 2 : fifth_bits<T> ? 4 : 8;

// The accumulator's start for codes stored with a zero point z (q - z), as rows16_start
template <int T>
static inline __m256i group8_start(const Q8Cols& x, int64_t b, int h, int c) {
    constexpr int z = signed8<T> ? 0 : zero_point<T>;  // (plain AVX2 takes Q8_0's and MXFP4's codes signed)
    if constexpr (T == kQ6_K) return _mm256_set1_epi32(z * x.n16[2 * kColGroup * b + kColGroup * h + c]);
    return z ? _mm256_set1_epi32(z * x.n32[kColGroup * b + c]) : _mm256_setzero_si256();
}

// The interleaved group of 8 rows at w (nb blocks) against the activation rows of x, columns [0, C)
// (Q8Cols): out[8 * c + r] = row r . column c. Each (row, activation row) lane: for each block in order, the block's products
// summed in int32, times (d * the activation's d) added to its sum; Q4_1's, Q5_1's and Q4_K's m *
// the activation's s added to another sum, block by block, then to the first (as rows16_tile).
// `ahead`: the next group (or null), fetched into L2 block by block as this one is read (x86.h fetch_for_block).
// `Pairs`: columns 2j, 2j + 1 one int8x2 row's high and low bytes, into out[8 j + r] (as rows16's group_tile)
template <int T, int C, bool Pairs = false>
static void group_tile(const uint8_t* w, int64_t nb, const Q8Cols& x, float* out, const uint8_t* ahead) {
    constexpr int bytes = group_stride<T, R8>, H = scale_parts<T>, P = 8 / H, run = int16_run<T>;
    constexpr int O = Pairs ? C / 2 : C, step = Pairs ? 2 : 1;
    static_assert(!Pairs || C % 2 == 0, "pairs come whole");
    __m256 acc[O];
    for (int c = 0; c < O; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        fetch_for_block<bytes>(w, ahead, b);
#pragma GCC unroll 2
        for (int h = 0; h < H; ++h) {
            __m256i s[C];
            for (int c = 0; c < C; ++c) s[c] = group8_start<T>(x, b, h, c);
#pragma GCC unroll 8
            for (int p0 = P * h; p0 < P * h + P; p0 += run) {
                __m256i t[C];
#pragma GCC unroll 8
                for (int p = p0; p < p0 + run; ++p) {
                    const __m256i u = code_vector<T>(w, b, p);
                    const __m256i au = signed8<T> ? _mm256_sign_epi8(u, u) : u;
#pragma GCC unroll 4
                    for (int c = 0; c < C; ++c) {
                        __m256i xb = broadcast4(x.q + kColGroup * (32 * b + 4 * p) + 4 * c);
                        if constexpr (kVnni) {
                            s[c] = _mm256_dpbusd_avx_epi32(s[c], au, xb);
                        } else {
                            if constexpr (signed8<T>) xb = _mm256_sign_epi8(xb, u);
                            const __m256i m = _mm256_maddubs_epi16(au, xb);
                            t[c] = p == p0 ? m : _mm256_add_epi16(t[c], m);
                        }
                    }
                }
                if constexpr (!kVnni)
                    for (int c = 0; c < C; ++c) s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(t[c], _mm256_set1_epi16(1)));
            }
            const __m256 d = group8_d<T>(w, b, h);
            for (int c = 0; c < O; ++c) {
                const __m256i sc = Pairs ? _mm256_add_epi32(_mm256_slli_epi32(s[2 * c], 8), s[2 * c + 1]) : s[c];
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sc), _mm256_mul_ps(d, _mm256_set1_ps(x.d[kColGroup * b + step * c + step - 1])), acc[c]);
            }
        }
    }
    if constexpr (grouped_min<T>) {
        __m256 off[O];
        for (int c = 0; c < O; ++c) off[c] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            const __m256 m = group8_m<T>(w, b);
            for (int c = 0; c < O; ++c) off[c] = _mm256_fmadd_ps(m, _mm256_set1_ps(x.s[kColGroup * b + step * c]), off[c]);
        }
        for (int c = 0; c < O; ++c) acc[c] = _mm256_add_ps(acc[c], off[c]);
    }
    for (int c = 0; c < O; ++c) _mm256_storeu_ps(out + R8 * c, acc[c]);
}

}  // namespace ymm

using ymm::group_tile;
