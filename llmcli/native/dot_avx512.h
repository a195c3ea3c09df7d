// Block dot products with AVX-512 VNNI (Zen 4/5, Ice Lake and later): vpdpbusd multiplies 64
// unsigned weight codes by 64 signed activation codes into 16 int32 lanes: two 32-blocks, or halves
// of four, or two sub-blocks, a vector. Codes with a zero point (Q4_0's q - 8, Q5_0's q - 16, Q6_K's q - 32, Q8_0's
// q as q + 128) go in unsigned as stored, and the accumulator starts at -zero * (each 4 activation
// codes' sum): the offset costs one shift, where the sign trick of the 256-bit variants costs two
// instructions per vector (and AVX-512 has no vpsignb).
#pragma once
#include "dot_avx2.h"

static inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
static inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The zero point of a 32-block's unsigned codes (w = d * (code - zero)); Q4_1/Q5_1 have m instead
template <int T> constexpr int zero_shift = T == kQ4_0 ? 3 : T == kQ5_0 ? 4 : T == kQ8_0 ? 7 : T == kQ6_K ? 5 : -1;

template <int T>
static inline __m512i start512(const int32_t* n4) {  // 16 lanes: -zero * sum of 4 activation codes, or 0
    if constexpr (zero_shift<T> < 0) return _mm512_setzero_si512();
    else return _mm512_slli_epi32(load512(n4), zero_shift<T>);
}

// Two Q8_0 blocks' codes as 64 unsigned bytes (q + 128), block a's 32 then b's
static inline __m512i q8_0_codes2(const uint8_t* a, const uint8_t* b) {
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(load256(a + 2)), load256(b + 2), 1);
    return _mm512_xor_si512(z, _mm512_set1_epi8((char)0x80));
}

// The activations again for the 4- and 5-bit 32-blocks (blocks.h's Q8 qi, ni, ds): per group of 4
// blocks A-D, the first 16 codes of each, then the last 16, as those blocks' nibbles come out of one
// vector of their 4 x 16 code bytes (low nibbles, then high): no shuffle of the weights is needed.
// The blocks' (d, s) side by side meet the weights' (d, m) in one multiply.
// A last group of fewer than 4 blocks is padded with zeros (Q8Rows keeps room for it).
static inline void interleave(const Q8& x, int64_t nb, int8_t* qi, int32_t* ni, float* ds) {
    for (int64_t g = 0; g < nb; g += 4)
        for (int j = 0; j < 4; ++j) {
            const int64_t i = g + j;
            if (i < nb) {
                std::memcpy(qi + 32 * g + 16 * j, x.q + 32 * i, 16);
                std::memcpy(qi + 32 * g + 64 + 16 * j, x.q + 32 * i + 16, 16);
                for (int t = 0; t < 4; ++t) ni[4 * g + 4 * j + t] = x.n4[8 * i + t] + x.n4[8 * i + 4 + t];
                ds[2 * i] = x.d[i]; ds[2 * i + 1] = x.s[i];
            } else {
                std::memset(qi + 32 * g + 16 * j, 0, 16);
                std::memset(qi + 32 * g + 64 + 16 * j, 0, 16);
                for (int t = 0; t < 4; ++t) ni[4 * g + 4 * j + t] = 0;
                ds[2 * i] = ds[2 * i + 1] = 0.f;
            }
        }
}

// The scales again, spread as the dot products' lanes take them (Q8's d16, d8, z8): a tile's
// activation rows each met the weights' scales through a permute per group, now done once a row
static inline void spread_scales(const Q8& x, int64_t nb, int64_t G, float* d16, float* d8, int32_t* z8) {
    for (int64_t g = 0; g < G; ++g)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 4; ++l) d16[16 * g + 4 * j + l] = x.ds[8 * g + 2 * j];
    for (int64_t i = 0; i < nb; ++i)
        for (int l = 0; l < 8; ++l) { d8[8 * i + l] = x.d[i]; z8[8 * i + l] = x.n4[8 * i + l] * 128; }
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

