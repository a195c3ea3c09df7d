// GGUF blocks: y = x @ W.T read from the blocks, and dequantization of rows.
//
// Every type but Q5_K takes llama.cpp's route: the activations are quantized to int8 per block of 32
// (blocks.h's Q8), and each block's dot product is integer multiply-adds of the variant (dot.h),
// scaled once per block. Q5_K takes the float route: each weight block dequantized once into a
// register-sized buffer and dotted with every activation row. Either way the weights are read once.
// F16 and BF16 rows take float32 activations as they are (half_rows.h), never int8 ones. Refined
// activations (int8x2, kernels.h's Q8Rows::refined) are two int8 rows a row of x through the same
// kernels, whose values Out adds up.
// Where the variant has row-group kernels (AVX-512: 16 rows, arch/x86/avx512_rows16.h; AVX2 and AVX-VNNI:
// 8 rows, arch/x86/avx2_rows8.h), a decode step reads a copy of the weights interleaved for them
// (row_groups.h), Q5_K included, and llmcli_mm takes Q5_K so too.
#include "api.h"
#include "dot.h"
#include "half_rows.h"
#include "kernels.h"
#include "vec.h"

void Q8Rows::quantize_blocks(const float* x, int64_t m, int64_t b0, int64_t b1) {
    const int64_t nb = K / 32;
    if (!refined) {
        for (int64_t i = m * nb + b0; i < m * nb + b1; ++i)
            quantize_block(x + 32 * i, q.data() + 32 * i, d[i], s[i], n4.data() + 8 * i);
        return;
    }
    const float* xm = x + m * K;
    const int64_t c = 2 * m * nb, r = c + nb;  // the high bytes' first block, the low ones' (quantize_pair_scalar)
    for (int64_t b = b0; b < b1; ++b) {
        float dd[2], ss[2];
        quantize_pair(xm + 32 * b, q.data() + 32 * (c + b), q.data() + 32 * (r + b), dd, ss, n4.data() + 8 * (c + b),
                      n4.data() + 8 * (r + b));
        d[c + b] = dd[0], d[r + b] = dd[1], s[c + b] = ss[0], s[r + b] = ss[1];
    }
}

void Q8Rows::quantize(const float* x, int64_t m0, int64_t m1, unsigned layouts) {
    const int64_t nb = K / 32;
#ifdef LLMCLI_GROUPED
    if (layouts == kColsLayout && m1 == m0 + 1) return quantize_to_cols(x, m0);
#endif
    for (int64_t m = m0; m < m1; ++m) quantize_blocks(x, m, 0, nb);
    if (layouts & kColsLayout) to_cols(m0, m1);
#ifdef LLMCLI_ORDERS
    for (int64_t m = m0 * per_row(); m < m1 * per_row(); ++m) {
        const Q8 x = row(m);
        if (layouts & kNibbleLayout)
            nibble_order(x, nb, const_cast<int8_t*>(x.qi), const_cast<int32_t*>(x.ni), const_cast<float*>(x.ds),
                         const_cast<float*>(x.d16));
        if (layouts & kQ8_0Layout) q8_0_order(x, nb, const_cast<int8_t*>(x.qq), const_cast<int32_t*>(x.zq), const_cast<float*>(x.dq));
        if (K % 256 == 0 && (layouts & kQ4KLayout)) q4k_order(x, nb, const_cast<int8_t*>(x.qk), const_cast<float*>(x.d2));
        if (K % 256 == 0 && (layouts & kQ6KLayout))
            q6k_order(x, nb, const_cast<int8_t*>(x.q6), const_cast<int32_t*>(x.z6), const_cast<float*>(x.d6));
    }
#endif
}

