// The variant's block dot products: dot_row<T>(weight row, activation row, K / 32) -> float for
// every type but Q5_K (which takes the float route in matmul.cpp), and quantize_block.
#pragma once
#include "isa.h"

#if defined(LLMCLI_AVX512VNNI)
#include "../arch/x86/avx512_blocks.h"
#elif defined(LLMCLI_X86)
#include "../arch/x86/avx2.h"
#elif defined(LLMCLI_NEON)
#include "../arch/arm/neon.h"
#else
#include "../arch/portable/portable.h"
#endif

#if !defined(LLMCLI_X86)
// One block quantized with its negated sums of 4 (x86.h's quantize_block computes them itself)
static inline void quantize_block(const float* x, int8_t* q, float& d, float& s, int32_t* n4) {
    quantize_block(x, q, d, s);
    sums_of_four(q, n4);
}

// NEON and portable name their kernels alike: one dispatcher by block type
template <int T>
static float dot_row(const uint8_t* row, const Q8& x, int64_t nb) {
    if constexpr (T == kQ4_K) return q4k_row(row, x, nb);
    else if constexpr (T == kQ6_K) return q6k_row(row, x, nb);
    else return dot32_row<T>(row, x, nb);
}
#endif
