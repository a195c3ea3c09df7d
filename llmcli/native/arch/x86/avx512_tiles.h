// AVX-512 VNNI tiles (part of avx512.h's kernels, whose one-row kernels they mirror, from the same
// pieces: avx512_blocks.h).
#pragma once
#include <algorithm>

#include "../../src/row_groups.h"  // (with_cols)
#include "avx512_blocks.h"

// Tiles: four weight rows against C activation rows (a batch's rows, a speculative pass's tokens),
// each weight block unpacked once for the C of them. Every (weight row, activation row) pair goes
// through exactly the operations dot_4rows gives it alone, in the same order, so a token's numbers
// do not depend on the tokens beside it. out[4 * c + r]: weight row r against activation row c.
#define LLMCLI_TILES 1
template <int T> constexpr int tile_width = 8;  // C at most

// `ahead`: the next four rows, fetched a few lines at a time between the work (a burst of prefetches
// for all of them at once stalled on the line fill buffers: a sixth of the time at 8 rows)
static inline void fetch_ahead(const uint8_t* ahead, int64_t at) {
    if (ahead) { __builtin_prefetch(ahead + at); __builtin_prefetch(ahead + at + 64); }
}

// Group g of a nibble-type row of nb blocks, unpacked as nibble_groups takes it: 8 blocks
// (nibble_unpack; a last one of 5 to 7 padded with zero blocks), or a last quad of 1 to 4
// (nibble_quad_unpack, its lo and hi in v[0], v[1])
template <int T>
static LLMCLI_INLINE void nibble_group(const uint8_t* w, int64_t nb, int64_t g, bool quad, __m512i v[4], __m512& wd,
                                       __m512& wdm) {
    constexpr int bytes = Block<T>::bytes;
    const int64_t k = 8 * g;
    if (quad) {
        const uint8_t* p[4];
        group_of<bytes, 4>(w, k, nb, p);
        nibble_quad_unpack<T>(p, v[0], v[1], wd, wdm);
    } else if (k + 8 <= nb) {
        const uint8_t* b = w + k * bytes;
        const uint8_t* const p[8] = {b, b + bytes, b + 2 * bytes, b + 3 * bytes, b + 4 * bytes, b + 5 * bytes, b + 6 * bytes, b + 7 * bytes};
        nibble_unpack<T>(p, v, wd, wdm);
    } else {
        const uint8_t* p[8];
        group_of<bytes, 8>(w, k, nb, p);
        nibble_unpack<T>(p, v, wd, wdm);
    }
}

// The nibble types: `get(r, g, quad, v, wd, wdm)` gives weight row r's group g unpacked (nibble_group's)
template <int T, int C, typename Get>
static LLMCLI_INLINE void nibble_tile_from(Get&& get, const Q8* x, int64_t nb, float* out) {
    const int64_t G = (nb + 7) / 8;
    const bool last_quad = nb - 8 * (G - 1) <= 4;
    __m512 accs[C][4], offs[C][4];
    for (int r = 0; r < 4; ++r) {
        __m512 acc[C], off[C];
        for (int c = 0; c < C; ++c) acc[c] = off[c] = _mm512_setzero_ps();
        for (int64_t g = 0; g < G; ++g) {
            const bool quad = last_quad && g == G - 1;
            __m512i v[4];
            __m512 wd, wdm;
            get(r, g, quad, v, wd, wdm);
            if (quad) {
#pragma GCC unroll 8
                for (int c = 0; c < C; ++c) nibble_quad_dot<T>(v[0], v[1], wd, wdm, x[c], g, acc[c], off[c]);
            } else {
#pragma GCC unroll 8
                for (int c = 0; c < C; ++c) nibble_dot<T>(v, wd, wdm, x[c], g, acc[c], off[c]);
            }
        }
        for (int c = 0; c < C; ++c) { accs[c][r] = acc[c]; offs[c][r] = off[c]; }
    }
    for (int c = 0; c < C; ++c) nibble_sums<T, 4>(accs[c], offs[c], out + 4 * c);
}

template <int T, int C>
static void nibble_tile(const uint8_t* row, int64_t stride, const Q8* x, int64_t nb, float* out, const uint8_t* ahead) {
    constexpr int bytes = Block<T>::bytes;
    nibble_tile_from<T, C>(
        [&](int r, int64_t g, bool quad, __m512i* v, __m512& wd, __m512& wdm) __attribute__((always_inline)) {
            fetch_ahead(ahead, r * stride + 8 * g * bytes);  // 8 blocks: at most 192 bytes
            fetch_ahead(ahead, r * stride + 8 * g * bytes + 128);
            nibble_group<T>(row + r * stride, nb, g, quad, v, wd, wdm);
        },
        x, nb, out);
}