#ifdef LLMCLI_GROUPED
// Each block quantized into a buffer in L1 and put in its column at once: one pass (the rows, then
// to_cols, took two, and to_cols alone cost more than the quantization)
void Q8Rows::quantize_to_cols(const float* x, int64_t m) {
    const int64_t nb = K / 32;
    const int per = (int)per_row();
    const Q8Cols g[2] = {cols(per * m), cols(per * m + per - 1)};  // (one row: the same column twice)
    alignas(32) int8_t codes[2][32];
    int32_t n4s[2][8];
    for (int64_t b = 0; b < nb; ++b) {
        float dd[2], ss[2];
        if (refined) quantize_pair(x + m * K + 32 * b, codes[0], codes[1], dd, ss, n4s[0], n4s[1]);
        else quantize_block(x + m * K + 32 * b, codes[0], dd[0], ss[0], n4s[0]);
        for (int k = 0; k < per; ++k) {
            block_to_col(codes[k], n4s[k], const_cast<int8_t*>(g[k].q) + 32 * kColGroup * b,
                         const_cast<int32_t*>(g[k].n32) + kColGroup * b, const_cast<int32_t*>(g[k].n16) + 2 * kColGroup * b);
            const_cast<float*>(g[k].d)[kColGroup * b] = dd[k];
            const_cast<float*>(g[k].s)[kColGroup * b] = ss[k];
        }
    }
}
#endif

void Q8Rows::to_cols(int64_t m0, int64_t m1) {
#ifdef LLMCLI_GROUPED
    const int64_t nb = K / 32;
    m0 *= per_row(), m1 *= per_row();  // (stored rows from here)
    for (int64_t g0 = m0; g0 < m1; g0 += kColGroup) {
        const int n = (int)std::min<int64_t>(kColGroup, m1 - g0);
        const Q8Cols g = cols(g0);
        const int8_t* codes = q.data() + g0 * K;
        const int32_t* sums = n4.data() + g0 * K / 4;
        for (int64_t b = 0; b < nb; ++b) {
            int8_t* to = const_cast<int8_t*>(g.q) + 32 * kColGroup * b;
            int32_t *n32 = const_cast<int32_t*>(g.n32) + kColGroup * b, *n16 = const_cast<int32_t*>(g.n16) + 2 * kColGroup * b;
            if (n <= 2)  // (one token: one row, or two refined)
                for (int c = 0; c < n; ++c)
                    block_to_col(codes + c * K + 32 * b, sums + c * K / 4 + 8 * b, to + 4 * c, n32 + c, n16 + c);
            else block_to_cols(codes + 32 * b, K, n, to, n32, n16);
        }
        // each row's d and s to its column (through locals: stores through the columns' pointers
        // made the compiler load the vectors' data pointers again for every value, a third of this)
        float *to_d = const_cast<float*>(g.d), *to_s = const_cast<float*>(g.s);
        for (int c = 0; c < n; ++c) {
            const float *dc = d.data() + (g0 + c) * nb, *sc = s.data() + (g0 + c) * nb;
            for (int64_t b = 0; b < nb; ++b) {
                to_d[kColGroup * b + c] = dc[b];
                to_s[kColGroup * b + c] = sc[b];
            }
        }
    }
#else
    (void)m0; (void)m1;
#endif
}

static inline void prefetch(const uint8_t* p, int64_t bytes) {
    for (int64_t c = 0; c < bytes; c += 64) __builtin_prefetch(p + c);
}

// Rows are prefetched this many rows ahead: without it a one-thread step waited on memory, and 8 to
// 32 rows ahead did no better than 4
constexpr int64_t kAhead = 4;

constexpr int64_t kRowsAtOnce = 64;  // activation rows whose views (Q8) a call keeps at hand

// Where the value of stored activation row m (counted from the call's first) and weight row n goes:
// y[m * ldy + n], or for refined rows (Q8Rows::refined) the sum of a pair's, into its row of x: the
// even row's value put, then the odd one's added (every loop below meets a pair's rows in that order)
struct Out {
    float* y;
    int64_t ldy;
    bool pairs;
    void put(int64_t m, int64_t n, float v) const {
        if (!pairs) y[m * ldy + n] = v;
        else if (m & 1) y[(m >> 1) * ldy + n] += v;
        else y[(m >> 1) * ldy + n] = v;
    }
    // a pair's value whole (the row-group kernels add its two rows' sums themselves), m its even row
    void put_pair(int64_t m, int64_t n, float v) const { y[(m >> 1) * ldy + n] = v; }
};

