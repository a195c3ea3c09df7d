// AVX-512 VNNI tiles (included at the end of dot_avx512.h, whose one-row kernels they mirror).
#pragma once

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

template <int T, int C>
static void nibble_tile(const uint8_t* row, int64_t stride, const Q8* x, int64_t nb, float* out, const uint8_t* ahead) {
    constexpr int bytes = Block<T>::bytes;
    __m512 accs[C][4], offs[C][4];
    for (int r = 0; r < 4; ++r) {
        const uint8_t* w = row + r * stride;
        __m512 acc[C], off[C];
        for (int c = 0; c < C; ++c) acc[c] = off[c] = _mm512_setzero_ps();
        nibble_groups<bytes>(
            w, stride, nb,
            [&](const uint8_t* const* p, int64_t g, int) __attribute__((always_inline)) {
                fetch_ahead(ahead, r * stride + 8 * g * bytes);  // 8 blocks: at most 192 bytes
                fetch_ahead(ahead, r * stride + 8 * g * bytes + 128);
                __m512i v[4];
                __m512 wd, wdm;
                nibble_unpack<T>(p, v, wd, wdm);
#pragma GCC unroll 8
                for (int c = 0; c < C; ++c) nibble_dot<T>(v, wd, wdm, x[c], g, acc[c], off[c]);
            },
            [&](const uint8_t* const* p, int64_t g, int) __attribute__((always_inline)) {
                fetch_ahead(ahead, r * stride + 8 * g * bytes);
                __m512i lo, hi;
                __m512 wd, wdm;
                nibble_quad_unpack<T>(p, lo, hi, wd, wdm);
#pragma GCC unroll 8
                for (int c = 0; c < C; ++c) nibble_quad_dot<T>(lo, hi, wd, wdm, x[c], g, acc[c], off[c]);
            });
        for (int c = 0; c < C; ++c) { accs[c][r] = acc[c]; offs[c][r] = off[c]; }
    }
    for (int c = 0; c < C; ++c) nibble_sums<T, 4>(accs[c], offs[c], out + 4 * c);
}

template <int C>
static void q8_0_tile(const uint8_t* row, int64_t stride, const Q8* x, int64_t nb, float* out, const uint8_t* ahead) {
    constexpr int bytes = Block<kQ8_0>::bytes;
    const __m512i lo2 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i hi2 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    __m512 accs[C][4];
    for (int r = 0; r < 4; ++r) {
        const uint8_t* w = row + r * stride;
        __m512 acc[C];
        for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
        for (int64_t k = 0; k < nb; k += 4) {
            const uint8_t* b = w + k * bytes;
            const uint8_t* p[4] = {b, b + bytes, b + 2 * bytes, b + 3 * bytes};
            if (k + 4 > nb) group_of<bytes>(w, k, nb, p);
            fetch_ahead(ahead, r * stride + k * bytes);  // 4 blocks: 136 bytes
            fetch_ahead(ahead, r * stride + k * bytes + 128);
            const __m512i c01 = q8_0_codes2(p[0], p[1]), c23 = q8_0_codes2(p[2], p[3]);
            __m512 w01, w23;
            q8_0_scales(p, lo2, hi2, w01, w23);
            for (int c = 0; c < C; ++c) {
                const __m512i p01 = _mm512_dpbusd_epi32(load512(x[c].z8 + 8 * k), c01, load512(x[c].q + 32 * k));
                const __m512i p23 = _mm512_dpbusd_epi32(load512(x[c].z8 + 8 * k + 16), c23, load512(x[c].q + 32 * k + 64));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p01), _mm512_mul_ps(w01, _mm512_loadu_ps(x[c].d8 + 8 * k)), acc[c]);
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p23), _mm512_mul_ps(w23, _mm512_loadu_ps(x[c].d8 + 8 * k + 16)), acc[c]);
            }
        }
        for (int c = 0; c < C; ++c) accs[c][r] = acc[c];
    }
    for (int c = 0; c < C; ++c) reduce_rows<4>(accs[c], out + 4 * c);
}

// kblock_rows for four weight rows against C activation rows, K in chunks of kChunk blocks taken by all
// four rows before the next chunk, so the C rows' activations stay in L1 for the four (8 rows of a K
// of 4864, ffn_down's, did not fit). Each pair's sums go on in k's order, as kblock_rows has them.
template <typename B, int C>
static void kblock_tile(const uint8_t* row, int64_t stride, const Q8* x, int64_t nb, float* out, const uint8_t* ahead) {
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
                fetch_ahead(ahead, r * stride + k * B::bytes);
                fetch_ahead(ahead, r * stride + k * B::bytes + 128);
                const B w(row + r * stride + k * B::bytes);
#pragma GCC unroll 8  // the accumulators in registers (gcc kept a loop's in memory)
                for (int c = 0; c < C; ++c) w.dot(x[c], k, acc[c], off[c]);
            }
            for (int c = 0; c < C; ++c) { accs[r][c] = acc[c]; offs[r][c] = off[c]; }
        }
    }
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < C; ++c) out[4 * c + r] = kblock_sum(accs[r][c], offs[r][c]);
}

template <int T, int C>
static void dot_4rows_tile_c(const uint8_t* row, int64_t stride, const Q8* x, int64_t nb, float* out, const uint8_t* ahead) {
    if constexpr (T == kQ8_0) q8_0_tile<C>(row, stride, x, nb, out, ahead);
    else if constexpr (T == kQ6_K) kblock_tile<Q6KBlock, C>(row, stride, x, nb, out, ahead);
    else if constexpr (T == kQ4_K) kblock_tile<Q4KBlock, C>(row, stride, x, nb, out, ahead);
    else nibble_tile<T, C>(row, stride, x, nb, out, ahead);
}

// Four weight rows against C <= tile_width<T> activation rows; `ahead`: the rows to fetch meanwhile (or null)
template <int T>
static void dot_4rows_tile(const uint8_t* row, int64_t stride, const Q8* x, int C, int64_t nb, float* out,
                           const uint8_t* ahead) {
    switch (C) {
        case 1: dot_4rows_tile_c<T, 1>(row, stride, x, nb, out, ahead); break;
        case 2: dot_4rows_tile_c<T, 2>(row, stride, x, nb, out, ahead); break;
        case 3: dot_4rows_tile_c<T, 3>(row, stride, x, nb, out, ahead); break;
        case 4: dot_4rows_tile_c<T, 4>(row, stride, x, nb, out, ahead); break;
        default:
            if constexpr (tile_width<T> >= 8) {
                switch (C) {
                    case 5: dot_4rows_tile_c<T, 5>(row, stride, x, nb, out, ahead); break;
                    case 6: dot_4rows_tile_c<T, 6>(row, stride, x, nb, out, ahead); break;
                    case 7: dot_4rows_tile_c<T, 7>(row, stride, x, nb, out, ahead); break;
                    default: dot_4rows_tile_c<T, 8>(row, stride, x, nb, out, ahead); break;
                }
            }
    }
}
