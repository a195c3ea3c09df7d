// F16 and BF16 weights (GGUF's types: rows of K 2-byte floats, as safetensors folders hold them too)
// times float32 activations: y[m][n] = W[n] . x[m] in float32 multiply-adds, the weights converted
// exactly (F16 by the variant's vload_half, BF16 by a 16-bit shift), the activations unrounded. The
// rows are read as stored on every route (no copy of the weights). Two ways, by the variant:
//
// Columns (where the variant has load_pairs16: LLMCLI_HALF_COLS, AVX-512): a vector's lanes are
// weight rows, and each (weight row, activation row) pair is one multiply-add chain over k in order
// (half_cols, below). A prompt multiplies tiles of rows transposed once into floats, as outer
// products (each weight vector against many activations, each activation broadcast against many
// rows: no sums across lanes, and a tenth of the bytes a multiply-add the pairs below read); decode
// transposes the rows in registers as it streams them.
//
// Pairs (the others): each pair sums a depth of K at a time (kHalfDepth) in one vector chain along
// k, reduced with reduce4 (the same tree for each of its four) into the pair's float, depth after
// depth, then the K % kVW tail in order:
// - few activation rows (decode): each weight row streamed from memory once, converted in registers
//   against all of them (memory-bound);
// - many (a prompt): a tile of weight rows converted to float32 once into a buffer, then micro-tiles of
//   4 weight rows x kFloatCols activation rows (the variant's, from its register count) from it,
//   the activations a block of rows at a time (compute-bound).
// Either way a value is the same whatever rows come with it, on every route.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "blocks.h"
#include "vec.h"

template <int T> static inline vf vload_w(const uint16_t* p) {
    if constexpr (T == kF16) return vload_half(p);
    else return vload_bf16(p);
}
template <int T> static inline vf vload_w(const float* p) { return vload(p); }  // a converted tile's
template <int T> static inline float w_at(const uint16_t* p) { return T == kF16 ? half_to_float(*p) : bf16_to_float(*p); }
template <int T> static inline float w_at(const float* p) { return *p; }

// Depths of K a chain runs before it is reduced into its pair's sum: [0, kv) in about equal parts
// of at most about kHalfDepth, whole vectors each (the numbers' order, the same on both routes: a
// tile keeps one float a pair between depths, not a vector)
constexpr int64_t kHalfDepth = 512;
static inline int64_t half_depth(int64_t kv) {
    const int64_t parts = std::max<int64_t>(1, (kv + kHalfDepth / 2) / kHalfDepth);
    return (kv / parts + kVW - 1) / kVW * kVW;
}

// Adds to s[c * lds + r] the products over k in [k0, k1) (multiples of kVW, k0 < k1) of R <= 4
// weight rows (ldw apart; 2-byte floats of type T, or floats) and C activation rows (ldx apart): one
// vector chain a pair in registers, reduce4'd
template <int T, int R, int C, typename E>
static inline void half_block(const E* w, int64_t ldw, const float* x, int64_t ldx, int64_t k0, int64_t k1, float* s,
                              int64_t lds) {
    vf acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = vset1(0.f);
    int64_t k = k0;
    do {
        vf wv[R];
        for (int r = 0; r < R; ++r) wv[r] = vload_w<T>(w + r * ldw + k);
        for (int c = 0; c < C; ++c) {
            const vf xv = vload(x + c * ldx + k);
            for (int r = 0; r < R; ++r) acc[r][c] = vfma(wv[r], xv, acc[r][c]);
        }
        k += kVW;
    } while (k < k1);
    for (int c = 0; c < C; ++c) {
        vf four[4];
        for (int r = 0; r < 4; ++r) four[r] = r < R ? acc[r][c] : vset1(0.f);
        float o[4];
        reduce4(four, o);
        for (int r = 0; r < R; ++r) s[c * lds + r] += o[r];
    }
}