#ifdef LLMCLI_TILES
// Four weight rows n.. against activation rows xs[0..Mb), Mb > 1, into y's rows m_at.., a tile at a
// time: each weight block unpacked once for the tile, or, for several tiles, once for all of them into
// a buffer (unpack_4rows); the first tile, or the unpacking, fetches the next rows (`ahead`) as it
// goes. Not inlined into dot_rows: there its buffer and lambdas slowed the one-row loop (Q4_K, Q6_K).
template <int T>
__attribute__((noinline)) static void tile_rows(const uint8_t* row, int64_t rb, int64_t nb, const Q8* xs, int64_t Mb,
                                                const Out& y, int64_t m_at, int64_t n, const uint8_t* ahead) {
    int64_t m = 0;
    const auto tiles = [&](auto&& tile) {
        for (; m < Mb;) {
            const int c = (int)std::min<int64_t>(tile_width<T>, Mb - m);
            float o[4 * 8];
            tile(c, o);
            for (int i = 0; i < c; ++i)
                for (int t = 0; t < 4; ++t) y.put(m_at + m + i, n + t, o[4 * i + t]);
            m += c;
        }
    };
    if constexpr (unpacked_tiles<T>) {
        if (Mb > tile_width<T>) {
            static thread_local std::vector<typename Unpacked<T>::type> unpacked;
            unpacked.resize(unpacked_count<T>(nb));
            unpack_4rows<T>(row, rb, nb, unpacked.data(), ahead);
            tiles([&](int c, float* o) { dot_4rows_tile_unpacked<T>(unpacked.data(), xs + m, c, nb, o); });
        }
    }
    tiles([&](int c, float* o) { dot_4rows_tile<T>(row, rb, xs + m, c, nb, o, m == 0 ? ahead : nullptr); });
}
#endif

// W's rows [n0, n1) against stored activation rows [m0, m0 + M)
template <int T>
static void dot_rows(const uint8_t* W, int64_t K, const Q8Rows& xq, int64_t m0, int64_t M, const Out& y,
                     int64_t n0, int64_t n1, bool alone) {
    const int64_t nb = K / 32, rb = K / Block<T>::size * Block<T>::bytes;
    for (int64_t mb = 0; mb < M; mb += kRowsAtOnce) {  // (more only from llmcli_mm: the weights are read again)
        const int64_t Mb = std::min(kRowsAtOnce, M - mb);
        Q8 xs[kRowsAtOnce];
        for (int64_t m = 0; m < Mb; ++m) xs[m] = xq.row(m0 + mb + m);
        int64_t n = n0;
#ifdef LLMCLI_DOT_4ROWS
        for (; n + 4 <= n1; n += 4) {  // four weight rows at a time, for each activation row
            const uint8_t* row = W + n * rb;
            int64_t m = 0;
#ifdef LLMCLI_TILES
            if (Mb > 1) {
                tile_rows<T>(row, rb, nb, xs, Mb, y, mb, n, n + 4 < n1 ? row + 4 * rb : nullptr);
                m = Mb;
            }
#endif
            if (m < Mb) prefetch(row + kAhead * rb, 4 * rb);
            for (; m < Mb; ++m) {
                float o[4];
                dot_4rows<T>(row, rb, xs[m], nb, o);
                for (int t = 0; t < 4; ++t) y.put(mb + m, n + t, o[t]);
            }
        }
#endif
        for (; n < n1; ++n) {
            const uint8_t* row = W + n * rb;
            prefetch(row + kAhead * rb, rb);
            int64_t m = 0;
#ifdef LLMCLI_DOT_ROWS4
            for (; !alone && m + 4 <= Mb; m += 4) {  // sums in another order than dot_row's
                float o[4];
                dot_rows4<T>(row, xs + m, nb, o);
                for (int t = 0; t < 4; ++t) y.put(mb + m + t, n, o[t]);
            }
#endif
            for (; m < Mb; ++m) y.put(mb + m, n, dot_row<T>(row, xs[m], nb));
        }
    }
}

