// The instruction set this build is for: one of LLMCLI_AVX512VNNI, LLMCLI_AVXVNNI, LLMCLI_AVX2,
// LLMCLI_NEON or none (portable), set by build.py beside explicit target flags (never -march=native,
// so one build serves every CPU of its kind). Here: its name, float16 loads, the spin-wait hint,
// and a float vector as wide as the variant's registers for the element-wise code (vec.h).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(LLMCLI_AVX512VNNI)
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && defined(__FMA__) && defined(__F16C__))
#error "the avx512vnni variant needs -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c"
#endif
#define LLMCLI_VARIANT "avx512vnni"
#define LLMCLI_X86 1
#define LLMCLI_VW 16
#elif defined(LLMCLI_AVXVNNI)
#if !(defined(__AVX2__) && defined(__AVXVNNI__) && defined(__FMA__) && defined(__F16C__))
#error "the avxvnni variant needs -mavx2 -mavxvnni -mfma -mf16c"
#endif
#define LLMCLI_VARIANT "avxvnni"
#define LLMCLI_X86 1
#define LLMCLI_VW 8
#elif defined(LLMCLI_AVX2)
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "the avx2 variant needs -mavx2 -mfma -mf16c"
#endif
#define LLMCLI_VARIANT "avx2"
#define LLMCLI_X86 1
#define LLMCLI_VW 8
#elif defined(LLMCLI_NEON)
#if !(defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD))
#error "the neon variant needs aarch64 with -march=armv8.2-a+dotprod"
#endif
#define LLMCLI_VARIANT "neon"
#define LLMCLI_VW 4
#else
#define LLMCLI_VARIANT "portable"
#define LLMCLI_VW 4
#endif

#if defined(LLMCLI_X86)
#include <immintrin.h>
#elif defined(LLMCLI_NEON)
#include <arm_neon.h>
#endif

// float16 bits -> float, exactly (subnormals, infinities and NaNs too): the portable build's way
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

// float -> float16 bits, rounded to nearest even as torch's .to(torch.float16) and F16C round
// (overflow to infinity, subnormals kept): the portable build's way
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

// A little-endian float16 at p (blocks store their scales so)
static inline float h2f(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
#if defined(LLMCLI_X86)
    return _cvtsh_ss(v);
#elif defined(LLMCLI_NEON)
    __fp16 h;
    std::memcpy(&h, &v, 2);
    return (float)h;
#else
    return half_to_float(v);
#endif
}

// One iteration of a spin-wait: tells the core it may give its resources to the other hyper-thread
static inline void cpu_relax() {
#if defined(LLMCLI_X86)
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}
