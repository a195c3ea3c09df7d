// The portable variant's primitives, for any CPU the compiler targets: float16 converted in plain
// C++ (half.h), and float vectors of 4 in GCC/Clang vector extensions, which become the compiler's
// baseline SIMD (SSE2 on x86-64) or scalar code (vec.h's primitives, see there).
#pragma once
#include <cstdint>
#include <cstring>

#include "../../src/half.h"

// A little-endian float16 at p (blocks store their scales so)
static inline float h2f(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return half_to_float(v);
}

// One iteration of a spin-wait: a hint to the core on aarch64 only (on x86 the portable build spins
// without _mm_pause)
static inline void cpu_relax() {
#if defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// n floats -> float16, rounded to nearest even (a float16 KV cache)
static inline void to_halves(const float* x, uint16_t* h, int64_t n) {
    for (int64_t i = 0; i < n; ++i) h[i] = float_to_half(x[i]);
}

typedef float vf __attribute__((vector_size(16)));
typedef int32_t vi __attribute__((vector_size(16)));
static inline vf vload(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
static inline vf vset1(float x) { return vf{x, x, x, x}; }
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline vf vselect(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }  // m ? a : b, lane by lane
static inline vf vmax(vf a, vf b) { return vselect(a > b, a, b); }
static inline vf vmin(vf a, vf b) { return vselect(a < b, a, b); }
static inline vf vround(vf a) { return (a + vset1(12582912.f)) - vset1(12582912.f); }  // |a| < 2^22, ties to even
static inline vf vpow2i(vf n) { return (vf)((__builtin_convertvector(n, vi) + 127) << 23); }
static inline float vsum(vf v) { return (v[0] + v[1]) + (v[2] + v[3]); }
static inline bool vany_above(vf v, float t) {
    const vi le = (vi)(v <= vset1(t));  // -1 where v <= t; NaN compares false
    return (le[0] & le[1] & le[2] & le[3]) == 0;
}
static inline vf vload_half(const uint16_t* p) {
    return vf{half_to_float(p[0]), half_to_float(p[1]), half_to_float(p[2]), half_to_float(p[3])};
}
static inline vf vload_bf16(const uint16_t* p) {
    return vf{bf16_to_float(p[0]), bf16_to_float(p[1]), bf16_to_float(p[2]), bf16_to_float(p[3])};
}
static inline void reduce4(const vf acc[4], float out[4]) {
    for (int j = 0; j < 4; ++j) out[j] = vsum(acc[j]);
}

constexpr int kAccumulators = 8;  // vectors a loop may keep summing in registers (SSE2 has 16)
// Activation rows an F16/BF16 micro-tile takes against 4 weight rows (float_rows.h): 8 sums, 4 weights, 1 input
constexpr int kFloatCols = 2;
