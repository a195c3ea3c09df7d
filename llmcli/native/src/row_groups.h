// The weights a decode step reads, copied in groups of R rows interleaved (R = 16 for the AVX-512
// kernels, arch/x86/avx512_rows16.h; 8 for AVX2's and AVX-VNNI's, arch/x86/avx2_rows8.h): lane r of a vector
// is row r, so one multiply-add takes 4 codes of R rows against 4 activation codes broadcast, a
// block's 32 products add up within each lane, and one conversion and one multiply-add scale them,
// with no sums across lanes (as llama.cpp repacks Q4_0 for its GEMMs). Here: the layout and the
// copying, the same for every R; the kernels are the variants'.
//
// A block of R rows (the same bytes as their R blocks, laid out again):
//   d[R] f16 | m[R] f16 (Q4_1, Q5_1) | 5th bits (Q5_0, Q5_1): 8 masks of 4R bits | codes
// (MXFP4: e[R], the e8m0 bytes | codes as the nibble types', looked up as the kernels read them)
// codes: the nibble types' qs as 4 vectors of 4R bytes, vector p's lane r row r's qs bytes 4p..4p+3
// (so codes 4p..4p+3 in the low nibbles, 16 + 4p.. in the high ones); Q8_0's as 8 vectors, lane r
// row r's codes 4p..4p+3, stored + 128 (unsigned, the weights' side of vpdpbusd). Mask p (p < 4:
// codes 4p.., else 16 + 4(p - 4)..) has bit 4r + t set where row r's code 4p + t (or 16 + ..) has its 5th bit.
// Q4_K, per block of 256: d[R] f16 | dmin[R] f16 | then each sub-block of 32: sc[R] | m[R] (the
// 6-bit scales and mins, a byte each) | its codes as Q4_1's (low nibbles codes 0-15, high 16-31):
// R * 148 bytes, 4 more a row than stored. Q5_K as Q4_K, with each sub-block's 5th bits as masks
// (Q5_0's) between its mins and its codes: R * 180 bytes, 4 more a row than stored.
// Q6_K, per block of 256: d[R] f16 | then each 32: sc[2][R] (the int8 scales of its two 16s) |
// the low 4 bits of its codes as Q4_1's | their top 2 bits as 2 vectors H_a: lane r byte t has in
// bits 2k, 2k + 1 those of code 16a + 4k + t (so u[4a + k]'s): R * 210 bytes, as stored.
#pragma once
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "blocks.h"

template <int T>
constexpr bool grouped_type = T == kQ4_0 || T == kQ4_1 || T == kQ5_0 || T == kQ5_1 || T == kQ8_0 || T == kQ4_K ||
                              T == kQ5_K || T == kQ6_K || T == kMXFP4;
template <int T> constexpr bool is_k45 = T == kQ4_K || T == kQ5_K;
template <int T> constexpr bool pair_scales = T == kQ4_1 || T == kQ5_1;  // d and m a block
template <int T> constexpr bool grouped_min = pair_scales<T> || is_k45<T>;  // a second sum: m * the activation's s
template <int T> constexpr bool fifth_bits = T == kQ5_0 || T == kQ5_1 || T == kQ5_K;
// The codes' zero point z (stored q, the weight d * (q - z)): their products start at -z * the sums of x
template <int T> constexpr int scale_parts = T == kQ6_K ? 2 : 1;  // Q6_K: codes 0-15 and 16-31 scaled apart
// (MXFP4: its values looked up + 128, unsigned as Q8_0's stored codes)
template <int T> constexpr int zero_point = T == kQ4_0 ? 8 : T == kQ5_0 ? 16 : T == kQ8_0 || T == kMXFP4 ? 128 : T == kQ6_K ? 32 : 0;

// The offsets of the parts above in a block of R rows (K-quants: in a sub-block)
template <int T, int R> constexpr int group_min_at = 2 * R;
template <int T, int R> constexpr int group_bits_at = pair_scales<T> ? 4 * R : T == kMXFP4 ? R : 2 * R;
template <int T, int R> constexpr int group_codes_at = group_bits_at<T, R> + (T == kQ5_0 || T == kQ5_1 ? 4 * R : 0);
template <int T, int R> constexpr int k_sub = 2 * R + 16 * R + (T == kQ5_K ? 4 * R : 0);  // sc, m, (5th bits,) codes
template <int T, int R> constexpr int k_group = 4 * R + 8 * k_sub<T, R>;  // a 256-block's: d, dmin, 8 sub-blocks
template <int R> constexpr int q6k_sub = 2 * R + 16 * R + 8 * R;  // a Q6_K 32's: sc, low bits, top bits
template <int R> constexpr int q6k_group = 2 * R + 8 * q6k_sub<R>;  // a Q6_K block's: d, 8 32s
// The copy's bytes a group of R rows takes per 32 weights (and with nb 32-blocks a row: a group's)
template <int T, int R>
constexpr int64_t group_stride = is_k45<T> ? k_group<T, R> / 8 : T == kQ6_K ? q6k_group<R> / 8 : R * Block<T>::bytes;
template <int T, int R> static inline int64_t group_bytes(int64_t nb) { return nb * group_stride<T, R>; }