// f(R, C) with R (4, or 1) and C (1..kFloatCols) as compile-time constants
template <typename F>
static inline void with_tile(int R, int C, F&& f) {
    const auto rows = [&](auto c) {
        if (R == 4) f(std::integral_constant<int, 4>(), c);
        else f(std::integral_constant<int, 1>(), c);
    };
    switch (C) {
        case 1: return rows(std::integral_constant<int, 1>());
        case 2: if constexpr (kFloatCols >= 2) return rows(std::integral_constant<int, 2>()); break;
        case 3: if constexpr (kFloatCols >= 3) return rows(std::integral_constant<int, 3>()); break;
        case 4: if constexpr (kFloatCols >= 4) return rows(std::integral_constant<int, 4>()); break;
        case 5: if constexpr (kFloatCols >= 5) return rows(std::integral_constant<int, 5>()); break;
        case 6: if constexpr (kFloatCols >= 6) return rows(std::integral_constant<int, 6>()); break;
        default: break;
    }
}
static_assert(kFloatCols >= 1 && kFloatCols <= 6, "with_tile takes up to 6 activation rows");

// half_block for rows [0, R) (4 at a time, then one by one) against C activation rows
template <int T, typename E>
static inline void half_blocks(int R, int C, const E* w, int64_t ldw, const float* x, int64_t ldx, int64_t k0,
                               int64_t k1, float* s, int64_t lds) {
    for (int r = 0; r < R;) {
        const int Rn = R - r >= 4 ? 4 : 1;
        with_tile(Rn, C, [&](auto rr, auto cc) {
            half_block<T, decltype(rr)::value, decltype(cc)::value>(w + r * ldw, ldw, x, ldx, k0, k1, s + r, lds);
        });
        r += Rn;
    }
}

// y[m * ldy + n] for n in [n0, n1), m < M: zero, then the tail's products [kv, K) added in order
// after the depths' (the last step of both routes)
template <int T>
static void half_tails(const uint16_t* w, int64_t K, int64_t kv, const float* X, int64_t ldx, int64_t M, float* y,
                       int64_t ldy, int64_t n0, int64_t n1) {
    if (kv == K) return;
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < n1; ++n) {
            float s = y[m * ldy + n];
            for (int64_t t = kv; t < K; ++t) s += w_at<T>(w + n * K + t) * X[m * ldx + t];
            y[m * ldy + n] = s;
        }
}

// Groups of 4 weight rows this many groups ahead are prefetched (as the block kernels fetch rows ahead)
constexpr int64_t kHalfAhead = 2;
// Up to this many activation rows, the weights are streamed (converted in registers); more, tiled
constexpr int64_t kHalfStreamRows = 2 * kFloatCols;
// A tile: this many weight rows, converted to floats a depth at a time (16 x about 512 floats, 32 KB:
// they stay in L1 while the micro-tiles go through them, a few activation rows at a time), against
// this many activation rows (in L2)
constexpr int64_t kHalfTileRows = 16, kHalfBlockRows = 96;

// Few activation rows: each group of 4 weight rows streamed once, converted in registers
template <int T>
static void half_rows_streamed(const uint16_t* w, int64_t K, int64_t kv, const float* X, int64_t ldx, int64_t M,
                               float* y, int64_t ldy, int64_t n0, int64_t n1) {
    const int64_t depth = half_depth(kv);
    for (int64_t n = n0; n < n1; n += 4) {
        const int R = (int)std::min<int64_t>(4, n1 - n);
        if (n + 4 * kHalfAhead < n1) {
            const auto* ahead = reinterpret_cast<const uint8_t*>(w + (n + 4 * kHalfAhead) * K);
            for (int64_t b = 0; b < std::min<int64_t>(4, n1 - n - 4 * kHalfAhead) * K * 2; b += 64) __builtin_prefetch(ahead + b);
        }
        for (int64_t m = 0; m < M; m += kFloatCols)
            for (int64_t k0 = 0; k0 < kv; k0 += depth)
                half_blocks<T>(R, (int)std::min<int64_t>(kFloatCols, M - m), w + n * K, K, X + m * ldx, ldx, k0,
                               std::min(kv, k0 + depth), y + m * ldy + n, ldy);
    }
}

