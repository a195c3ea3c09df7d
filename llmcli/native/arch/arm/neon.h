// The neon variant's kernels (isa.h): block dot products with NEON's dot-product extension (Apple
// Silicon, Graviton 2+, Cortex-A76+): vdotq_s32 multiplies 16 signed weight codes by 16 activation
// codes into 4 int32 lanes. Both sides are signed here, so codes with a zero point are taken as
// q - zero. By kind (dot32_row, q4k_row, q6k_row): dot.h makes dot_row of them.
#pragma once
#include "../../src/blocks.h"
#include "simd.h"

// One block of 32 floats -> the bytes quantize_block_scalar gives (vcvtnq rounds ties to even)
static inline void quantize_block(const float* x, int8_t* q, float& d_out, float& s_out) {
    float32x4_t v[8];
    float32x4_t amax = vdupq_n_f32(0.f);
    for (int j = 0; j < 8; ++j) { v[j] = vld1q_f32(x + 4 * j); amax = vmaxq_f32(amax, vabsq_f32(v[j])); }
    const float d = vmaxvq_f32(amax) / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    int32x4_t sum = vdupq_n_s32(0);
    int16x8_t h[4];
    for (int j = 0; j < 4; ++j) {
        const int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(v[2 * j], id)), b = vcvtnq_s32_f32(vmulq_n_f32(v[2 * j + 1], id));
        sum = vaddq_s32(sum, vaddq_s32(a, b));
        h[j] = vcombine_s16(vmovn_s32(a), vmovn_s32(b));
    }
    vst1q_s8(q, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
    vst1q_s8(q + 16, vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
    d_out = d;
    s_out = d * (float)vaddvq_s32(sum);
}

static inline int8x16_t low_nibbles(uint8x16_t b) { return vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F))); }
static inline int8x16_t high_nibbles(uint8x16_t b) { return vreinterpretq_s8_u8(vshrq_n_u8(b, 4)); }

// 16 bits -> 16 bytes: 0x10 where the bit is set (Q5's 5th bit, in place)
static inline int8x16_t fifth_bits(uint32_t bits16) {
    const uint8x16_t bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)(bits16 & 0xFF)), vdup_n_u8((uint8_t)(bits16 >> 8)));
    return vreinterpretq_s8_u8(vandq_u8(vtstq_u8(v, bit), vdupq_n_u8(0x10)));
}

// A 32-block's codes in two halves (elements 0-15, 16-31), with the zero point taken off (MXFP4's
// nibbles looked up in blocks.h's kMXFP4Values by one table lookup a half)
template <int T>
static inline void codes32(const uint8_t* b, int8x16_t& lo, int8x16_t& hi) {
    if constexpr (T == kQ8_0) {
        lo = vld1q_s8(reinterpret_cast<const int8_t*>(b + 2));
        hi = vld1q_s8(reinterpret_cast<const int8_t*>(b + 18));
    } else if constexpr (T == kMXFP4) {
        const int8x16_t values = vld1q_s8(kMXFP4Values);
        const uint8x16_t qs = vld1q_u8(b + 1);
        lo = vqtbl1q_s8(values, vandq_u8(qs, vdupq_n_u8(0x0F)));
        hi = vqtbl1q_s8(values, vshrq_n_u8(qs, 4));
    } else {
        constexpr int at = T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : 8;
        const uint8x16_t qs = vld1q_u8(b + at);
        lo = low_nibbles(qs);
        hi = high_nibbles(qs);
        if constexpr (T == kQ5_0 || T == kQ5_1) {
            uint32_t qh;
            std::memcpy(&qh, b + at - 4, 4);
            lo = vorrq_s8(lo, fifth_bits(qh & 0xFFFF));
            hi = vorrq_s8(hi, fifth_bits(qh >> 16));
        }
        if constexpr (T == kQ4_0) { lo = vsubq_s8(lo, vdupq_n_s8(8)); hi = vsubq_s8(hi, vdupq_n_s8(8)); }
        if constexpr (T == kQ5_0) { lo = vsubq_s8(lo, vdupq_n_s8(16)); hi = vsubq_s8(hi, vdupq_n_s8(16)); }
    }
}