// 32-block b of the group at w: where its sub-block (or block) starts
template <int T, int R>
static inline const uint8_t* group_block(const uint8_t* w, int64_t b) {
    if constexpr (is_k45<T>) return w + b / 8 * k_group<T, R> + 4 * R + b % 8 * k_sub<T, R>;
    else if constexpr (T == kQ6_K) return w + b / 8 * q6k_group<R> + 2 * R + b % 8 * q6k_sub<R>;
    else return w + b * group_stride<T, R>;
}
// ... its codes (R vectors' worth of 4R bytes each) and its 5th bits' masks (4R bits each)
template <int T, int R>
static inline const uint8_t* group_codes(const uint8_t* w, int64_t b) {
    const uint8_t* o = group_block<T, R>(w, b);
    return o + (is_k45<T> ? k_sub<T, R> - 16 * R : T == kQ6_K ? 2 * R : group_codes_at<T, R>);
}
template <int T, int R>
static inline const uint8_t* group_masks(const uint8_t* w, int64_t b) {
    return group_block<T, R>(w, b) + (T == kQ5_K ? 2 * R : group_bits_at<T, R>);
}
// ... the float16 d (K-quants: the 256-block's d and dmin, and the sub-block's bytes sc and m)
template <int T, int R>
static inline const uint8_t* group_halves(const uint8_t* w, int64_t b) {
    if constexpr (is_k45<T>) return w + b / 8 * k_group<T, R>;
    else if constexpr (T == kQ6_K) return w + b / 8 * q6k_group<R>;
    else return w + b * group_stride<T, R>;
}

static inline void put_mask(uint8_t* at, uint64_t mask, int R) { std::memcpy(at, &mask, R / 2); }  // 4R bits

// Q4_K's or Q5_K's rows row[0..R) (nb 32-blocks a row) -> their interleaved blocks at out
template <int T, int R>
static void interleave_k45(const uint8_t* const row[R], int64_t nb, uint8_t* out) {
    constexpr int qs_at = T == kQ5_K ? 48 : 16, sub_bytes = k_sub<T, R>;
    for (int64_t k = 0; k < nb / 8; ++k) {
        uint8_t* o = out + k * k_group<T, R>;
        uint64_t masks[8][8] = {};  // Q5_K: sub-block j's mask p
        for (int r = 0; r < R; ++r) {
            const uint8_t* blk = row[r] + k * Block<T>::bytes;
            std::memcpy(o + 2 * r, blk, 2);
            std::memcpy(o + 2 * R + 2 * r, blk + 2, 2);
            uint8_t sc[8], mn[8];
            k_scales(blk + 4, sc, mn);
            for (int j = 0; j < 8; ++j) {
                uint8_t* sub = o + 4 * R + j * sub_bytes;
                sub[r] = sc[j];
                sub[R + r] = mn[j];
                const uint8_t* qs = blk + qs_at + 32 * (j / 2);  // sub-block j: nibble j % 2 of these 32 bytes
                uint8_t packed[16];
                for (int i = 0; i < 16; ++i) {
                    const int lo = j % 2 ? qs[i] >> 4 : qs[i] & 15, hi = j % 2 ? qs[16 + i] >> 4 : qs[16 + i] & 15;
                    packed[i] = (uint8_t)(lo | hi << 4);
                }
                for (int p = 0; p < 4; ++p) std::memcpy(sub + sub_bytes - 16 * R + 4 * R * p + 4 * r, packed + 4 * p, 4);
                if constexpr (T == kQ5_K)  // code l's 5th bit: bit j of qh[l]; mask p bit 4r + t for code 4p + t
                    for (int l = 0; l < 32; ++l) masks[j][l / 4] |= (uint64_t)(blk[16 + l] >> j & 1) << (4 * r + l % 4);
            }
        }
        if constexpr (T == kQ5_K)
            for (int j = 0; j < 8; ++j)
                for (int p = 0; p < 8; ++p) put_mask(o + 4 * R + j * sub_bytes + 2 * R + R / 2 * p, masks[j][p], R);
    }
}

