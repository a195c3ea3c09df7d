// The portable variant's kernels (isa.h): block dot products in plain C++ (any CPU the compiler
// targets; it vectorizes what it can): each block's codes unpacked to int8 with the zero point taken
// off, integer sums per block, scaled once. Also the reference the other variants are checked against
// bit for bit in their quantization. By kind (dot32_row, q4k_row, q6k_row): dot.h makes dot_row of them.
#pragma once
#include "../../src/blocks.h"
#include "simd.h"

static inline void quantize_block(const float* x, int8_t* q, float& d, float& s) { quantize_block_scalar(x, q, d, s); }

static inline int32_t idot(const int8_t* a, const int8_t* b, int n) {
    int32_t s = 0;
    for (int i = 0; i < n; ++i) s += (int32_t)a[i] * b[i];
    return s;
}

// A 32-block's codes in element order, zero point taken off (Q4_1/Q5_1 keep theirs, 0..15 / 0..31;
// MXFP4's looked up: blocks.h's kMXFP4Values)
template <int T>
static inline void codes32(const uint8_t* b, int8_t* c) {
    if constexpr (T == kQ8_0) {
        std::memcpy(c, b + 2, 32);
    } else if constexpr (T == kMXFP4) {
        for (int j = 0; j < 16; ++j) { c[j] = kMXFP4Values[b[1 + j] & 15]; c[j + 16] = kMXFP4Values[b[1 + j] >> 4]; }
    } else {
        constexpr int at = T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : 8;
        constexpr int zero = T == kQ4_0 ? 8 : T == kQ5_0 ? 16 : 0;
        uint32_t qh = 0;
        if constexpr (T == kQ5_0 || T == kQ5_1) std::memcpy(&qh, b + at - 4, 4);
        for (int j = 0; j < 16; ++j) {
            c[j] = (int8_t)((b[at + j] & 15) + (((qh >> j) & 1) << 4) - zero);
            c[j + 16] = (int8_t)((b[at + j] >> 4) + (((qh >> (j + 16)) & 1) << 4) - zero);
        }
    }
}

template <int T>
static float dot32_row(const uint8_t* row, const Q8& x, int64_t nb) {
    constexpr int bytes = Block<T>::bytes;
    float acc = 0.f;
    int8_t c[32];
    for (int64_t k = 0; k < nb; ++k) {
        const uint8_t* b = row + k * bytes;
        codes32<T>(b, c);
        acc += block_d<T>(b) * x.d[k] * (float)idot(c, x.q + 32 * k, 32);
        if constexpr (T == kQ4_1 || T == kQ5_1) acc += h2f(b + 2) * x.s[k];
    }
    return acc;
}

static float q4k_row(const uint8_t* row, const Q8& x, int64_t nb) {
    float acc = 0.f;
    int8_t lo[32], hi[32];
    for (int64_t k = 0; k < nb / 8; ++k) {
        const uint8_t* b = row + k * 144;
        const KHead h(b);
        const float d = h.d, dmin = h.dmin;
        const uint8_t *sc = h.sc, *mn = h.mn;
        for (int c = 0; c < 4; ++c) {  // sub-blocks 2c and 2c + 1: a 32-byte run's low nibbles, then high
            const uint8_t* qs = b + 16 + 32 * c;
            for (int l = 0; l < 32; ++l) { lo[l] = (int8_t)(qs[l] & 15); hi[l] = (int8_t)(qs[l] >> 4); }
            const int64_t i = 8 * k + 2 * c;
            acc += d * sc[2 * c] * x.d[i] * (float)idot(lo, x.q + 32 * i, 32) - dmin * mn[2 * c] * x.s[i];
            acc += d * sc[2 * c + 1] * x.d[i + 1] * (float)idot(hi, x.q + 32 * i + 32, 32) - dmin * mn[2 * c + 1] * x.s[i + 1];
        }
    }
    return acc;
}

static float q6k_row(const uint8_t* row, const Q8& x, int64_t nb) {
    float acc = 0.f;
    int8_t w[4][32];
    for (int64_t k = 0; k < nb / 8; ++k) {
        const uint8_t* b = row + k * 210;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        const float d = h2f(b + 208);
        for (int h = 0; h < 2; ++h) {  // quarter j of a half: ql's low (j = 0, 1) or high (2, 3) nibbles, qh's bits 2j, 2j + 1
            const uint8_t* ql = b + 64 * h; const uint8_t* qh = b + 128 + 32 * h;
            for (int l = 0; l < 32; ++l) {
                w[0][l] = (int8_t)(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
                w[1][l] = (int8_t)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                w[2][l] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                w[3][l] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
            for (int j = 0; j < 4; ++j) {
                const int64_t i = 8 * k + 4 * h + j;
                const int8_t* y = x.q + 32 * i;
                const float s = (float)sc[8 * h + 2 * j] * idot(w[j], y, 16) + (float)sc[8 * h + 2 * j + 1] * idot(w[j] + 16, y + 16, 16);
                acc += d * x.d[i] * s;
            }
        }
    }
    return acc;
}

