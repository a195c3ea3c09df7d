// float16 <-> float (and bfloat16 -> float) in plain C++, exactly as the hardware converts: the portable
// build's loads, and every variant's odd elements (a vector's tail, one value of a float16 KV cache).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

// float16 bits -> float, exactly (subnormals, infinities and NaNs too)
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 31, man = h & 1023;
    uint32_t bits;
    if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);  // rebias 15 -> 127
    } else {
        const float f = (float)man * 5.9604644775390625e-8f;  // subnormal: man * 2^-24
        std::memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// bfloat16 bits -> float, exactly: they are a float's top half
static inline float bf16_to_float(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// float -> float16 bits, rounded to nearest even as torch's .to(torch.float16) and F16C round
// (overflow to infinity, subnormals kept)
static inline uint16_t float_to_half(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);  // infinity, NaN
    if (ax >= 0x477ff000u) return sign | 0x7c00;  // 65520 and above round to infinity
    if (ax < 0x38800000u) {  // below 2^-14: a subnormal half, a multiple of 2^-24 (exact in float, then rounded to even)
        float a;
        std::memcpy(&a, &ax, 4);
        return sign | (uint16_t)std::nearbyint(a * 16777216.f);
    }
    const uint32_t r = ax - 0x38000000u;  // exponent rebiased 127 -> 15; then 23 -> 10 bits, ties to even
    return sign | (uint16_t)((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
}
