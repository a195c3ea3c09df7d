// The pieces of the avx512vnni variant's block kernels (avx512.h, avx512_tiles.h): activations
// quantized and copied in the orders the kernels read, blocks unpacked, products scaled and summed.
// Block dot products with AVX-512 VNNI (Zen 4/5, Ice Lake and later): vpdpbusd multiplies 64
// unsigned weight codes by 64 signed activation codes into 16 int32 lanes: halves of four 32-blocks
// (Q8_0), or quarters of eight blocks or sub-blocks (the nibble types, Q4_K), two or four vpdpbusd
// summing into one vector that is converted and scaled once. Codes with a zero point (Q4_0's q - 8, Q5_0's q - 16, Q6_K's q - 32, Q8_0's
// q as q + 128) go in unsigned as stored, and the accumulator starts at -zero * (each 4 activation
// codes' sum): the offset costs one shift, where the sign trick of the 256-bit variants costs two
// instructions per vector (and AVX-512 has no vpsignb).
#pragma once
#include <algorithm>

#include "../../src/blocks.h"
#include "simd.h"
#include "x86.h"

// Inlined whatever gcc's size limits say: gcc made the 8-block unpacking a call, which passes its
// vectors through memory (and a vzeroupper) between the unpacking and the dot products
#define LLMCLI_INLINE inline __attribute__((always_inline))

static inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
static inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// One block of 32 floats -> int8 codes, scale and scaled sum: the bytes quantize_block_scalar gives;
// with n4, also the codes' 8 negated sums of 4 (sums_of_four's, from the codes in registers: the
// scalar sums were a fifth of a block's quantization)
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

// One block of 32 floats -> int8x2's high and low codes, their d and s and negated sums of 4: the
// bytes quantize_pair_scalar (blocks.h) and sums_of_four give
static inline void quantize_pair(const float* x, int8_t* hi, int8_t* lo, float* d, float* s, int32_t* n4_hi, int32_t* n4_lo) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float e = amax / 127.f * (1.f / 256.f), ie = e > 0.f ? 1.f / e : 0.f;
    constexpr int even = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i top = _mm512_set1_epi32(32512), low = _mm512_set1_epi32(-127);
    __m512i h[2], l[2], sum = _mm512_setzero_si512();
    for (int j = 0; j < 2; ++j) {
        const __m512i v = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_roundscale_ps(
            _mm512_mul_ps(j ? v1 : v0, _mm512_set1_ps(ie)), even)), top), _mm512_sub_epi32(_mm512_setzero_si512(), top));
        h[j] = _mm512_srai_epi32(_mm512_add_epi32(v, _mm512_set1_epi32(128)), 8);
        l[j] = _mm512_max_epi32(_mm512_sub_epi32(v, _mm512_slli_epi32(h[j], 8)), low);
        sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_slli_epi32(h[j], 8), l[j]));
    }
    const __m256i hc = _mm256_set_m128i(_mm512_cvtepi32_epi8(h[1]), _mm512_cvtepi32_epi8(h[0]));
    const __m256i lc = _mm256_set_m128i(_mm512_cvtepi32_epi8(l[1]), _mm512_cvtepi32_epi8(l[0]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi), hc);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo), lc);
    const __m256i ones = _mm256_set1_epi8(1), zero = _mm256_setzero_si256();
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(n4_hi), _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, ones, hc)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(n4_lo), _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, ones, lc)));
    d[0] = 256.f * e, d[1] = e;
    s[0] = e * (float)_mm512_reduce_add_epi32(sum), s[1] = 0.f;
}

// The accumulators' start for a nibble group's 16 lanes, -zero * the sum of the activation codes each
// lane multiplies (w = d * (code - zero)), from Q8's ni (-16 * those sums): Q5_0's zero is 16, Q4_0's
// 8; Q4_1 and Q5_1 have m instead (0). Kept multiplied: a shift a row and group was a tenth of a tile.
template <int T>
static inline __m512i nibble_start(const int32_t* ni) {
    if constexpr (T == kQ5_0) return load512(ni);
    else if constexpr (T == kQ4_0) return _mm512_srai_epi32(load512(ni), 1);
    else return _mm512_setzero_si512();
}