#ifdef LLMCLI_GROUPED
// interleave_groups' copy W of rows [n0, n1) (whole groups of kGroupRows) against activation rows
// m0.., kGroupCols at a time (within one of xq's column groups); many rows (a prompt's) kRowsAtOnce
// at a time, each group's weights read once for them from L2 while their activations stay there
// (all the rows against each group in turn streamed the activations again for every group, which
// slowed a long prompt)
template <int T>
static void grouped_dot(const uint8_t* W, int64_t K, const Q8Rows& xq, int64_t m0, int64_t M, const Out& y,
                        int64_t n0, int64_t n1) {
    constexpr int R = kGroupRows;
    static_assert(kColGroup % kGroupCols == 0, "a tile's columns lie in one column group");
    const int64_t nb = K / 32, group = group_bytes<T, R>(nb);
    float o[R * kGroupCols];
    for (int64_t mb = 0; mb < M; mb += kRowsAtOnce)
        for (int64_t n = n0; n < n1; n += R)
            for (int64_t m = mb, C; m < std::min(M, mb + kRowsAtOnce); m += C) {
                C = std::min<int64_t>({kGroupCols - (m0 + m) % kGroupCols, M - m, mb + kRowsAtOnce - m});
                const uint8_t* ahead = m == mb && n + R < n1 ? W + (n / R + 1) * group : nullptr;
                with_cols<kGroupCols>((int)C, [&](auto c) {
                    constexpr int cols = decltype(c)::value;
                    if constexpr (cols % 2 == 0)  // (a refined call's tiles hold whole pairs: m0, m and C even)
                        if (y.pairs) return group_tile<T, cols, true>(W + n / R * group, nb, xq.cols(m0 + m), o, ahead);
                    group_tile<T, cols>(W + n / R * group, nb, xq.cols(m0 + m), o, ahead);
                });
                if (y.pairs)
                    for (int64_t c = 0; c < C / 2; ++c)
                        for (int r = 0; r < R; ++r) y.put_pair(m + 2 * c, n + r, o[R * c + r]);
                else
                    for (int64_t c = 0; c < C; ++c)
                        for (int r = 0; r < R; ++r) y.put(m + c, n + r, o[R * c + r]);
            }
}
#endif

int group_rows() {
#ifdef LLMCLI_GROUPED
    return kGroupRows;
#else
    return 0;
#endif
}

bool grouped_takes(int type, int64_t N) {
    bool takes = false;
#ifdef LLMCLI_GROUPED
    with_type(type, [&](auto t) { takes = grouped_type<decltype(t)::value> && N % kGroupRows == 0; });
#endif
    return takes && N > 0;
}

int64_t grouped_bytes(int type, int64_t N, int64_t K) {
    int64_t bytes = 0;
#ifdef LLMCLI_GROUPED
    with_type(type, [&](auto t) {
        constexpr int T = decltype(t)::value;
        if constexpr (grouped_type<T>) bytes = N / kGroupRows * group_bytes<T, kGroupRows>(K / 32);
    });
#else
    (void)type, (void)N, (void)K;
#endif
    return bytes;
}

void interleave_groups(int type, const uint8_t* W, int64_t N, int64_t K, uint8_t* out, int64_t g0, int64_t g1,
                       const int64_t* order) {
#ifdef LLMCLI_GROUPED
    constexpr int R = kGroupRows;
    with_type(type, [&](auto t) {
        constexpr int T = decltype(t)::value;
        if constexpr (grouped_type<T>) {
            const int64_t nb = K / 32, rb = K / Block<T>::size * Block<T>::bytes;
            for (int64_t n = R * g0; n < (g1 < 0 ? N : R * g1); n += R) {
                const uint8_t* rows[R];
                for (int r = 0; r < R; ++r) rows[r] = W + (order ? order[n + r] : n + r) * rb;
                interleave_group<T, R>(rows, nb, out + n / R * group_bytes<T, R>(nb));
            }
        }
    });
#else
    (void)type, (void)W, (void)N, (void)K, (void)out, (void)g0, (void)g1, (void)order;
#endif
}

template <int T>
static void float_rows(const uint8_t* W, int64_t K, const float* X, int64_t M, float* y, int64_t ldy, int64_t n0, int64_t n1) {
    using Bk = Block<T>;
    const int64_t nb = K / Bk::size, rb = nb * Bk::bytes;
    alignas(64) float buf[256];
    std::vector<float> acc(M);
    for (int64_t n = n0; n < n1; ++n) {
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t k = 0; k < nb; ++k) {
            Bk::deq(W + n * rb + k * Bk::bytes, buf);
            for (int64_t m = 0; m < M; ++m) acc[m] += dot_f32(buf, X + m * K + k * Bk::size, Bk::size);
        }
        for (int64_t m = 0; m < M; ++m) y[m * ldy + n] = acc[m];
    }
}