// Many: a tile of weight rows converted to floats a depth at a time, against a block of activation
// rows micro-tile by micro-tile, each pair's sum kept (in `sums`, in L1) between depths
template <int T>
static void half_rows_tiled(const uint16_t* w, int64_t K, int64_t kv, const float* X, int64_t ldx, int64_t M,
                            float* y, int64_t ldy, int64_t n0, int64_t n1) {
    static thread_local std::vector<float> tile;
    const int64_t most = half_depth(kv);
    tile.resize(kHalfTileRows * most);
    float sums[kHalfBlockRows * kHalfTileRows];  // (activation row, weight row) of the tile
    for (int64_t mb = 0; mb < M; mb += kHalfBlockRows) {
        const int64_t Mb = std::min(kHalfBlockRows, M - mb);
        for (int64_t nt = n0; nt < n1; nt += kHalfTileRows) {
            const int64_t rows = std::min(kHalfTileRows, n1 - nt);
            std::fill(sums, sums + Mb * kHalfTileRows, 0.f);
            for (int64_t k0 = 0; k0 < kv; k0 += most) {
                const int64_t depth = std::min(most, kv - k0);
                for (int64_t r = 0; r < rows; ++r)  // rows' [k0, k0 + depth) as floats, `depth` apart
                    for (int64_t k = 0; k < depth; k += kVW)
                        vstore(tile.data() + r * depth + k, vload_w<T>(w + (nt + r) * K + k0 + k));
                for (int64_t m = 0; m < Mb; m += kFloatCols)
                    half_blocks<T>((int)rows, (int)std::min<int64_t>(kFloatCols, Mb - m), tile.data(), depth,
                                   X + (mb + m) * ldx + k0, ldx, 0, depth, sums + m * kHalfTileRows, kHalfTileRows);
            }
            for (int64_t m = 0; m < Mb; ++m)
                std::copy(sums + m * kHalfTileRows, sums + m * kHalfTileRows + rows, y + (mb + m) * ldy + nt);
        }
    }
}

#ifdef LLMCLI_HALF_COLS
// Columns (AVX-512: the variant's load_pairs16, pair_first and pair_second): a vector's lanes are kVW
// weight rows, and each (weight row, activation row) pair is one float32 multiply-add chain over k in
// order, 0 to K - 1. A prompt: tiles of rows (one or two vectors of them) x a depth of K, transposed
// and converted once into `tile` ([k][kVW] floats a vector of rows), multiplied with each activation
// row's x[k] broadcast (outer products: no sums across lanes, and a tenth of the bytes a multiply-add
// that the pairs' vectors above read), the chains going on from depth to depth through y. Decode (a
// few activation rows): each vector of rows transposed in registers 32 elements at a time as it
// streams, the chains in registers through all of K. The same multiply-adds in the same order either
// way: a value is the same whatever rows come with it.
// A prompt's depths: [0, kv) in about equal parts of about this many, multiples of 32 (a tile of 2 x 16
// rows x 384 floats, 48 KB; 256 to 768 did about as well, the parts' equal sizes a little better)
constexpr int64_t kColsDepth = 384;
static inline int64_t cols_depth(int64_t kv) {
    const int64_t parts = std::max<int64_t>(1, (kv + kColsDepth / 2) / kColsDepth);
    return (kv / parts + 31) / 32 * 32;
}
constexpr int kColsAct = 12;        // activation rows a micro-tile takes: 2 x 12 sums in registers
// Decode fetches each row this many elements ahead of its loads (384 bytes): the hardware's
// prefetchers alone left 16 rows streamed at once at 0.5-0.7x of the speed of the same reads without
// the arithmetic; 0.95x with this (256 to 512 bytes about as well; 128, 1024 or more less)
constexpr int64_t kColsAhead = 192;

// Rows [0, rows) (rows <= kVW, K apart), elements [k0, k0 + depth) (a multiple of 32) -> tile[k][kVW]
template <int T>
static void cols_pack(const uint16_t* w, int64_t K, int rows, int64_t k0, int64_t depth, float* tile) {
    for (int64_t k = 0; k < depth; k += 32) {
        vpairs p[16];
        load_pairs16(w, K, rows, k0 + k, p);
        for (int j = 0; j < 16; ++j) {
            vstore(tile + (k + 2 * j) * kVW, pair_first<T == kF16>(p[j]));
            vstore(tile + (k + 2 * j + 1) * kVW, pair_second<T == kF16>(p[j]));
        }
    }
}