// The block of a group of 8 whose codes qword q of the nibble vectors holds: the weights' two halves
// (blocks 0-3 and 4-7) meet in unpacklo/unpackhi_epi64, which alternate them qword by qword
constexpr int nibble_block(int q) { return q / 2 + 4 * (q % 2); }

// Blocks 4j..4j+3 (zeros past nb) in the quad order: q8 codes 0-15 of each block, then 16-31 (128
// bytes); lane 4b + t of the 16 (block 4j + b's codes 4t..4t+3 and 16 + 4t..16 + 4t + 3): n its
// -zero_times * (sum of those codes), d the block's d
static inline void quad_order(const Q8& x, int64_t nb, int64_t j, int zero_times, int8_t* q8, int32_t* n, float* d) {
    for (int b = 0; b < 4; ++b) {
        const int64_t i = 4 * j + b;
        const bool real = i < nb;
        if (real) {
            std::memcpy(q8 + 16 * b, x.q + 32 * i, 16);
            std::memcpy(q8 + 64 + 16 * b, x.q + 32 * i + 16, 16);
        } else {
            std::memset(q8 + 16 * b, 0, 16);
            std::memset(q8 + 64 + 16 * b, 0, 16);
        }
        for (int t = 0; t < 4; ++t) {
            n[4 * b + t] = real ? zero_times * (x.n4[8 * i + t] + x.n4[8 * i + 4 + t]) : 0;
            d[4 * b + t] = real ? x.d[i] : 0.f;
        }
    }
}

#define LLMCLI_ORDERS 1  // the activations copied in these orders, as the kernels read them (dot.h)

// The activations again for the 4- and 5-bit 32-blocks (blocks.h's Q8 qi, ni, ds, d16), per group of 8
// blocks: 4 vectors c of 64 bytes, qword q holding codes 8c..8c+7 of block nibble_block(q), as the
// weights' nibbles come out of nibble_unpack; lanes 2q, 2q + 1 are that block's: its d twice (d16) and
// -16 * the sums of the 16 codes each lane multiplies (ni, nibble_start's). ds: every block's (d, s) side by side,
// to meet the weights' (d, m) in one multiply. A last group of 5 to 7 blocks is padded with zeros
// to 8; one of 1 to 4 to 4, in the quad order (nibble_quad_unpack's): codes 0-15 of each block, then
// 16-31, 4 lanes a block (a group of 8 half empty cost a K of 640 a fifth of its time).
static inline void nibble_order(const Q8& x, int64_t nb, int8_t* qi, int32_t* ni, float* ds, float* d16) {
    for (int64_t g = 0; g < (nb + 7) / 8; ++g) {
        for (int64_t i = 8 * g; i < 8 * g + 8; ++i) {
            ds[2 * i] = i < nb ? x.d[i] : 0.f;
            ds[2 * i + 1] = i < nb ? x.s[i] : 0.f;
        }
        int8_t* q8 = qi + 256 * g;
        int32_t* n = ni + 16 * g;
        float* d = d16 + 16 * g;
        if (nb - 8 * g <= 4) {  // the quad
            std::memset(q8 + 128, 0, 128);
            quad_order(x, nb, 2 * g, 16, q8, n, d);
            continue;
        }
        for (int q = 0; q < 8; ++q) {
            const int64_t i = 8 * g + nibble_block(q);
            const bool real = i < nb;
            for (int c = 0; c < 4; ++c) {
                if (real) std::memcpy(q8 + 64 * c + 8 * q, x.q + 32 * i + 8 * c, 8);
                else std::memset(q8 + 64 * c + 8 * q, 0, 8);
            }
            for (int h = 0; h < 2; ++h) {  // lane 2q + h takes codes 8c + 4h .. 8c + 4h + 3 of each vector c
                int32_t sum = 0;
                for (int c = 0; real && c < 4; ++c) sum += x.n4[8 * i + 2 * c + h];
                n[2 * q + h] = 16 * sum;
                d[2 * q + h] = real ? x.d[i] : 0.f;
            }
        }
    }
}

