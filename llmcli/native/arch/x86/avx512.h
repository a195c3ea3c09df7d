// The avx512vnni variant's kernels (isa.h): one weight row or four against one activation row, from
// the blocks as stored; the tiles (several activation rows at once) and the row groups (a copy of the
// weights interleaved 16 rows at a time, which a decode step reads) beside them. The pieces are
// avx512_blocks.h's.
#pragma once
#include "avx512_blocks.h"
#include "avx512_rows16.h"
#include "avx512_tiles.h"

#define LLMCLI_DOT_ROW 1  // dot_row and quantize_block with n4 (dot.h)
#define LLMCLI_DOT_4ROWS 1

// The groups of R nibble-type rows (`stride` bytes apart) of nb blocks, as nibble_order has the
// activations: f8(p, g, r) for each group g of 8 blocks p[0..7] of row r (a last one of 5 to 7 with
// zero blocks after), f4(p, g, r) for a last one of 1 to 4 (zero blocks after)
template <int bytes, int R = 1, typename F8, typename F4>
static LLMCLI_INLINE void nibble_groups(const uint8_t* row, int64_t stride, int64_t nb, F8&& f8, F4&& f4) {
    int64_t k = 0;
    for (; k + 8 <= nb; k += 8)
        for (int r = 0; r < R; ++r) {  // the R rows' group k / 8 together: they share the activations' loads
            const uint8_t* b = row + r * stride + k * bytes;
            const uint8_t* const p[8] = {b, b + bytes, b + 2 * bytes, b + 3 * bytes, b + 4 * bytes, b + 5 * bytes, b + 6 * bytes, b + 7 * bytes};
            f8(p, k / 8, r);
        }
    for (int r = 0; r < R && nb > k; ++r) {
        if (nb - k > 4) {
            const uint8_t* p[8];
            group_of<bytes, 8>(row + r * stride, k, nb, p);
            f8(p, k / 8, r);
        } else {
            const uint8_t* p[4];
            group_of<bytes, 4>(row + r * stride, k, nb, p);
            f4(p, k / 8, r);
        }
    }
}

// The nibble types, R weight rows (`stride` bytes apart) against one activation row, a group of 8
// blocks a step
template <int T, int R>
static void nibble_rows(const uint8_t* row, int64_t stride, const Q8& x, int64_t nb, float* out) {
    __m512 acc[R], off[R];
    for (int r = 0; r < R; ++r) acc[r] = off[r] = _mm512_setzero_ps();
    nibble_groups<Block<T>::bytes, R>(
        row, stride, nb,
        [&](const uint8_t* const* p, int64_t g, int r) __attribute__((always_inline)) {
            __m512i v[4];
            __m512 wd, wdm;
            nibble_unpack<T>(p, v, wd, wdm);
            nibble_dot<T>(v, wd, wdm, x, g, acc[r], off[r]);
        },
        [&](const uint8_t* const* p, int64_t g, int r) __attribute__((always_inline)) {
            __m512i lo, hi;
            __m512 wd, wdm;
            nibble_quad_unpack<T>(p, lo, hi, wd, wdm);
            nibble_quad_dot<T>(lo, hi, wd, wdm, x, g, acc[r], off[r]);
        });
    nibble_sums<T, R>(acc, off, out);
}

// Q8_0 or MXFP4 (T), R weight rows against one activation row, four blocks a step (a last group of
// fewer with zero blocks after)
template <int T, int R>
static void q8_0_rows(const uint8_t* row, int64_t stride, const Q8& x, int64_t nb, float* out) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < (nb + 3) / 4; ++j)
        for (int r = 0; r < R; ++r) {
            __m512i lo, hi;
            __m512 wd;
            q8_0_group<T>(row + r * stride, nb, j, lo, hi, wd);
            q8_0_quad_dot(lo, hi, wd, x, j, acc[r]);
        }
    reduce_rows<R>(acc, out);
}

// Q4_K or Q6_K (B: its block), R weight rows against one activation row: the rows' sums interleaved
// (one row's chain of multiply-adds alone waits on their latency)
template <typename B, int R>
static void kblock_rows(const uint8_t* row, int64_t stride, const Q8& x, int64_t nb, float* out) {
    __m512 acc[R];
    __m256 off[R];
    for (int r = 0; r < R; ++r) { acc[r] = _mm512_setzero_ps(); off[r] = _mm256_setzero_ps(); }
    for (int64_t k = 0; k < nb / 8; ++k)
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) B(row + r * stride + k * B::bytes).dot(x, k, acc[r], off[r]);
    for (int r = 0; r < R; ++r) out[r] = kblock_sum(acc[r], off[r]);
}

// One weight row against one activation row of K = 32 * nb
template <int T>
static float dot_row(const uint8_t* row, const Q8& x, int64_t nb) {
    float out;
    if constexpr (T == kQ4_K) kblock_rows<Q4KBlock, 1>(row, 0, x, nb, &out);
    else if constexpr (T == kQ6_K) kblock_rows<Q6KBlock, 1>(row, 0, x, nb, &out);
    else if constexpr (quad_type<T>) q8_0_rows<T, 1>(row, 0, x, nb, &out);
    else nibble_rows<T, 1>(row, 0, x, nb, &out);
    return out;
}

// Four weight rows, `stride` bytes apart, against one activation row
template <int T>
static void dot_4rows(const uint8_t* row, int64_t stride, const Q8& x, int64_t nb, float out[4]) {
    if constexpr (quad_type<T>) q8_0_rows<T, 4>(row, stride, x, nb, out);
    else if constexpr (T == kQ4_K) kblock_rows<Q4KBlock, 4>(row, stride, x, nb, out);
    else if constexpr (T == kQ6_K) kblock_rows<Q6KBlock, 4>(row, stride, x, nb, out);
    else nibble_rows<T, 4>(row, stride, x, nb, out);
}

