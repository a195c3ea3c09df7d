// The variant's block kernels (isa.h's LLMCLI_ARCH_KERNELS), which matmul.cpp calls. Every variant has
//   quantize_block(x, q, d, s[, n4])  one block of 32 activations -> int8 codes, scale, scaled sum
//                                     (and the codes' negated sums of 4: blocks.h's Q8)
//   dot_row<T>(row, x, nb)            one weight row of GGUF type T . one activation row (K = 32 nb),
//                                     for every type but Q5_K, which takes the float route
// and some have more, each named by a macro they define:
//   LLMCLI_DOT_ROWS4  dot_rows4<T>: one weight row against 4 activation rows (AVX2, AVX-VNNI)
//   LLMCLI_DOT_4ROWS  dot_4rows<T>: 4 weight rows against one activation row (AVX-512)
//   LLMCLI_TILES      dot_4rows_tile<T>: 4 weight rows against up to 8 activation rows (AVX-512)
//   LLMCLI_ORDERS     the activations copied again in the orders those kernels read (Q8's qi..d6)
//   LLMCLI_GROUPED    group_tile<T, C>: a copy of the weights interleaved kGroupRows rows at a time
//                     (row_groups.h) against up to kGroupCols activation rows (x86: 16 or 8 rows)
// A variant whose kernels come by kind (dot32_row<T> for the 32-blocks, q4k_row, q6k_row, and
// quantize_block without n4: neon, portable) gets dot_row and the n4 sums here.
#pragma once
#include "blocks.h"
#include "isa.h"

#include LLMCLI_ARCH_KERNELS

#if !defined(LLMCLI_DOT_ROW)
// One block as int8x2 (blocks.h's quantize_pair_scalar) with each row's negated sums of 4
static inline void quantize_pair(const float* x, int8_t* hi, int8_t* lo, float* d, float* s, int32_t* n4_hi, int32_t* n4_lo) {
    quantize_pair_scalar(x, hi, lo, d, s);
    sums_of_four(hi, n4_hi);
    sums_of_four(lo, n4_lo);
}

// One block quantized with its negated sums of 4
static inline void quantize_block(const float* x, int8_t* q, float& d, float& s, int32_t* n4) {
    quantize_block(x, q, d, s);
    sums_of_four(q, n4);
}

// One dispatcher by block type
template <int T>
static float dot_row(const uint8_t* row, const Q8& x, int64_t nb) {
    if constexpr (T == kQ4_K) return q4k_row(row, x, nb);
    else if constexpr (T == kQ6_K) return q6k_row(row, x, nb);
    else return dot32_row<T>(row, x, nb);
}
#endif