// The activations again for Q8_0 (Q8's qq, zq, dq): every group of 4 blocks in the quad order, the
// accumulators' start for codes q + 128 (-128 * each lane's sum) and each lane's block's d
static inline void q8_0_order(const Q8& x, int64_t nb, int8_t* qq, int32_t* zq, float* dq) {
    for (int64_t j = 0; j < (nb + 3) / 4; ++j) quad_order(x, nb, j, 128, qq + 128 * j, zq + 16 * j, dq + 16 * j);
}

// The activations again for Q4_K (Q8's qk, d2): per block of 256, the codes in the order of Q4KBlock's
// vectors, each 8-byte lane pair one sub-block's, and each sub-block's d in its 2 lanes
static inline void q4k_order(const Q8& x, int64_t nb, int8_t* qk, float* d2) {
    for (int64_t k = 0; k < nb / 8; ++k)
        for (int j = 0; j < 8; ++j) {
            for (int c = 0; c < 4; ++c) std::memcpy(qk + 256 * k + 64 * c + 8 * j, x.q + 256 * k + 32 * j + 8 * c, 8);
            d2[16 * k + 2 * j] = d2[16 * k + 2 * j + 1] = x.d[8 * k + j];
        }
}

// And for Q6_K (Q8's q6, z6, d6): lane L = 4i + t of Q6KBlock's vectors holds scale group g = 4t + i
static inline void q6k_order(const Q8& x, int64_t nb, int8_t* q6, int32_t* z6, float* d6) {
    for (int64_t k = 0; k < nb / 8; ++k)
        for (int L = 0; L < 16; ++L) {
            const int g = 4 * (L % 4) + L / 4;
            int32_t n = 0;
            for (int c = 0; c < 4; ++c) {
                std::memcpy(q6 + 256 * k + 64 * c + 4 * L, x.q + 256 * k + 16 * g + 4 * c, 4);
                n += x.n4[64 * k + 4 * g + c];
            }
            z6[16 * k + L] = 32 * n;
            d6[16 * k + L] = x.d[8 * k + g / 2];
        }
}

// The N blocks from k on: in the row, or past its end, a zero block (scale 0: it adds nothing,
// whatever activations it meets; Q8Rows has room for a last group of fewer than N)
static const uint8_t kZeroBytes[96] = {};
static const uint8_t* const kZeroBlock = kZeroBytes + 32;  // readable 32 bytes before too (q8_0_quad's masked loads)
template <int bytes, int N = 4>
static inline void group_of(const uint8_t* row, int64_t k, int64_t nb, const uint8_t* p[N]) {
    for (int j = 0; j < N; ++j) p[j] = k + j < nb ? row + (k + j) * bytes : kZeroBlock;
}

static inline uint64_t load_u16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
static inline uint64_t load_u32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }

// out[r] = the sum of acc[r]'s lanes, for R = 1 or 4 accumulators (4: reduced together, a transpose's adds)
template <int R>
static inline void reduce_rows(const __m512* acc, float* out) {
    if constexpr (R == 1) {
        out[0] = _mm512_reduce_add_ps(acc[0]);
    } else {
        const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(acc[0], acc[1]), _mm512_unpackhi_ps(acc[0], acc[1]));
        const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(acc[2], acc[3]), _mm512_unpackhi_ps(acc[2], acc[3]));
        const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, 0x44), _mm512_shuffle_ps(t0, t1, 0xEE));  // per 128 bits: rows 0-3
        const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
        _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
    }
}

// out[r] += the sum of off[r]'s odd lanes (the m * s products), for R = 1 or 4 rows (4: reduced together)
template <int R>
static inline void add_odd_lanes(const __m256* off, float* out) {
    __m256 t[R];
    for (int r = 0; r < R; ++r) t[r] = _mm256_blend_ps(_mm256_setzero_ps(), off[r], 0xAA);
    if constexpr (R == 1) {
        out[0] += hsum8(t[0]);
    } else {
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(t[0], t[1]), _mm256_hadd_ps(t[2], t[3]));  // per 128 bits: rows 0-3
        _mm_storeu_ps(out, _mm_add_ps(_mm_loadu_ps(out), _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1))));
    }
}