// Q8_0: `get(r, j, lo, hi, wd)` gives weight row r's blocks 4j..4j+3 (avx512_blocks.h's q8_0_group)
template <int C, typename Get>
static LLMCLI_INLINE void q8_0_tile_from(Get&& get, const Q8* x, int64_t nb, float* out) {
    __m512 accs[C][4];
    for (int r = 0; r < 4; ++r) {
        __m512 acc[C];
        for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
        for (int64_t j = 0; j < (nb + 3) / 4; ++j) {
            __m512i lo, hi;
            __m512 wd;
            get(r, j, lo, hi, wd);
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c) q8_0_quad_dot(lo, hi, wd, x[c], j, acc[c]);
        }
        for (int c = 0; c < C; ++c) accs[c][r] = acc[c];
    }
    for (int c = 0; c < C; ++c) reduce_rows<4>(accs[c], out + 4 * c);
}

template <int T, int C>
static void q8_0_tile(const uint8_t* row, int64_t stride, const Q8* x, int64_t nb, float* out, const uint8_t* ahead) {
    constexpr int bytes = Block<T>::bytes;
    q8_0_tile_from<C>(
        [&](int r, int64_t j, __m512i& lo, __m512i& hi, __m512& wd) __attribute__((always_inline)) {
            fetch_ahead(ahead, r * stride + 4 * j * bytes);  // 4 blocks: 136 bytes
            fetch_ahead(ahead, r * stride + 4 * j * bytes + 128);
            q8_0_group<T>(row + r * stride, nb, j, lo, hi, wd);
        },
        x, nb, out);
}

// kblock_rows for four weight rows against C activation rows, K in chunks of kChunk blocks taken by all
// four rows before the next chunk, so the C rows' activations stay in L1 for the four (8 rows of a K
// of 4864, ffn_down's, did not fit). Each pair's sums go on in k's order, as kblock_rows has them.
// `get(r, k)`: weight row r's block k (B).
template <typename B, int C, typename Get>
static LLMCLI_INLINE void kblock_tile_from(Get&& get, const Q8* x, int64_t nb, float* out) {
    constexpr int64_t kChunk = 4;
    __m512 accs[4][C];
    __m256 offs[4][C];
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < C; ++c) { accs[r][c] = _mm512_setzero_ps(); offs[r][c] = _mm256_setzero_ps(); }
    for (int64_t k0 = 0; k0 < nb / 8; k0 += kChunk) {
        const int64_t k1 = std::min(nb / 8, k0 + kChunk);
        for (int r = 0; r < 4; ++r) {
            __m512 acc[C];
            __m256 off[C];
            for (int c = 0; c < C; ++c) { acc[c] = accs[r][c]; off[c] = offs[r][c]; }
            for (int64_t k = k0; k < k1; ++k) {
                const B w = get(r, k);
#pragma GCC unroll 8  // the accumulators in registers (gcc kept a loop's in memory)
                for (int c = 0; c < C; ++c) w.dot(x[c], k, acc[c], off[c]);
            }
            for (int c = 0; c < C; ++c) { accs[r][c] = acc[c]; offs[r][c] = off[c]; }
        }
    }
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < C; ++c) out[4 * c + r] = kblock_sum(accs[r][c], offs[r][c]);
}

template <typename B, int C>
static void kblock_tile(const uint8_t* row, int64_t stride, const Q8* x, int64_t nb, float* out, const uint8_t* ahead) {
    kblock_tile_from<B, C>(
        [&](int r, int64_t k) __attribute__((always_inline)) {
            fetch_ahead(ahead, r * stride + k * B::bytes);
            fetch_ahead(ahead, r * stride + k * B::bytes + 128);
            return B(row + r * stride + k * B::bytes);
        },
        x, nb, out);
}

// Many tiles against the same four weight rows (a prefill's tokens, 64 at a time): the rows unpacked
// once into a buffer that every tile reads from L1 (nibble_group's vectors, q8_0_group's, Q4KBlock, Q6KBlock).
// Unpacking the rows again for each tile of 8 was a large part of a prefill's time. The products and
// their order are the tiles'.
struct NibbleGroup { __m512i v[4]; __m512 wd, wdm; };
struct Q8_0Group { __m512i lo, hi; __m512 wd; };
template <int T> struct Unpacked { using type = NibbleGroup; };  // what a group or block unpacks into
template <> struct Unpacked<kQ8_0> { using type = Q8_0Group; };
template <> struct Unpacked<kMXFP4> { using type = Q8_0Group; };
template <> struct Unpacked<kQ4_K> { using type = Q4KBlock; };
template <> struct Unpacked<kQ6_K> { using type = Q6KBlock; };
template <int T> constexpr bool unpacked_tiles = T != kQ5_K;  // (Q5_K takes the float route)
template <int T> constexpr bool is_kblock = T == kQ4_K || T == kQ6_K;
template <int T>
static int64_t unpacked_count(int64_t nb) { return 4 * (is_kblock<T> ? nb / 8 : quad_type<T> ? (nb + 3) / 4 : (nb + 7) / 8); }

