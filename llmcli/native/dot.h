// The variant's block dot products: dot_row<T>(weight row, activation row, K / 32) -> float for
// every type but Q5_K (which takes the float route in matmul.cpp), and quantize_block.
#pragma once
#include "isa.h"

#if defined(LLMCLI_AVX512VNNI)
#include "dot_avx512.h"
#elif defined(LLMCLI_X86)
#include "dot_avx2.h"
#elif defined(LLMCLI_NEON)
#include "dot_neon.h"
#else
#include "dot_portable.h"
#endif