void project(int type, const uint8_t* W, int64_t K, const Q8Rows& xq, const float* xf, int64_t m0, int64_t M,
             float* y, int64_t ldy, int64_t n0, int64_t n1, bool alone, bool grouped) {
    const int64_t per = xq.per_row();  // the integer routes read per stored rows a row of x
    const Out out{y, ldy, per == 2};
    with_type(type, [&](auto t) {
        constexpr int T = decltype(t)::value;
#ifdef LLMCLI_GROUPED
        if constexpr (grouped_type<T>)
            if (grouped) return grouped_dot<T>(W, K, xq, per * m0, per * M, out, n0, n1);
#endif
        if constexpr (float_type<T>) half_rows<T>(W, K, xf + m0 * K, K, M, y, ldy, n0, n1);
        else if constexpr (T == kQ5_K) float_rows<T>(W, K, xf + m0 * K, M, y, ldy, n0, n1);
        else dot_rows<T>(W, K, xq, per * m0, per * M, out, n0, n1, alone);
    });
}

std::shared_ptr<Team> shared_team(int threads) {
    static std::mutex m;
    static auto* team = new std::shared_ptr<Team>();  // never destroyed: its threads may outlive static destructors
    std::lock_guard<std::mutex> g(m);
    if (!*team || (*team)->size() != std::max(1, threads)) *team = std::make_shared<Team>(threads);
    return *team;
}

// y = x @ W.T through the row-group kernels, on a copy of W interleaved for this call (grouped_takes(type, N))
static void mm_grouped(const float* x, int64_t M, const uint8_t* w, int64_t N, int64_t K, int type, float* y, int threads,
                       bool refined) {
    if (M == 0) return;
    std::vector<uint8_t> copy(grouped_bytes(type, N, K));
    Q8Rows xq;
    xq.refined = refined;
    xq.resize(M, K);
    xq.quantize(x, 0, M, kColsLayout);
    std::vector<Stage> stages{
        {N / group_rows(), 1, [&](int, int64_t lo, int64_t hi) { interleave_groups(type, w, N, K, copy.data(), lo, hi); }, {}},
        {N, group_rows(), [&](int, int64_t lo, int64_t hi) { project(type, copy.data(), K, xq, x, 0, M, y, N, lo, hi, true, true); }, {}}};
    shared_team(threads)->run(stages);
}