// The 4 blocks from k on: in the row, or past its end, a zero block (scale 0: it adds nothing,
// whatever activations it meets; Q8Rows has room for a last group of fewer than 4)
static const uint8_t kZeroBlock[64] = {};
template <int bytes>
static inline void group_of(const uint8_t* row, int64_t k, int64_t nb, const uint8_t* p[4]) {
    for (int j = 0; j < 4; ++j) p[j] = k + j < nb ? row + (k + j) * bytes : kZeroBlock;
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

// A nibble group's products scaled: acc += prods * (d * dx) per block; off's odd lanes += m * s (its
// even lanes gather d * dx, which nothing reads). wd: the weights' d spread as xd16 is.
template <bool has_m>
static inline void nibble_scale(__m512i prods, __m512 wd, __m256 wdm, __m512 xd16, __m256 xds, __m512& acc, __m256& off) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(prods), _mm512_mul_ps(wd, xd16), acc);
    if constexpr (has_m) off = _mm256_fmadd_ps(wdm, xds, off);
}

// Q4_0, Q4_1, Q5_0, Q5_1: blocks p[0..3]'s weights. Their 4 x 16 code bytes in one vector give the low
// nibbles (codes 0-15 of each block) and the high ones (16-31); wdm: the 4 blocks' (d, m) or (d, 0) as floats
template <int T>
static inline void nibble_unpack(const uint8_t* const p[4], __m512i& lo, __m512i& hi, __m256& wdm) {
    constexpr int at = T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : 8;
    constexpr bool has_m = T == kQ4_1 || T == kQ5_1;
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
    const uint64_t w01 = has_m ? load_u32(p[0]) | load_u32(p[1]) << 32 : load_u16(p[0]) | load_u16(p[1]) << 32;
    const uint64_t w23 = has_m ? load_u32(p[2]) | load_u32(p[3]) << 32 : load_u16(p[2]) | load_u16(p[3]) << 32;
    wdm = _mm256_cvtph_ps(_mm_set_epi64x((long long)w23, (long long)w01));
}

// Blocks p[0..3] against their activations (y0, y1: codes 0-15 of each block, then 16-31; st: the
// zero point's start): two vpdpbusd into 16 lanes, 4 a block; one conversion, one multiply-add, the
// scales spread by one permute. The tiles (dot_avx512_tiles.h) unpack and scale the same way.
template <int T>
static inline void nibble_group(const uint8_t* const p[4], __m512i st, __m512i y0, __m512i y1, __m256 xds,
                                __m512 xd16, __m512& acc, __m256& off) {
    constexpr bool has_m = T == kQ4_1 || T == kQ5_1;
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);  // d * dx of block j to lanes 4j..4j+3
    __m512i lo, hi;
    __m256 wdm;
    nibble_unpack<T>(p, lo, hi, wdm);
    const __m512i prods = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(st, lo, y0), hi, y1);
    nibble_scale<has_m>(prods, _mm512_permutexvar_ps(spread, _mm512_castps256_ps512(wdm)), wdm, xd16, xds, acc, off);
}

// Q4_0, Q4_1, Q5_0, Q5_1, R weight rows (`stride` bytes apart) against one activation row, four
// blocks a step; the R rows share the activations' loads and the final reduction
template <int T, int R>
static void nibble_rows(const uint8_t* row, int64_t stride, const Q8& x, int64_t nb, float* out) {
    constexpr int bytes = Block<T>::bytes;
    __m512 acc[R];
    __m256 off[R];
    for (int r = 0; r < R; ++r) { acc[r] = _mm512_setzero_ps(); off[r] = _mm256_setzero_ps(); }
    for (int64_t k = 0; k < nb; k += 4) {
        const __m512i st = start512<T>(x.ni + 4 * k), y0 = load512(x.qi + 32 * k), y1 = load512(x.qi + 32 * k + 64);
        const __m256 xds = _mm256_loadu_ps(x.ds + 2 * k);
        const __m512 xd16 = _mm512_loadu_ps(x.d16 + 4 * k);
        for (int r = 0; r < R; ++r) {
            const uint8_t* b = row + r * stride + k * bytes;
            const uint8_t* p[4] = {b, b + bytes, b + 2 * bytes, b + 3 * bytes};
            if (k + 4 <= nb) {
                nibble_group<T>(p, st, y0, y1, xds, xd16, acc[r], off[r]);
            } else {  // the last, short group
                const uint8_t* q[4];
                group_of<bytes>(row + r * stride, k, nb, q);
                nibble_group<T>(q, st, y0, y1, xds, xd16, acc[r], off[r]);
            }
        }
    }
    reduce_rows<R>(acc, out);
    if constexpr (T == kQ4_1 || T == kQ5_1) add_odd_lanes<R>(off, out);  // the m * s lanes
}