// Q6_K's rows row[0..R) (nb 32-blocks a row) -> their interleaved blocks at out
template <int R>
static void interleave_q6k(const uint8_t* const row[R], int64_t nb, uint8_t* out) {
    for (int64_t k = 0; k < nb / 8; ++k) {
        uint8_t* o = out + k * q6k_group<R>;
        for (int r = 0; r < R; ++r) {
            const uint8_t* blk = row[r] + k * Block<kQ6_K>::bytes;
            std::memcpy(o + 2 * r, blk + 208, 2);
            uint8_t q[256];  // the 6-bit codes in order (Block<kQ6_K>::deq's)
            for (int h = 0; h < 2; ++h) {
                const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
                for (int l = 0; l < 32; ++l) {
                    q[128 * h + l] = (uint8_t)((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4);
                    q[128 * h + l + 32] = (uint8_t)((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4);
                    q[128 * h + l + 64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
                    q[128 * h + l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
                }
            }
            for (int j = 0; j < 8; ++j) {
                uint8_t* sub = o + 2 * R + j * q6k_sub<R>;
                const uint8_t* c = q + 32 * j;
                sub[r] = blk[192 + 2 * j];
                sub[R + r] = blk[192 + 2 * j + 1];
                for (int i = 0; i < 16; ++i) sub[2 * R + 4 * R * (i / 4) + 4 * r + i % 4] = (uint8_t)((c[i] & 15) | (c[16 + i] & 15) << 4);
                for (int a = 0; a < 2; ++a)
                    for (int t = 0; t < 4; ++t) {
                        uint8_t top = 0;
                        for (int kk = 0; kk < 4; ++kk) top |= (uint8_t)((c[16 * a + 4 * kk + t] >> 4) << 2 * kk);
                        sub[18 * R + 4 * R * a + 4 * r + t] = top;
                    }
            }
        }
    }
}

// The 32-block types' rows row[0..R) (nb blocks a row) -> their interleaved blocks at out
template <int T, int R>
static void interleave_32(const uint8_t* const row[R], int64_t nb, uint8_t* out) {
    constexpr int bytes = Block<T>::bytes,
                  qs_at = T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : T == kQ5_1 ? 8 : T == kMXFP4 ? 1 : 2;
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t* o = out + b * R * bytes;
        uint64_t masks[8] = {};
        for (int r = 0; r < R; ++r) {
            const uint8_t* blk = row[r] + b * bytes;
            if constexpr (T == kMXFP4) o[r] = blk[0];
            else std::memcpy(o + 2 * r, blk, 2);
            if constexpr (pair_scales<T>) std::memcpy(o + group_min_at<T, R> + 2 * r, blk + 2, 2);
            uint8_t* codes = o + group_codes_at<T, R>;
            if constexpr (T == kQ8_0) {
                for (int p = 0; p < 8; ++p) {
                    uint32_t four;
                    std::memcpy(&four, blk + qs_at + 4 * p, 4);
                    four ^= 0x80808080u;
                    std::memcpy(codes + 4 * R * p + 4 * r, &four, 4);
                }
            } else {
                for (int p = 0; p < 4; ++p) std::memcpy(codes + 4 * R * p + 4 * r, blk + qs_at + 4 * p, 4);
            }
            if constexpr (T == kQ5_0 || T == kQ5_1) {
                uint32_t qh;
                std::memcpy(&qh, blk + qs_at - 4, 4);
                for (int p = 0; p < 8; ++p) masks[p] |= (uint64_t)(qh >> 4 * p & 0xF) << 4 * r;  // codes 4p..4p+3
            }
        }
        if constexpr (T == kQ5_0 || T == kQ5_1)
            for (int p = 0; p < 8; ++p) put_mask(o + group_bits_at<T, R> + R / 2 * p, masks[p], R);
    }
}

// Rows row[0..R) (blocks of T, nb 32-blocks a row) -> their interleaved blocks at out
template <int T, int R>
static void interleave_group(const uint8_t* const row[R], int64_t nb, uint8_t* out) {
    if constexpr (is_k45<T>) interleave_k45<T, R>(row, nb, out);
    else if constexpr (T == kQ6_K) interleave_q6k<R>(row, nb, out);
    else interleave_32<T, R>(row, nb, out);
}

// f(std::integral_constant<int, C>) for C = 1 .. Most (Most: 4 or 8)
template <int Most, typename F>
static void with_cols(int C, F&& f) {
    switch (Most == 4 ? std::min(C, 4) : C) {
        case 1: f(std::integral_constant<int, 1>()); break;
        case 2: f(std::integral_constant<int, 2>()); break;
        case 3: f(std::integral_constant<int, 3>()); break;
        case 4: f(std::integral_constant<int, 4>()); break;
        case 5: if constexpr (Most > 4) f(std::integral_constant<int, 5>()); break;
        case 6: if constexpr (Most > 4) f(std::integral_constant<int, 6>()); break;
        case 7: if constexpr (Most > 4) f(std::integral_constant<int, 7>()); break;
        default: if constexpr (Most > 4) f(std::integral_constant<int, 8>()); break;
    }
}
