// The instruction set this build is for: the one place where the variant's macro (set by build.py's
// flags: LLMCLI_AVX512VNNI, LLMCLI_AVXVNNI, LLMCLI_AVX2, LLMCLI_NEON, or none for portable) picks
// code. Per variant: its name, a check that the compiler targets what it needs (explicit flags, never
// -march=native, so one build serves every CPU of its kind), and its arch headers:
// - the SIMD primitives (float16 loads, the spin-wait hint, float vectors: vec.h lists them),
//   included here for the generic code;
// - the block kernels, LLMCLI_ARCH_KERNELS, which dot.h includes after blocks.h (they use the blocks,
//   which use the primitives: one header here could not include both in order).
// Below this header nothing generic names an instruction set: it asks what the kernels provide (the
// macros dot.h lists). Only the header two variants share tells them apart by their macro
// (arch/x86/avx2.h, avx2_rows8.h: vpdpbusd on avxvnni, vpmaddubsw + vpmaddwd on avx2).
#pragma once

#if defined(LLMCLI_AVX512VNNI)  // Zen 4/5, Ice Lake and later
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && defined(__FMA__) && defined(__F16C__))
#error "the avx512vnni variant needs -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c"
#endif
#define LLMCLI_VARIANT "avx512vnni"
#include "../arch/x86/simd_avx512.h"
#define LLMCLI_ARCH_KERNELS "../arch/x86/avx512.h"

#elif defined(LLMCLI_AVXVNNI)  // Alder Lake and later: AVX2 with the VEX-encoded vpdpbusd
#if !(defined(__AVX2__) && defined(__AVXVNNI__) && defined(__FMA__) && defined(__F16C__))
#error "the avxvnni variant needs -mavx2 -mavxvnni -mfma -mf16c"
#endif
#define LLMCLI_VARIANT "avxvnni"
#include "../arch/x86/simd_avx2.h"
#define LLMCLI_ARCH_KERNELS "../arch/x86/avx2.h"

#elif defined(LLMCLI_AVX2)  // Haswell and later, Zen 1-3
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "the avx2 variant needs -mavx2 -mfma -mf16c"
#endif
#define LLMCLI_VARIANT "avx2"
#include "../arch/x86/simd_avx2.h"
#define LLMCLI_ARCH_KERNELS "../arch/x86/avx2.h"

#elif defined(LLMCLI_NEON)  // aarch64 with dot products: Apple Silicon, Graviton 2+, Cortex-A76+
#if !(defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD))
#error "the neon variant needs aarch64 with -march=armv8.2-a+dotprod"
#endif
#define LLMCLI_VARIANT "neon"
#include "../arch/arm/simd.h"
#define LLMCLI_ARCH_KERNELS "../arch/arm/neon.h"

#else  // any CPU: plain C++
#define LLMCLI_VARIANT "portable"
#include "../arch/portable/simd.h"
#define LLMCLI_ARCH_KERNELS "../arch/portable/portable.h"
#endif
