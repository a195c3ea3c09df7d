// What the .cpp files share: quantized activations, projections, attention, the shared team.
#pragma once
#include <vector>

#include "blocks.h"
#include "dot.h"  // (what the variant's kernels read: LLMCLI_GROUPED, LLMCLI_ORDERS)
#include "team.h"

// The copies of the activations (Q8's layouts) a weight type's dot products read, beyond q, d, s, n4:
// a step prepares only those of the weights that read them (preparing all spent a step's time on
// copies nothing read)
// (kColsLayout: the rows side by side for the row-group kernels, Q8Cols)
enum Layout : unsigned { kNibbleLayout = 1, kQ8_0Layout = 2, kQ4KLayout = 4, kQ6KLayout = 8, kColsLayout = 16 };
static inline unsigned layout_of(int type) {
    switch (type) {
        case kQ4_0: case kQ4_1: case kQ5_0: case kQ5_1: return kNibbleLayout;
        case kQ8_0: case kMXFP4: return kQ8_0Layout;  // (MXFP4: Q8_0's quad order, its codes looked up)
        case kQ4_K: return kQ4KLayout;
        case kQ6_K: return kQ6KLayout;
        default: return 0;  // Q5_K, F16, BF16: the float routes (no int8 activations)
    }
}

// Activation rows quantized as the dot products take them (blocks.h's Q8), owning their buffers.
// `refined` (int8x2 activations): each row of x is two stored rows, 2m and 2m + 1 the high and low
// bytes of its 16-bit codes (blocks.h's quantize_pair_scalar), which project() multiplies as two rows
// (the weights read once for both) and adds up: ~15 bits where one int8 row's error was most of a q8 model's. The functions
// below take rows m of x; row() and cols() take stored rows (kernels read those).
struct Q8Rows {
    std::vector<int8_t> q, qi, qq, qk, q6;
    std::vector<float> d, s, ds, d16, dq, d2, d6;
    std::vector<int32_t> n4, ni, zq, z6;
    std::vector<int8_t> gq;  // the rows side by side, kColGroup a group (Q8Cols), where the variant has row groups
    std::vector<float> gd, gs;
    std::vector<int32_t> gn32, gn16;
    int64_t K = 0, G = 0, Q = 0;  // groups of 8 blocks a row (qi, ni, ds, d16), of 4 (qq, zq, dq): the last padded with zero blocks
    bool refined = false;  // (set before resize)

    int64_t per_row() const { return refined ? 2 : 1; }  // stored rows a row of x
    void resize(int64_t x_rows, int64_t k) {
        const int64_t rows = x_rows * per_row();
        K = k;
        G = (k / 32 + 7) / 8;
        Q = (k / 32 + 3) / 4;
        // slack after the last row: a padded group's codes, sums and scales read past it (times d = 0)
        q.resize(rows * k + 128); d.resize(rows * k / 32 + 4); s.resize(rows * k / 32 + 4); n4.resize(rows * k / 4 + 32);
#ifdef LLMCLI_GROUPED
        const int64_t groups = (rows + kColGroup - 1) / kColGroup, nb = k / 32;
        gq.resize(groups * nb * 32 * kColGroup); gd.resize(groups * nb * kColGroup); gs.resize(groups * nb * kColGroup);
        gn32.resize(groups * nb * kColGroup); gn16.resize(groups * nb * 2 * kColGroup);
#endif
#ifdef LLMCLI_ORDERS
        qi.resize(rows * G * 256); ni.resize(rows * G * 16); ds.resize(rows * G * 16); d16.resize(rows * G * 16);
        qq.resize(rows * Q * 128); zq.resize(rows * Q * 16); dq.resize(rows * Q * 16);
        qk.resize(rows * k); d2.resize(rows * k / 16);
        q6.resize(rows * k); z6.resize(rows * k / 16); d6.resize(rows * k / 16);
#endif
    }
    Q8 row(int64_t m) const {
        const int64_t nb = K / 32;
        return {q.data() + m * K, d.data() + m * nb, s.data() + m * nb, n4.data() + m * K / 4,
                qi.data() + (qi.empty() ? 0 : m * G * 256), ni.data() + (ni.empty() ? 0 : m * G * 16),
                ds.data() + (ds.empty() ? 0 : m * G * 16), d16.data() + (d16.empty() ? 0 : m * G * 16),
                qq.data() + (qq.empty() ? 0 : m * Q * 128), zq.data() + (zq.empty() ? 0 : m * Q * 16),
                dq.data() + (dq.empty() ? 0 : m * Q * 16),
                qk.data() + (qk.empty() ? 0 : m * K), d2.data() + (d2.empty() ? 0 : m * K / 16),
                q6.data() + (q6.empty() ? 0 : m * K), z6.data() + (z6.empty() ? 0 : m * K / 16),
                d6.data() + (d6.empty() ? 0 : m * K / 16)};
    }
    Q8Cols cols(int64_t m) const {  // row m's column of its group, and the group's rows after it
        const int64_t nb = K / 32, g = m / kColGroup * nb, c = m % kColGroup;
        return {gq.data() + g * 32 * kColGroup + 4 * c, gd.data() + g * kColGroup + c, gs.data() + g * kColGroup + c,
                gn32.data() + g * kColGroup + c, gn16.data() + g * 2 * kColGroup + c};
    }
    // rows [m0, m1) of x (rows of K floats), with the `layouts` the next weights read (the others are left stale;
    // one row for the row-group kernels alone: its columns only, quantize_to_cols)
    void quantize(const float* x, int64_t m0, int64_t m1, unsigned layouts);
    void quantize_to_cols(const float* x, int64_t m);
    // blocks [b0, b1) of row m alone (q, d, s, n4; refined: its low bytes' too, from the same block
    // alone): whole rows come to the same bytes block by block.
    // Enough for the `layouts` where by_blocks(layouts) (then to_cols for the columns), whose other
    // copies (LLMCLI_ORDERS: AVX-512's, for the blocks as stored) take whole rows.
    void quantize_blocks(const float* x, int64_t m, int64_t b0, int64_t b1);
    static bool by_blocks(unsigned layouts) {
#ifdef LLMCLI_ORDERS
        return (layouts & ~kColsLayout) == 0;
#else
        (void)layouts;
        return true;
#endif
    }
    // rows [m0, m1) of x, quantized already, to their columns (kColsLayout's part of quantize), m0 a
    // multiple of kColGroup; the codes of the last group's columns from m1 on become zeros (rows
    // no one reads). Rows that share a group share the cache lines of its columns, so two threads
    // quantizing rows of one group leave this to one of them.
    void to_cols(int64_t m0, int64_t m1);
};