static inline int32x4_t dot32(int8x16_t lo, int8x16_t hi, const int8_t* y) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(y)), hi, vld1q_s8(y + 16));
}

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4: per block, its 4 lanes of sums scaled by d * dx into a float vector
template <int T>
static float dot32_row(const uint8_t* row, const Q8& x, int64_t nb) {
    constexpr int bytes = Block<T>::bytes;
    float32x4_t acc = vdupq_n_f32(0.f);
    float off = 0.f;
    for (int64_t k = 0; k < nb; ++k) {
        const uint8_t* b = row + k * bytes;
        int8x16_t lo, hi;
        codes32<T>(b, lo, hi);
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(dot32(lo, hi, x.q + 32 * k)), block_d<T>(b) * x.d[k]);
        if constexpr (T == kQ4_1 || T == kQ5_1) off += h2f(b + 2) * x.s[k];
    }
    return vaddvq_f32(acc) + off;
}

// Q4_K: sub-block 2c is the low nibbles of a 32-byte run, 2c + 1 its high ones
static float q4k_row(const uint8_t* row, const Q8& x, int64_t nb) {
    float32x4_t acc = vdupq_n_f32(0.f);
    float off = 0.f;
    for (int64_t k = 0; k < nb / 8; ++k) {
        const uint8_t* b = row + k * 144;
        const KHead h(b);
        const float d = h.d, dmin = h.dmin;
        const uint8_t *sc = h.sc, *mn = h.mn;
        for (int c = 0; c < 4; ++c) {
            const uint8x16_t r0 = vld1q_u8(b + 16 + 32 * c), r1 = vld1q_u8(b + 32 + 32 * c);
            const int64_t i = 8 * k + 2 * c;
            const int32x4_t p1 = dot32(low_nibbles(r0), low_nibbles(r1), x.q + 32 * i);
            const int32x4_t p2 = dot32(high_nibbles(r0), high_nibbles(r1), x.q + 32 * i + 32);
            acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p1), d * sc[2 * c] * x.d[i]);
            acc = vmlaq_n_f32(acc, vcvtq_f32_s32(p2), d * sc[2 * c + 1] * x.d[i + 1]);
            off += dmin * mn[2 * c] * x.s[i] + dmin * mn[2 * c + 1] * x.s[i + 1];
        }
    }
    return vaddvq_f32(acc) - off;
}

// Q6_K: per half of 128 weights, quarter j from ql's low (j = 0, 1) or high (2, 3) nibbles and qh's
// bits 2j, 2j + 1; each 16 codes have their own scale
static float q6k_row(const uint8_t* row, const Q8& x, int64_t nb) {
    const uint8x16_t three = vdupq_n_u8(3);
    const int8x16_t c32 = vdupq_n_s8(32);
    float acc = 0.f;
    for (int64_t k = 0; k < nb / 8; ++k) {
        const uint8_t* b = row + k * 210;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        const float d = h2f(b + 208);
        for (int h = 0; h < 2; ++h) {
            const uint8_t* ql = b + 64 * h; const uint8_t* qh = b + 128 + 32 * h;
            float32x4_t part = vdupq_n_f32(0.f);
            for (int half16 = 0; half16 < 2; ++half16) {  // weights l in [16 * half16, 16 * half16 + 16) of each quarter
                const uint8x16_t l0 = vld1q_u8(ql + 16 * half16), l1 = vld1q_u8(ql + 32 + 16 * half16);
                const uint8x16_t hb = vld1q_u8(qh + 16 * half16);
                const uint8x16_t low[4] = {vandq_u8(l0, vdupq_n_u8(15)), vandq_u8(l1, vdupq_n_u8(15)), vshrq_n_u8(l0, 4), vshrq_n_u8(l1, 4)};
                for (int j = 0; j < 4; ++j) {
                    const uint8x16_t top = vshlq_n_u8(vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(-2 * j))), three), 4);
                    const int8x16_t w = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low[j], top)), c32);
                    const int64_t i = 8 * k + 4 * h + j;  // the x block of quarter j
                    const int32x4_t p = vdotq_s32(vdupq_n_s32(0), w, vld1q_s8(x.q + 32 * i + 16 * half16));
                    part = vmlaq_n_f32(part, vcvtq_f32_s32(p), (float)sc[8 * h + 2 * j + half16] * x.d[i]);
                }
            }
            acc += d * vaddvq_f32(part);
        }
    }
    return acc;
}