// The four rows' groups (blocks of 256 for Q4_K, Q6_K; of 4 for Q8_0) unpacked: row r's group g at u[4 * g + r]
template <int T>
static void unpack_4rows(const uint8_t* row, int64_t stride, int64_t nb, typename Unpacked<T>::type* u,
                         const uint8_t* ahead) {
    constexpr int bytes = Block<T>::bytes;
    for (int r = 0; r < 4; ++r) {
        const uint8_t* w = row + r * stride;
        if constexpr (quad_type<T>) {
            for (int64_t j = 0; j < (nb + 3) / 4; ++j) {
                fetch_ahead(ahead, r * stride + 4 * j * bytes);
                fetch_ahead(ahead, r * stride + 4 * j * bytes + 128);
                Q8_0Group& q = u[4 * j + r];
                q8_0_group<T>(w, nb, j, q.lo, q.hi, q.wd);
            }
        } else if constexpr (is_kblock<T>) {
            for (int64_t k = 0; k < nb / 8; ++k) {
                fetch_ahead(ahead, r * stride + k * bytes);
                fetch_ahead(ahead, r * stride + k * bytes + 128);
                u[4 * k + r] = typename Unpacked<T>::type(w + k * bytes);
            }
        } else {
            const int64_t G = (nb + 7) / 8;
            for (int64_t g = 0; g < G; ++g) {
                fetch_ahead(ahead, r * stride + 8 * g * bytes);
                fetch_ahead(ahead, r * stride + 8 * g * bytes + 128);
                NibbleGroup& n = u[4 * g + r];
                nibble_group<T>(w, nb, g, g == G - 1 && nb - 8 * g <= 4, n.v, n.wd, n.wdm);
            }
        }
    }
}

template <int T, int C>
static void tile_unpacked(const typename Unpacked<T>::type* u, const Q8* x, int64_t nb, float* out) {
    if constexpr (quad_type<T>) {
        q8_0_tile_from<C>(
            [&](int r, int64_t j, __m512i& lo, __m512i& hi, __m512& wd) __attribute__((always_inline)) {
                const Q8_0Group& q = u[4 * j + r];
                lo = q.lo;
                hi = q.hi;
                wd = q.wd;
            },
            x, nb, out);
    } else if constexpr (is_kblock<T>) {
        kblock_tile_from<typename Unpacked<T>::type, C>([&](int r, int64_t k) { return u[4 * k + r]; }, x, nb, out);
    } else {
        nibble_tile_from<T, C>(
            [&](int r, int64_t g, bool, __m512i* v, __m512& wd, __m512& wdm) __attribute__((always_inline)) {
                const NibbleGroup& n = u[4 * g + r];
                for (int j = 0; j < 4; ++j) v[j] = n.v[j];
                wd = n.wd;
                wdm = n.wdm;
            },
            x, nb, out);
    }
}

template <int T, int C>
static void dot_4rows_tile_c(const uint8_t* row, int64_t stride, const Q8* x, int64_t nb, float* out, const uint8_t* ahead) {
    if constexpr (quad_type<T>) q8_0_tile<T, C>(row, stride, x, nb, out, ahead);
    else if constexpr (T == kQ6_K) kblock_tile<Q6KBlock, C>(row, stride, x, nb, out, ahead);
    else if constexpr (T == kQ4_K) kblock_tile<Q4KBlock, C>(row, stride, x, nb, out, ahead);
    else nibble_tile<T, C>(row, stride, x, nb, out, ahead);
}

// Four weight rows against C <= tile_width<T> activation rows; `ahead`: the rows to fetch meanwhile (or null)
template <int T>
static void dot_4rows_tile(const uint8_t* row, int64_t stride, const Q8* x, int C, int64_t nb, float* out,
                           const uint8_t* ahead) {
    with_cols<8>(C, [&](auto c) { dot_4rows_tile_c<T, decltype(c)::value>(row, stride, x, nb, out, ahead); });
}

// The same from four rows unpack_4rows has unpacked into u
template <int T>
static void dot_4rows_tile_unpacked(const typename Unpacked<T>::type* u, const Q8* x, int C, int64_t nb, float* out) {
    with_cols<8>(C, [&](auto c) { tile_unpacked<T, decltype(c)::value>(u, x, nb, out); });
}