// A few activation rows (decode): kVW rows (the first `rows`, K apart) x C activation rows over
// [0, kv), transposed in registers 32 elements at a time, no tile (the chains as cols_tile's)
template <int T, int C>
static inline void cols_stream(const uint16_t* w, int64_t K, int rows, int64_t kv, const float* x, int64_t ldx, float* y,
                               int64_t ldy) {
    vf acc[C];
    for (int c = 0; c < C; ++c) acc[c] = vset1(0.f);
    for (int64_t k = 0; k < kv; k += 32) {
        // (near the rows' ends, the next kVW rows' beginnings: short rows came from memory unfetched)
        // (addresses as integers: past the last rows they point beyond the weights, never read)
        const int64_t at = k + kColsAhead < kv ? k + kColsAhead : kVW * K + k + kColsAhead - kv;
        const uintptr_t ahead = reinterpret_cast<uintptr_t>(w) + 2 * at;
        for (int r = 0; r < kVW; ++r) __builtin_prefetch(reinterpret_cast<const void*>(ahead + 2 * r * K));
        vpairs p[16];
        load_pairs16(w, K, rows, k, p);
        for (int j = 0; j < 16; ++j) {
            const vf a = pair_first<T == kF16>(p[j]), b = pair_second<T == kF16>(p[j]);
            const float* xk = x + k + 2 * j;
#pragma GCC unroll 12
            for (int c = 0; c < C; ++c) acc[c] = vfma(a, vset1(xk[c * ldx]), acc[c]);
#pragma GCC unroll 12
            for (int c = 0; c < C; ++c) acc[c] = vfma(b, vset1(xk[c * ldx + 1]), acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) vstoren(y + c * ldy, acc[c], rows);
}

// V vectors of rows (tile + v * kVW * depth) x C activation rows (x, ldx apart, from the depth's first
// element): the chains in y (ldy apart) go on over the depth. (The sums in one flat array, the loop
// over them unrolled: as acc[C][V], GCC kept a copy of them on the stack at every k when V was 1.)
template <int V, int C>
static inline void cols_tile(const float* tile, int64_t depth, const float* x, int64_t ldx, float* y, int64_t ldy) {
    vf acc[C * V];
    for (int i = 0; i < C * V; ++i) acc[i] = vload(y + i / V * ldy + i % V * kVW);
    for (int64_t k = 0; k < depth; ++k) {
        const float *t = tile + k * kVW, *xk = x + k;
#pragma GCC unroll 24
        for (int i = 0; i < C * V; ++i) acc[i] = vfma(vload(t + i % V * kVW * depth), vset1(xk[i / V * ldx]), acc[i]);
    }
    for (int i = 0; i < C * V; ++i) vstore(y + i / V * ldy + i % V * kVW, acc[i]);
}

// f(V, C) as compile-time constants, V in {1, 2}, C in [1, kColsAct]
template <typename F>
static inline void with_cols_tile(int V, int C, F&& f) {
    const auto rows = [&](auto c) {
        if (V == 2) f(std::integral_constant<int, 2>(), c);
        else f(std::integral_constant<int, 1>(), c);
    };
    switch (C) {
        case 1: return rows(std::integral_constant<int, 1>());
        case 2: return rows(std::integral_constant<int, 2>());
        case 3: return rows(std::integral_constant<int, 3>());
        case 4: return rows(std::integral_constant<int, 4>());
        case 5: return rows(std::integral_constant<int, 5>());
        case 6: return rows(std::integral_constant<int, 6>());
        case 7: return rows(std::integral_constant<int, 7>());
        case 8: return rows(std::integral_constant<int, 8>());
        case 9: return rows(std::integral_constant<int, 9>());
        case 10: return rows(std::integral_constant<int, 10>());
        case 11: return rows(std::integral_constant<int, 11>());
        default: return rows(std::integral_constant<int, 12>());
    }
}
static_assert(kColsAct == 12, "with_cols_tile takes up to 12 activation rows");

// y's pairs (zeros, or chains begun) over [0, kv) (kv a multiple of 32), then the tail [kv, K) in order
template <int T>
static void half_cols(const uint16_t* w, int64_t K, const float* X, int64_t ldx, int64_t M, float* y, int64_t ldy,
                      int64_t n0, int64_t n1) {
    static thread_local std::vector<float> buffer;
    const int64_t kv = K / 32 * 32, most = cols_depth(kv);
    buffer.resize(2 * kVW * most);
    float* tile = buffer.data();
    // rows [nt, nt + 2 kVW) (those below n1) x [k0, k0 + depth) x every activation row
    const auto tiles = [&](int64_t nt, int64_t k0, int64_t depth) {
        const int64_t rows = std::min<int64_t>(2 * kVW, n1 - nt);
        const int V = rows > kVW ? 2 : 1, last = (int)(rows - (V - 1) * kVW);
        for (int v = 0; v < V; ++v) cols_pack<T>(w + (nt + v * kVW) * K, K, v < V - 1 ? kVW : last, k0, depth, tile + v * kVW * depth);
        for (int64_t m = 0, C; m < M; m += C) {
            const int64_t blocks = (M - m + kColsAct - 1) / kColsAct;  // (13 rows as 7 + 6, not 12 + 1)
            C = (M - m + blocks - 1) / blocks;
            float* to = y + m * ldy + nt;
            int64_t ld = ldy;
            alignas(64) float part[kColsAct * 2 * kVW];  // a last vector of fewer rows: its sums through here
            if (last < kVW) {
                std::fill(part, part + C * 2 * kVW, 0.f);
                for (int c = 0; c < C; ++c) std::copy(to + c * ldy, to + c * ldy + rows, part + c * 2 * kVW);
                to = part, ld = 2 * kVW;
            }
            with_cols_tile(V, (int)C, [&](auto vv, auto cc) {
                cols_tile<decltype(vv)::value, decltype(cc)::value>(tile, depth, X + m * ldx + k0, ldx, to, ld);
            });
            if (last < kVW)
                for (int c = 0; c < C; ++c) std::copy(part + c * 2 * kVW, part + c * 2 * kVW + rows, y + (m + c) * ldy + nt);
        }
    };
    if (M <= kColsAct && kv > 0) {  // each vector of rows through all of K, transposed in registers
        for (int64_t n = n0; n < n1; n += kVW)
            with_cols_tile(1, (int)M, [&](auto, auto cc) {
                cols_stream<T, decltype(cc)::value>(w + n * K, K, (int)std::min<int64_t>(kVW, n1 - n), kv, X, ldx, y + n, ldy);
            });
    } else {  // each depth of the activations through every tile
        for (int64_t k0 = 0; k0 < kv; k0 += most)
            for (int64_t nt = n0; nt < n1; nt += 2 * kVW) tiles(nt, k0, std::min(most, kv - k0));
    }
    if (kv < K)
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = n0; n < n1; ++n) {
                float s = y[m * ldy + n];
                for (int64_t t = kv; t < K; ++t) s = std::fma(w_at<T>(w + n * K + t), X[m * ldx + t], s);
                y[m * ldy + n] = s;
            }
}
#endif

// y[m * ldy + n] = row n of W (rows of K 2-byte floats of type T) . row m of X (M rows, ldx apart),
// for n in [n0, n1) and m in [0, M)
template <int T>
static void half_rows(const uint8_t* W, int64_t K, const float* X, int64_t ldx, int64_t M, float* y, int64_t ldy,
                      int64_t n0, int64_t n1) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(W);
    const int64_t kv = K / kVW * kVW;
    for (int64_t m = 0; m < M; ++m) std::fill(y + m * ldy + n0, y + m * ldy + n1, 0.f);
#ifdef LLMCLI_HALF_COLS
    return half_cols<T>(w, K, X, ldx, M, y, ldy, n0, n1);
#endif
    if (M <= kHalfStreamRows) half_rows_streamed<T>(w, K, kv, X, ldx, M, y, ldy, n0, n1);
    else half_rows_tiled<T>(w, K, kv, X, ldx, M, y, ldy, n0, n1);
    half_tails<T>(w, K, kv, X, ldx, M, y, ldy, n0, n1);
}

// n rows of K 2-byte floats of type T -> floats (dequantization, the embedding lookup)
template <int T>
static void half_rows_to_floats(const uint8_t* W, int64_t count, float* y) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(W);
    int64_t i = 0;
    for (; i + kVW <= count; i += kVW) vstore(y + i, vload_w<T>(w + i));
    for (; i < count; ++i) y[i] = w_at<T>(w + i);
}
