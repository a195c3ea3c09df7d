// What every x86 variant has (AVX2, FMA and F16C are in all of them): float16 loads and stores by
// F16C, and the spin-wait hint. simd_avx512.h and simd_avx2.h add the float vectors.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../../src/half.h"

// A little-endian float16 at p (blocks store their scales so)
static inline float h2f(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return _cvtsh_ss(v);
}

// One iteration of a spin-wait: tells the core it may give its resources to the other hyper-thread
static inline void cpu_relax() { _mm_pause(); }

// n floats -> float16, rounded to nearest even (a float16 KV cache)
static inline void to_halves(const float* x, uint16_t* h, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) h[i] = float_to_half(x[i]);
}
