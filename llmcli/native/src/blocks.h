// GGUF block layouts (the table in quant/gguf_blocks.py), their scalar dequantization, and the
// int8 activations the dot products take. Shared by every variant.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "isa.h"

// quant/gguf_blocks.py's TYPE_IDS. F16 and BF16 are rows of 2-byte floats (a "block" of one weight),
// which float_rows.h multiplies with float32 activations, never int8 ones.
enum BlockType : int { kQ5_0 = 0, kQ5_1 = 1, kQ5_K = 2, kQ6_K = 3, kQ4_0 = 4, kQ4_1 = 5, kQ8_0 = 6, kQ4_K = 7,
                       kF16 = 8, kBF16 = 9, kMXFP4 = 10 };
constexpr int kTypes = 11;
template <int T> constexpr bool float_type = T == kF16 || T == kBF16;

// Q4_K / Q5_K: 8 six-bit scales and mins in 12 bytes (ggml's get_scale_min_k4), unpacked with
// word operations: bytes 0-3 hold scales 0-3 (and the top bits of scales 4-7), 4-7 mins 0-3 (and
// the top bits of mins 4-7), 8-11 the low four bits of scales 4-7 and mins 4-7
static inline void k_scales(const uint8_t* p, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[3];
    std::memcpy(u, p, 12);
    const uint32_t s_lo = u[0] & 0x3f3f3f3f, m_lo = u[1] & 0x3f3f3f3f;
    const uint32_t s_hi = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
    std::memcpy(sc, &s_lo, 4); std::memcpy(sc + 4, &s_hi, 4);
    std::memcpy(mn, &m_lo, 4); std::memcpy(mn + 4, &m_hi, 4);
}

// A K-quant super-block's header: d, dmin (float16) and its 8 sub-blocks' 6-bit scales and mins.
struct KHead {
    float d, dmin;
    uint8_t sc[8], mn[8];
    explicit KHead(const uint8_t* b) : d(h2f(b)), dmin(h2f(b + 2)) { k_scales(b + 4, sc, mn); }
};

template <int T> struct Block;

template <> struct Block<kQ5_0> {  // d f16, qh u32 (5th bits), qs[16]: w = d * (q - 16)
    static constexpr int size = 32, bytes = 22;
    static void deq(const uint8_t* b, float* y) {
        const float d = h2f(b); uint32_t qh; std::memcpy(&qh, b + 2, 4); const uint8_t* qs = b + 6;
        for (int j = 0; j < 16; ++j) {
            y[j] = d * (float)((int)((qs[j] & 15) | (((qh >> j) << 4) & 16)) - 16);
            y[j + 16] = d * (float)((int)((qs[j] >> 4) | ((qh >> (j + 12)) & 16)) - 16);
        }
    }
};

template <> struct Block<kQ5_1> {  // d, m f16, qh u32, qs[16]: w = d * q + m
    static constexpr int size = 32, bytes = 24;
    static void deq(const uint8_t* b, float* y) {
        const float d = h2f(b), m = h2f(b + 2); uint32_t qh; std::memcpy(&qh, b + 4, 4); const uint8_t* qs = b + 8;
        for (int j = 0; j < 16; ++j) {
            y[j] = d * (float)((qs[j] & 15) | (((qh >> j) << 4) & 16)) + m;
            y[j + 16] = d * (float)((qs[j] >> 4) | ((qh >> (j + 12)) & 16)) + m;
        }
    }
};