// y[m * ldy + n] = (row n of W: GGUF blocks of `type`, K wide) . (activation row m0 + m), for n in
// [n0, n1) and m in [0, M). xq: the rows quantized; xf: the rows as floats (Q5_K's float route).
// `alone`: each value exactly as with its activation row alone (M = 1), for any M and any [n0, n1)
// of whole groups of 4 rows (the decode step's promise that a batch does not change a row's numbers).
// `grouped`: W is interleave_groups' copy ([n0, n1) whole groups); each value is then as alone.
// Where xq is refined, the integer routes take each row's two stored rows and add their values.
void project(int type, const uint8_t* W, int64_t K, const Q8Rows& xq, const float* xf, int64_t m0, int64_t M,
             float* y, int64_t ldy, int64_t n0, int64_t n1, bool alone, bool grouped = false);

// The weight rows in a group of this variant's row-group kernels (row_groups.h: 16 with AVX-512,
// 8 with AVX2 and AVX-VNNI; 0: none); whether they take N rows of `type`. Then interleave_groups
// writes W's copy for them (grouped_bytes at out; groups [g0, g1), all for g1 < 0), and
// project(..., grouped) reads it.
int group_rows();
bool grouped_takes(int type, int64_t N);
int64_t grouped_bytes(int type, int64_t N, int64_t K);
void interleave_groups(int type, const uint8_t* W, int64_t N, int64_t K, uint8_t* out, int64_t g0 = 0, int64_t g1 = -1,
                       const int64_t* order = nullptr);

// Attention for one query of n heads that share a key and value head (q and out: n rows of D):
// scores against S keys (rows `ks` floats apart), softmax, weighted sum of S values (rows `vs`
// apart). p: kHeadsAtOnce * S floats of scratch; keys where mask[s] is 0 get no weight (mask may be
// null). Each head's numbers are those it gets alone. The cache's rows are float32, or float16 (bits).
// sinks (n,) or null: a logit per head that joins each softmax's denominator, no value (gpt-oss).
constexpr int64_t kHeadsAtOnce = 4;
void attend_heads(const float* q, int64_t n, const float* k, int64_t ks, const float* v, int64_t vs, int64_t S,
                  int64_t D, const uint8_t* mask, float scale, float* p, float* out, const float* sinks = nullptr);
void attend_heads(const float* q, int64_t n, const uint16_t* k, int64_t ks, const uint16_t* v, int64_t vs, int64_t S,
                  int64_t D, const uint8_t* mask, float scale, float* p, float* out,
                  const float* sinks = nullptr);  // a float16 cache

// Heads a work item takes of a group of G sharing a key head, with `groups` groups for `threads`
// threads: whole groups (up to kHeadsAtOnce) where there are groups enough to go round
int64_t heads_a_part(int64_t G, int64_t groups, int threads);

// The team of `threads` threads the one-off calls (mm, dequantize, attention) share
std::shared_ptr<Team> shared_team(int threads);