// Q4_0, Q4_1, Q5_0, Q5_1 (the nibble types), a group of 8 blocks p[0..7]: 4 vectors of codes as Q8's qi
// has the activations (nibble_order), 4 vpdpbusd into 16 lanes, 2 a block, scaled in one conversion
// and one multiply-add. The tiles (avx512_tiles.h) unpack, multiply and scale the same way.
template <int T> constexpr bool has_min = T == kQ4_1 || T == kQ5_1;

// Blocks p[0..3]: their 4 x 16 code bytes in one vector give the low nibbles (codes 0-15 of each
// block) and the high ones (16-31), with the 5th bits added for Q5_0/Q5_1
template <int T>
static LLMCLI_INLINE void nibble_halves(const uint8_t* const p[4], __m512i& lo, __m512i& hi) {
    constexpr int at = T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : 8;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512i qs = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[0] + at)));
    for (int j = 1; j < 4; ++j) qs = _mm512_inserti32x4(qs, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[j] + at)), j);
    lo = _mm512_and_si512(qs, low4);
    hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), low4);
    if constexpr (T == kQ5_0 || T == kQ5_1) {
        uint64_t mlo = 0, mhi = 0;
        for (int j = 0; j < 4; ++j) {
            const uint64_t h = load_u32(p[j] + at - 4);
            mlo |= (h & 0xFFFF) << (16 * j);
            mhi |= (h >> 16) << (16 * j);
        }
        lo = _mm512_mask_add_epi8(lo, (__mmask64)mlo, lo, _mm512_set1_epi8(16));
        hi = _mm512_mask_add_epi8(hi, (__mmask64)mhi, hi, _mm512_set1_epi8(16));
    }
}

// A group's weights: v[c] holds codes 8c..8c+7 of block nibble_block(q) in qword q; wd that block's
// d in lanes 2q, 2q + 1; wdm (Q4_1, Q5_1) the 8 blocks' (d, m) in order, to meet Q8's ds
template <int T>
static LLMCLI_INLINE void nibble_unpack(const uint8_t* const p[8], __m512i v[4], __m512& wd, __m512& wdm) {
    __m512i lo0, hi0, lo1, hi1;
    nibble_halves<T>(p, lo0, hi0);
    nibble_halves<T>(p + 4, lo1, hi1);
    v[0] = _mm512_unpacklo_epi64(lo0, lo1);
    v[1] = _mm512_unpackhi_epi64(lo0, lo1);
    v[2] = _mm512_unpacklo_epi64(hi0, hi1);
    v[3] = _mm512_unpackhi_epi64(hi0, hi1);
    if constexpr (has_min<T>) {
        const __m256i dm = _mm256_setr_epi64x((long long)(load_u32(p[0]) | load_u32(p[1]) << 32),
                                              (long long)(load_u32(p[2]) | load_u32(p[3]) << 32),
                                              (long long)(load_u32(p[4]) | load_u32(p[5]) << 32),
                                              (long long)(load_u32(p[6]) | load_u32(p[7]) << 32));
        wdm = _mm512_cvtph_ps(dm);
        wd = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 8, 8, 2, 2, 10, 10, 4, 4, 12, 12, 6, 6, 14, 14), wdm);
    } else {
        const __m128i d = _mm_set_epi64x((long long)(load_u16(p[4]) | load_u16(p[5]) << 16 | load_u16(p[6]) << 32 | load_u16(p[7]) << 48),
                                         (long long)(load_u16(p[0]) | load_u16(p[1]) << 16 | load_u16(p[2]) << 32 | load_u16(p[3]) << 48));
        wd = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 4, 4, 1, 1, 5, 5, 2, 2, 6, 6, 3, 3, 7, 7),
                                   _mm512_castps256_ps512(_mm256_cvtph_ps(d)));
        wdm = wd;  // (unused)
    }
}

// A group's int32 products scaled into acc (d * dx per lane; wd, Q8's d16 spread alike), and for
// Q4_1, Q5_1 the m * s products into off's odd lanes (its even lanes gather d * dx, which nothing reads)
template <int T>
static LLMCLI_INLINE void nibble_scale(__m512i prods, __m512 wd, __m512 wdm, const Q8& x, int64_t g, __m512& acc, __m512& off) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prods), _mm512_mul_ps(wd, _mm512_loadu_ps(x.d16 + 16 * g)), acc);
    if constexpr (has_min<T>) off = _mm512_fmadd_ps(wdm, _mm512_loadu_ps(x.ds + 16 * g), off);
}