extern "C" {

LLMCLI_API int llmcli_mm(const float* x, int64_t M, const uint8_t* w, int64_t N, int64_t K, int type, float* y, int threads,
                         int refined) {
    if (type < 0 || type >= kTypes || K % block_size(type) || M < 0 || N < 0) return 1;
    if (M == 0 || N == 0) return 0;
    if (type == kQ5_K && grouped_takes(type, N)) {  // as the decode step takes it (int8 activations), not the float route
        mm_grouped(x, M, w, N, K, type, y, threads, refined);
        return 0;
    }
    static thread_local Q8Rows mine;  // the calling thread's: no allocation per call
    Q8Rows& xq = mine;  // (a thread_local named in the lambdas would be each worker's own)
    xq.refined = refined && layout_of(type);  // (the float routes read x as it is)
    std::vector<Stage> stages;
    if (layout_of(type)) {  // (not the float routes: Q5_K's, F16's and BF16's)
        xq.resize(M, K);
        const unsigned layouts = layout_of(type);
        if (M * K <= 8192) xq.quantize(x, 0, M, layouts);  // a few microseconds: not worth a stage
        else stages.push_back({M, 1, [&](int, int64_t lo, int64_t hi) { xq.quantize(x, lo, hi, layouts); }, {}});
    }
    stages.push_back({N, 16, [&](int, int64_t lo, int64_t hi) { project(type, w, K, xq, x, 0, M, y, N, lo, hi, false); }, {}});
    shared_team(threads)->run(stages);
    return 0;
}

LLMCLI_API int llmcli_group_rows() { return group_rows(); }

LLMCLI_API int llmcli_grouped_takes(int type, int64_t N) { return type >= 0 && type < kTypes && grouped_takes(type, N); }

LLMCLI_API int64_t llmcli_grouped_bytes(int type, int64_t N, int64_t K) {
    return type >= 0 && type < kTypes && grouped_takes(type, N) && K > 0 && K % 32 == 0 ? grouped_bytes(type, N, K) : 0;
}

LLMCLI_API int llmcli_interleave(int type, const uint8_t* W, int64_t N, int64_t K, const int64_t* order, uint8_t* out,
                                 int threads) {
    if (llmcli_grouped_bytes(type, N, K) == 0) return 2;
    std::vector<Stage> stages{{N / group_rows(), 1, [&](int, int64_t lo, int64_t hi) {
        interleave_groups(type, W, N, K, out, lo, hi, order);
    }, {}}};
    shared_team(threads)->run(stages);
    return 0;
}

LLMCLI_API int llmcli_mm_grouped(const float* x, int64_t M, const uint8_t* w, int64_t N, int64_t K, int type, float* y,
                                int threads, int refined) {
    if (type < 0 || type >= kTypes || K % block_size(type) || M < 0 || N < 0) return 1;
    if (!grouped_takes(type, N)) return 2;
    mm_grouped(x, M, w, N, K, type, y, threads, refined);
    return 0;
}

LLMCLI_API int llmcli_dequantize(const uint8_t* w, int64_t N, int64_t K, int type, float* y, int threads) {
    if (type < 0 || type >= kTypes || K % block_size(type) || N < 0) return 1;
    if (N == 0) return 0;
    std::vector<Stage> stages{{N, 4, [&](int, int64_t lo, int64_t hi) {
        with_type(type, [&](auto t) {
            constexpr int T = decltype(t)::value;
            using Bk = Block<T>;
            const int64_t nb = K / Bk::size;
            if constexpr (float_type<T>) return half_rows_to_floats<T>(w + lo * K * 2, (hi - lo) * K, y + lo * K);
            for (int64_t n = lo; n < hi; ++n)
                for (int64_t k = 0; k < nb; ++k) Bk::deq(w + (n * nb + k) * Bk::bytes, y + n * K + k * Bk::size);
        });
    }, {}}};
    // a few rows (a decode step's embeddings) on this thread: waking the team's, asleep since the
    // step before, costs far more than the microsecond's work
    if (N * K <= 65536) stages[0].work(0, 0, N);
    else shared_team(threads)->run(stages);
    return 0;
}

LLMCLI_API int llmcli_dot_rows(const uint8_t* w, int64_t N, int64_t K, int type, const int64_t* ids, int64_t n,
                               const float* x, float* out) {
    if (type < 0 || type >= kTypes || K % block_size(type) || n < 0) return 1;
    for (int64_t i = 0; i < n; ++i)
        if (ids[i] < 0 || ids[i] >= N) return 1;
    const int64_t rb = K / block_size(type) * block_bytes(type);
    std::vector<float> row(K);
    for (int64_t i = 0; i < n; ++i) {
        llmcli_dequantize(w + ids[i] * rb, 1, K, type, row.data(), 1);
        double sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += (double)row[k] * x[k];
        out[ids[i]] = (float)sum;
    }
    return 0;
}

LLMCLI_API int llmcli_quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s, int refined) {
    if (K % 32) return 1;
    const int64_t nb = K / 32;
    int32_t n4[16];
    for (int64_t i = 0; i < M * nb; ++i) {
        if (!refined) {
            quantize_block(x + 32 * i, q + 32 * i, d[i], s[i]);
            continue;
        }
        const int64_t hi = 2 * (i / nb) * nb + i % nb, lo = hi + nb;  // (row m's blocks: rows 2m and 2m + 1)
        float dd[2], ss[2];
        quantize_pair(x + 32 * i, q + 32 * hi, q + 32 * lo, dd, ss, n4, n4 + 8);
        d[hi] = dd[0], d[lo] = dd[1], s[hi] = ss[0], s[lo] = ss[1];
    }
    return 0;
}

}  // extern "C"
