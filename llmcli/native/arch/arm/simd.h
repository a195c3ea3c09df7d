// The neon variant's primitives (aarch64 with dot products): float16 loads and stores, the
// spin-wait hint, and float vectors of 4 (vec.h's primitives, see there).
#pragma once
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "../../src/half.h"

// A little-endian float16 at p (blocks store their scales so)
static inline float h2f(const uint8_t* p) {
    __fp16 h;
    std::memcpy(&h, p, 2);
    return (float)h;
}

// One iteration of a spin-wait: lets the core give its resources to another thread
static inline void cpu_relax() { __asm__ __volatile__("yield"); }

// n floats -> float16, rounded to nearest even (a float16 KV cache)
static inline void to_halves(const float* x, uint16_t* h, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(h + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; ++i) h[i] = float_to_half(x[i]);
}

using vf = float32x4_t;
static inline vf vload(const float* p) { return vld1q_f32(p); }
static inline void vstore(float* p, vf v) { vst1q_f32(p, v); }
static inline vf vset1(float x) { return vdupq_n_f32(x); }
static inline vf vfma(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
static inline vf vmax(vf a, vf b) { return vmaxq_f32(a, b); }
static inline vf vmin(vf a, vf b) { return vminq_f32(a, b); }
static inline vf vround(vf a) { return vrndnq_f32(a); }
static inline vf vpow2i(vf n) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23));
}
static inline float vsum(vf v) { return vaddvq_f32(v); }
static inline bool vany_above(vf v, float t) { return vmaxvq_u32(vmvnq_u32(vcleq_f32(v, vdupq_n_f32(t)))) != 0; }
static inline vf vload_half(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
static inline vf vload_bf16(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }  // to the top halves
static inline void reduce4(const vf acc[4], float out[4]) {
    for (int j = 0; j < 4; ++j) out[j] = vsum(acc[j]);
}

constexpr int kAccumulators = 16;  // vectors a loop may keep summing in registers (half of NEON's 32)
// Activation rows an F16/BF16 micro-tile takes against 4 weight rows (float_rows.h): 24 sums, 4 weights, 1 input
constexpr int kFloatCols = 6;