// A group's products with activation row x's group g, scaled (nibble_scale)
template <int T>
static LLMCLI_INLINE void nibble_dot(const __m512i v[4], __m512 wd, __m512 wdm, const Q8& x, int64_t g, __m512& acc, __m512& off) {
    const int8_t* y = x.qi + 256 * g;
    __m512i prods = _mm512_dpbusd_epi32(nibble_start<T>(x.ni + 16 * g), v[0], load512(y));
    prods = _mm512_dpbusd_epi32(prods, v[1], load512(y + 64));
    prods = _mm512_dpbusd_epi32(prods, v[2], load512(y + 128));
    prods = _mm512_dpbusd_epi32(prods, v[3], load512(y + 192));
    nibble_scale<T>(prods, wd, wdm, x, g, acc, off);
}

// out[r] = the sum of acc[r]'s lanes (+ the sum of off[r]'s odd lanes: Q4_1's, Q5_1's m * s), R = 1 or 4
template <int T, int R>
static inline void nibble_sums(const __m512* acc, const __m512* off, float* out) {
    reduce_rows<R>(acc, out);
    if constexpr (has_min<T>) {
        __m256 half[R];
        for (int r = 0; r < R; ++r) half[r] = _mm256_add_ps(_mm512_castps512_ps256(off[r]), _mm512_extractf32x8_ps(off[r], 1));
        add_odd_lanes<R>(half, out);
    }
}

// A last group of 4 blocks (nibble_order's quad): lo, hi the codes 0-15 and 16-31 of each block;
// wd block j's d in lanes 4j..4j+3; wdm (Q4_1, Q5_1) the 4 blocks' (d, m) in order (upper half 0)
template <int T>
static LLMCLI_INLINE void nibble_quad_unpack(const uint8_t* const p[4], __m512i& lo, __m512i& hi, __m512& wd, __m512& wdm) {
    nibble_halves<T>(p, lo, hi);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    const uint64_t w01 = has_min<T> ? load_u32(p[0]) | load_u32(p[1]) << 32 : load_u16(p[0]) | load_u16(p[1]) << 32;
    const uint64_t w23 = has_min<T> ? load_u32(p[2]) | load_u32(p[3]) << 32 : load_u16(p[2]) | load_u16(p[3]) << 32;
    wdm = _mm512_zextps256_ps512(_mm256_cvtph_ps(_mm_set_epi64x((long long)w23, (long long)w01)));
    wd = _mm512_permutexvar_ps(spread, wdm);
}

template <int T>
static LLMCLI_INLINE void nibble_quad_dot(__m512i lo, __m512i hi, __m512 wd, __m512 wdm, const Q8& x, int64_t g,
                                          __m512& acc, __m512& off) {
    const int8_t* y = x.qi + 256 * g;
    const __m512i prods = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(nibble_start<T>(x.ni + 16 * g), lo, load512(y)), hi, load512(y + 64));
    nibble_scale<T>(prods, wd, wdm, x, g, acc, off);
}


// Q8_0 in the quad order (Q8's qq, zq, dq): four blocks p[0..3] as two vectors, lo their codes
// 0-15 and hi 16-31 (q + 128, as stored, from two 256-bit loads a pair), 4 lanes a block; wd block
// b's d in lanes 4b..4b+3. Two vpdpbusd into one vector, converted and scaled once a 4 blocks (the
// 2-block vectors before took a conversion and a multiply-add for each 2).
static LLMCLI_INLINE void q8_0_quad(const uint8_t* const p[4], __m512i& lo, __m512i& hi, __m512& wd) {
    // [block 0 | block 1]: the upper half by a merging masked load from 32 bytes before block 1's codes
    // (a load and a blend, where an insert took the shuffle port the rest of this needs)
    const __m512i a = _mm512_mask_loadu_epi64(_mm512_castsi256_si512(load256(p[0] + 2)), 0xF0, p[1] + 2 - 32);
    const __m512i b = _mm512_mask_loadu_epi64(_mm512_castsi256_si512(load256(p[2] + 2)), 0xF0, p[3] + 2 - 32);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    lo = _mm512_xor_si512(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0)), flip);
    hi = _mm512_xor_si512(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1)), flip);
    const uint64_t h = load_u16(p[0]) | load_u16(p[1]) << 16 | load_u16(p[2]) << 32 | load_u16(p[3]) << 48;
    const __m512 d = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)h)));
    wd = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), d);
}