// Four Q8_0 blocks' d spread as Q8's d8: blocks 0, 1 in w01's halves, 2, 3 in w23's
static inline void q8_0_scales(const uint8_t* const p[4], __m512i lo2, __m512i hi2, __m512& w01, __m512& w23) {
    const uint64_t h = load_u16(p[0]) | load_u16(p[1]) << 16 | load_u16(p[2]) << 32 | load_u16(p[3]) << 48;
    const __m512 wd = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)h)));
    w01 = _mm512_permutexvar_ps(lo2, wd);
    w23 = _mm512_permutexvar_ps(hi2, wd);
}

// Q8_0, R weight rows against one activation row, four blocks a step: two vectors of two blocks
// (q + 128, as stored), their 8-lane halves scaled by d * dx of their block. A last group of fewer
// than 4 reads past the row's activations (Q8Rows' slack), against zero blocks.
template <int R>
static void q8_0_rows(const uint8_t* row, int64_t stride, const Q8& x, int64_t nb, float* out) {
    constexpr int bytes = Block<kQ8_0>::bytes;
    const __m512i lo2 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i hi2 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < nb; k += 4) {
        const __m512i st01 = load512(x.z8 + 8 * k), st23 = load512(x.z8 + 8 * k + 16);
        const __m512i y01 = load512(x.q + 32 * k), y23 = load512(x.q + 32 * k + 64);
        const __m512 dx01 = _mm512_loadu_ps(x.d8 + 8 * k), dx23 = _mm512_loadu_ps(x.d8 + 8 * k + 16);
        for (int r = 0; r < R; ++r) {
            const uint8_t* b = row + r * stride + k * bytes;
            const uint8_t* p[4] = {b, b + bytes, b + 2 * bytes, b + 3 * bytes};
            if (k + 4 > nb) group_of<bytes>(row + r * stride, k, nb, p);  // the last, short group
            const __m512i p01 = _mm512_dpbusd_epi32(st01, q8_0_codes2(p[0], p[1]), y01);
            const __m512i p23 = _mm512_dpbusd_epi32(st23, q8_0_codes2(p[2], p[3]), y23);
            __m512 w01, w23;
            q8_0_scales(p, lo2, hi2, w01, w23);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p01), _mm512_mul_ps(w01, dx01), acc[r]);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p23), _mm512_mul_ps(w23, dx23), acc[r]);
        }
    }
    reduce_rows<R>(acc, out);
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

// Q4_K or Q6_K (B: its block), R weight rows against one activation row: the rows' sums interleaved
// (one row's chain of multiply-adds alone waits on their latency)
template <typename B, int R>
static void kblock_rows(const uint8_t* row, int64_t stride, const Q8& x, int64_t nb, float* out) {
    __m512 acc[R];
    __m256 off[R];
    for (int r = 0; r < R; ++r) { acc[r] = _mm512_setzero_ps(); off[r] = _mm256_setzero_ps(); }
    for (int64_t k = 0; k < nb / 8; ++k)
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) B(row + r * stride + k * B::bytes).dot(x, k, acc[r], off[r]);
    for (int r = 0; r < R; ++r) out[r] = kblock_sum(acc[r], off[r]);
}

// One weight row against one activation row of K = 32 * nb
template <int T>
static float dot_row(const uint8_t* row, const Q8& x, int64_t nb) {
    float out;
    if constexpr (T == kQ4_K) kblock_rows<Q4KBlock, 1>(row, 0, x, nb, &out);
    else if constexpr (T == kQ6_K) kblock_rows<Q6KBlock, 1>(row, 0, x, nb, &out);
    else if constexpr (T == kQ8_0) q8_0_rows<1>(row, 0, x, nb, &out);
    else nibble_rows<T, 1>(row, 0, x, nb, &out);
    return out;
}

// Four weight rows, `stride` bytes apart, against one activation row
#define LLMCLI_ROW_GROUPS 1
template <int T>
static void dot_4rows(const uint8_t* row, int64_t stride, const Q8& x, int64_t nb, float out[4]) {
    if constexpr (T == kQ8_0) q8_0_rows<4>(row, stride, x, nb, out);
    else if constexpr (T == kQ4_K) kblock_rows<Q4KBlock, 4>(row, stride, x, nb, out);
    else if constexpr (T == kQ6_K) kblock_rows<Q6KBlock, 4>(row, stride, x, nb, out);
    else nibble_rows<T, 4>(row, stride, x, nb, out);
}

#include "dot_avx512_tiles.h"  // the same products for several activation rows at once