template <> struct Block<kQ5_K> {  // d, dmin f16, scales[12], qh[32], qs[128]: w = d*sc * q - dmin*m per 32
    static constexpr int size = 256, bytes = 176;
    static void deq(const uint8_t* b, float* y) {
        const KHead h(b);
        const float d = h.d, dmin = h.dmin;
        const uint8_t *sc = h.sc, *mn = h.mn;
        const uint8_t* qh = b + 16; const uint8_t* ql = b + 48;
        for (int c = 0; c < 4; ++c) {
            const float d1 = d * sc[2 * c], o1 = dmin * mn[2 * c], d2 = d * sc[2 * c + 1], o2 = dmin * mn[2 * c + 1];
            for (int l = 0; l < 32; ++l) {
                y[l] = d1 * (float)((ql[l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4)) - o1;
                y[l + 32] = d2 * (float)((ql[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) - o2;
            }
            y += 64; ql += 32;
        }
    }
};

template <> struct Block<kQ6_K> {  // ql[128], qh[64], scales[16] i8, d f16: w = d*sc * (q - 32) per 16
    static constexpr int size = 256, bytes = 210;
    static void deq(const uint8_t* b, float* y) {
        const uint8_t* ql = b; const uint8_t* qh = b + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192); const float d = h2f(b + 208);
        for (int h = 0; h < 2; ++h) {  // halves of 128: quarter j of 32 from ql's low/high nibbles and qh's bits 2j, 2j+1
            for (int l = 0; l < 32; ++l) {
                const int g = l / 16;
                y[l] = d * sc[g] * (float)(((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32);
                y[l + 32] = d * sc[g + 2] * (float)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                y[l + 64] = d * sc[g + 4] * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                y[l + 96] = d * sc[g + 6] * (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
            y += 128; ql += 64; qh += 32; sc += 8;
        }
    }
};

template <> struct Block<kQ4_0> {  // d f16, qs[16]: w = d * (q - 8); element j low nibble, j + 16 high
    static constexpr int size = 32, bytes = 18;
    static void deq(const uint8_t* b, float* y) {
        const float d = h2f(b); const uint8_t* qs = b + 2;
        for (int j = 0; j < 16; ++j) { y[j] = d * (float)((qs[j] & 15) - 8); y[j + 16] = d * (float)((qs[j] >> 4) - 8); }
    }
};

template <> struct Block<kQ4_1> {  // d, m f16, qs[16]: w = d * q + m
    static constexpr int size = 32, bytes = 20;
    static void deq(const uint8_t* b, float* y) {
        const float d = h2f(b), m = h2f(b + 2); const uint8_t* qs = b + 4;
        for (int j = 0; j < 16; ++j) { y[j] = d * (float)(qs[j] & 15) + m; y[j + 16] = d * (float)(qs[j] >> 4) + m; }
    }
};

template <> struct Block<kQ8_0> {  // d f16, qs[32] int8: w = d * q
    static constexpr int size = 32, bytes = 34;
    static void deq(const uint8_t* b, float* y) {
        const float d = h2f(b); const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
        for (int j = 0; j < 32; ++j) y[j] = d * (float)qs[j];
    }
};

template <> struct Block<kQ4_K> {  // d, dmin f16, scales[12], qs[128]: w = d*sc * q - dmin*m per 32
    static constexpr int size = 256, bytes = 144;
    static void deq(const uint8_t* b, float* y) {
        const KHead h(b);
        const float d = h.d, dmin = h.dmin;
        const uint8_t *sc = h.sc, *mn = h.mn;
        const uint8_t* qs = b + 16;
        for (int c = 0; c < 4; ++c) {  // 64 elements: the low nibbles of 32 bytes, then the high ones
            for (int l = 0; l < 32; ++l) {
                y[l] = d * sc[2 * c] * (float)(qs[l] & 15) - dmin * mn[2 * c];
                y[l + 32] = d * sc[2 * c + 1] * (float)(qs[l] >> 4) - dmin * mn[2 * c + 1];
            }
            y += 64; qs += 32;
        }
    }
};

// MXFP4 (gpt-oss's experts): e8m0 exponent e, qs[16] of e2m1 codes: w = kMXFP4Values[q] * 2^(e - 128),
// ggml's numbers (kvalues_mxfp4: the e2m1 values doubled, small integers; GGML_E8M0_TO_FP32_HALF: half
// the scale). The kernels look the nibbles up as int8 codes and take Q8_0's signed route, d = that half.
alignas(16) static const int8_t kMXFP4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
static inline float e8m0_half(uint8_t e) {  // 2^(e - 128), exactly (e < 2: a denormal)
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

template <> struct Block<kMXFP4> {  // e u8, qs[16]: element j low nibble, j + 16 high
    static constexpr int size = 32, bytes = 17;
    static void deq(const uint8_t* b, float* y) {
        const float d = e8m0_half(b[0]); const uint8_t* qs = b + 1;
        for (int j = 0; j < 16; ++j) { y[j] = d * (float)kMXFP4Values[qs[j] & 15]; y[j + 16] = d * (float)kMXFP4Values[qs[j] >> 4]; }
    }
};

// A 32-block's scale d (the weights d * code): f16 at its start, MXFP4's e8m0 halved
template <int T>
static inline float block_d(const uint8_t* b) {
    if constexpr (T == kMXFP4) return e8m0_half(b[0]);
    else return h2f(b);
}

template <> struct Block<kF16> {  // one IEEE half
    static constexpr int size = 1, bytes = 2;
    static void deq(const uint8_t* b, float* y) { y[0] = h2f(b); }
};

template <> struct Block<kBF16> {  // one bfloat16: a float32's top 16 bits
    static constexpr int size = 1, bytes = 2;
    static void deq(const uint8_t* b, float* y) { uint16_t h; std::memcpy(&h, b, 2); y[0] = bf16_to_float(h); }
};

static inline int64_t block_size(int type) {
    return type == kQ5_K || type == kQ6_K || type == kQ4_K ? 256 : type == kF16 || type == kBF16 ? 1 : 32;
}

static inline int64_t block_bytes(int type) {
    static const int64_t bytes[kTypes] = {22, 24, 176, 210, 18, 20, 34, 144, 2, 2, 17};
    return bytes[type];
}

// f(std::integral_constant<int, T>{}) for a type id in [0, kTypes): the one switch over block types
template <typename F>
static void with_type(int type, F&& f) {
    switch (type) {
        case 0: f(std::integral_constant<int, 0>{}); break;
        case 1: f(std::integral_constant<int, 1>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        case 5: f(std::integral_constant<int, 5>{}); break;
        case 6: f(std::integral_constant<int, 6>{}); break;
        case 7: f(std::integral_constant<int, 7>{}); break;
        case 8: f(std::integral_constant<int, 8>{}); break;
        case 9: f(std::integral_constant<int, 9>{}); break;
        case 10: f(std::integral_constant<int, 10>{}); break;
        default: break;  // the API checks type ids before they get here
    }
}

// One activation row as the int8 dot products take it (llama.cpp's Q8_0/Q8_1): per block of 32,
// codes q with x ~ d * q, d = max|x| / 127, and s = d * sum(q) for the weights' offsets (Q4_1's m,
// Q4_K's mins); n4 = -(sum of each 4 consecutive codes), which the VNNI variants put in their
// accumulators to take codes stored with an offset (q + 8, q + 128) as unsigned bytes.
struct Q8 {
    const int8_t* q;    // (K,)
    const float* d;     // (K/32,)
    const float* s;     // (K/32,)
    const int32_t* n4;  // (K/4,)
    // The AVX-512 variant's copy for the 4-bit and 5-bit 32-blocks, per group of 8 (avx512_blocks.h's nibble_order):
    const int8_t* qi;   // 4 vectors c of 64: qword q holds codes 8c..8c+7 of block nibble_block(q)
    const int32_t* ni;  // 16 a group: lane l's -16 * (sum of the 16 codes it multiplies)
    const float* ds;    // (d, s) of each block side by side
    const float* d16;   // 16 a group: block nibble_block(q)'s d in lanes 2q, 2q + 1, as the weights' d meet it
    // and for Q8_0, per group of 4 blocks (avx512_blocks.h's q8_0_order, the nibble types' last quad's order):
    const int8_t* qq;   // codes 0-15 of the 4 blocks, then 16-31 (128 a group)
    const int32_t* zq;  // 16 a group: lane 4b + t's -128 * (sum of the 8 codes it multiplies)
    const float* dq;    // 16 a group: lane 4b + t's block's d
    // and for Q4_K, per block of 256 (avx512_blocks.h's Q4KBlock):
    const int8_t* qk;   // 4 vectors c of 64: sub-block j's codes 8c..8c+7 at bytes 8j..8j+7 (K,)
    const float* d2;    // sub-block j's d in lanes 2j, 2j + 1 (K/16,)
    // and for Q6_K, per block of 256 (Q6KBlock): lane L = 4i + t takes scale group g = 4t + i's 16 codes
    const int8_t* q6;   // 4 vectors c of 64: group g's codes 4c..4c+3 at lane L (K,)
    const int32_t* z6;  // lane L's accumulator start: -32 * the sum of group g's codes (K/16,)
    const float* d6;    // group g's block's d in lane L (K/16,)
};

// Activation rows side by side, 8 a group, as the row-group kernels (row_groups.h) read them: one
// pointer and constant offsets reach the 4 codes a multiply-add takes from each of a tile's rows
// (with a pointer a row the tile spent a fifth of its time on addresses). Per 32-block b, column c
// of the group (c from this view's first): codes 4j..4j+3 at q[256 b + 32 j + 4 c]; d, s and n32
// (-(the sum of the block's codes), the zero points' start) at [8 b + c]; n16 (the same for codes
// 16h..16h + 15, Q6_K's) at [16 b + 8 h + c].
constexpr int kColGroup = 8;
struct Q8Cols {
    const int8_t* q;
    const float* d;
    const float* s;
    const int32_t* n32;
    const int32_t* n16;
};

// Rounds v (|v| < 2^22) to the nearest integer, ties to even, as nearbyint does in the default mode:
// adding 1.5 * 2^23 leaves no bits below the units. Every variant quantizes alike, bit for bit.
static inline float round_even(float v) { return (v + 12582912.f) - 12582912.f; }

// The portable quantization of one block; the SIMD variants' quantize_block gives the same bytes
static inline void quantize_block_scalar(const float* x, int8_t* q, float& d_out, float& s_out) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
        const int v = (int)round_even(x[i] * id);
        q[i] = (int8_t)v;
        sum += v;
    }
    d_out = d;
    s_out = d * (float)sum;
}

// One block of 32 floats as int8x2 (Q8Rows::refined): 16-bit codes v = round(x / e), e = amax / (127 *
// 256), as a high byte h = round(v / 256) and a low one l = v - 256 h (clamped to -127: plain AVX2's
// sign trick has no +128), so x ~ e (256 h + l), within e / 2 (e: the int8 step / 256). The high
// row takes int8's d = 256 e and the whole block's scaled sum e * (sum of v); the low row e and 0. A
// kernel that adds the two rows' values gets x's products; the row-group kernels, which know the
// pairs, add their integer sums as 256 s_h + s_l and scale once. The same bytes on every variant.
static inline void quantize_pair_scalar(const float* x, int8_t* hi, int8_t* lo, float* d, float* s) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float e = amax / 127.f * (1.f / 256.f), ie = e > 0.f ? 1.f / e : 0.f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
        const int v = std::min(32512, std::max(-32512, (int)round_even(x[i] * ie)));
        const int h = (v + 128) >> 8, l = std::max(-127, v - 256 * h);
        hi[i] = (int8_t)h;
        lo[i] = (int8_t)l;
        sum += 256 * h + l;
    }
    d[0] = 256.f * e, d[1] = e;
    s[0] = e * (float)sum, s[1] = 0.f;
}

static inline void sums_of_four(const int8_t* q, int32_t* n4) {  // one block's 8 negated sums of 4
    for (int g = 0; g < 8; ++g) n4[g] = -(q[4 * g] + q[4 * g + 1] + q[4 * g + 2] + q[4 * g + 3]);
}