// MXFP4 in Q8_0's quad order: its nibbles are codes 0-15 (low) and 16-31 (high) already; one vpshufb
// each looks them up as kMXFP4Values + 128 (116..140, unsigned as Q8_0's codes are stored), so
// Q8_0's products (zq's start: -128 * the sums) take them unchanged; wd block b's e8m0 half.
static LLMCLI_INLINE void mxfp4_quad(const uint8_t* const p[4], __m512i& lo, __m512i& hi, __m512& wd) {
    const __m512i values = _mm512_broadcast_i32x4(_mm_xor_si128(
        _mm_load_si128(reinterpret_cast<const __m128i*>(kMXFP4Values)), _mm_set1_epi8((char)0x80)));
    __m512i qs = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[0] + 1)));
    for (int j = 1; j < 4; ++j) qs = _mm512_inserti32x4(qs, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[j] + 1)), j);
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    lo = _mm512_shuffle_epi8(values, _mm512_and_si512(qs, low4));
    hi = _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srli_epi16(qs, 4), low4));
    // e of block b in lanes 4b..4b+3, then e8m0_half's bits in vector operations (four scalar ones
    // and their inserts took the shuffle port the lookups need)
    const uint32_t e4 = p[0][0] | (uint32_t)p[1][0] << 8 | (uint32_t)p[2][0] << 16 | (uint32_t)p[3][0] << 24;
    const __m512i e = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)e4),
                                                         _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24)),
                                       _mm512_set1_epi32(0xFF));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i small = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    wd = _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), normal, small));
}

// The types read in the quad order (Q8's qq, zq, dq): Q8_0, MXFP4
template <int T> constexpr bool quad_type = T == kQ8_0 || T == kMXFP4;

// Blocks 4j..4j+3 of a Q8_0 or MXFP4 row of nb blocks (zero blocks past its end), q8_0_quad's vectors
template <int T = kQ8_0>
static LLMCLI_INLINE void q8_0_group(const uint8_t* w, int64_t nb, int64_t j, __m512i& lo, __m512i& hi, __m512& wd) {
    constexpr int bytes = Block<T>::bytes;
    const uint8_t* b = w + 4 * j * bytes;
    const uint8_t* p[4] = {b, b + bytes, b + 2 * bytes, b + 3 * bytes};
    if (4 * j + 4 > nb) group_of<bytes>(w, 4 * j, nb, p);
    if constexpr (T == kMXFP4) mxfp4_quad(p, lo, hi, wd);
    else q8_0_quad(p, lo, hi, wd);
}

// acc += quad j's products with activation row x, scaled
static LLMCLI_INLINE void q8_0_quad_dot(__m512i lo, __m512i hi, __m512 wd, const Q8& x, int64_t j, __m512& acc) {
    const int8_t* y = x.qq + 128 * j;
    const __m512i prods = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(load512(x.zq + 16 * j), lo, load512(y)), hi, load512(y + 64));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prods), _mm512_mul_ps(wd, _mm512_loadu_ps(x.dq + 16 * j)), acc);
}


// Q4_K (w = d*sc * q - dmin*m per sub-block of 32): a block's codes as 4 vectors c, each holding
// codes 8c..8c+7 of every sub-block j in bytes 8j..8j+7 (Q8's qk has the activations so): the four
// vpdpbusd sum into one vector whose lanes 2j, 2j + 1 are sub-block j's, scaled in one multiply-add.
// 8 instructions a (block, activation row), where the 256-bit code took 8 vpdpbusd, 6 hadds and more.
struct Q4KBlock {
    static constexpr int bytes = 144;
    __m512i w[4];   // codes 0..15
    __m512 sc;      // d * sc of sub-block j in lanes 2j, 2j + 1
    __m256 mn;      // dmin * m of the 8 sub-blocks
    Q4KBlock() = default;
    explicit Q4KBlock(const uint8_t* b) {
        const KHead h(b);
        const __m256 scd = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(h.sc)))),
                                         _mm256_set1_ps(h.d));
        mn = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(h.mn)))),
                           _mm256_set1_ps(h.dmin));
        sc = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), _mm512_castps256_ps512(scd));
        // qs as 16 qwords: sub-block j = 2m + h is nibble h of qwords 4m..4m+3
        const __m512i q0 = load512(b + 16), q1 = load512(b + 80);
        const __m512i shifts = _mm512_setr_epi64(0, 4, 0, 4, 0, 4, 0, 4);
        const __m512i low4 = _mm512_set1_epi8(0x0F);
        for (int c = 0; c < 4; ++c) {
            const __m512i pick = _mm512_setr_epi64(c, c, 4 + c, 4 + c, 8 + c, 8 + c, 12 + c, 12 + c);
            w[c] = _mm512_and_si512(_mm512_srlv_epi64(_mm512_permutex2var_epi64(q0, pick, q1), shifts), low4);
        }
    }
    // acc += the codes' products with activation row x's block k scaled; off += the mins' (per sub-block)
    inline void dot(const Q8& x, int64_t k, __m512& acc, __m256& off) const {
        const int8_t* y = x.qk + 256 * k;
        __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], load512(y));
        p = _mm512_dpbusd_epi32(p, w[1], load512(y + 64));
        p = _mm512_dpbusd_epi32(p, w[2], load512(y + 128));
        p = _mm512_dpbusd_epi32(p, w[3], load512(y + 192));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sc, _mm512_loadu_ps(x.d2 + 16 * k)), acc);
        off = _mm256_fmadd_ps(mn, _mm256_loadu_ps(x.s + 8 * k), off);
    }
};

// Q6_K (w = d*sc * (q - 32) per 16): ql's and qh's bits give 4 vectors V of 4 scale groups (one per
// 128 bits: V's group 4v + i), transposed by 32-bit lanes within each 128 bits: vector c then holds
// codes 4c..4c+3 of group 4t + i at lane 4i + t (Q8's q6 has the activations so), and the 4
// vpdpbusd from the zero point's start sum into one vector, scaled in one multiply-add.
struct Q6KBlock {
    static constexpr int bytes = 210;
    __m512i w[4];  // codes 0..63
    __m512 sc;     // d * sc of lane L's group
    Q6KBlock() = default;
    explicit Q6KBlock(const uint8_t* b) {
        const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
        __m512i v[4];
        for (int h = 0; h < 2; ++h) {
            const __m512i l = load512(b + 64 * h);
            const __m256i qh = load256(b + 128 + 32 * h);
            const __m512i hb = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);  // [qh, qh >> 2]
            v[2 * h] = _mm512_or_si512(_mm512_and_si512(l, low4), _mm512_and_si512(_mm512_slli_epi16(hb, 4), top2));
            v[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4), _mm512_and_si512(hb, top2));
        }
        const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
        const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
        w[0] = _mm512_unpacklo_epi64(t0, t2); w[1] = _mm512_unpackhi_epi64(t0, t2);
        w[2] = _mm512_unpacklo_epi64(t1, t3); w[3] = _mm512_unpackhi_epi64(t1, t3);
        const __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192))));
        const __m512i groups = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        sc = _mm512_permutexvar_ps(groups, _mm512_mul_ps(scf, _mm512_set1_ps(h2f(b + 208))));
    }
    // acc += the codes' products with activation row x's block k scaled (off: nothing, no mins)
    inline void dot(const Q8& x, int64_t k, __m512& acc, __m256&) const {
        const int8_t* y = x.q6 + 256 * k;
        __m512i p = _mm512_dpbusd_epi32(load512(x.z6 + 16 * k), w[0], load512(y));
        p = _mm512_dpbusd_epi32(p, w[1], load512(y + 64));
        p = _mm512_dpbusd_epi32(p, w[2], load512(y + 128));
        p = _mm512_dpbusd_epi32(p, w[3], load512(y + 192));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sc, _mm512_loadu_ps(x.d6 + 16 * k)), acc);
    }
};

static inline float kblock_sum(__m512 acc, __m256 off) { return _mm512_reduce_add_ps(acc) - hsum8(off); }
