// What the .cpp files share: quantized activations, projections, attention, the shared team.
#pragma once
#include <vector>

#include "blocks.h"
#include "team.h"

// Activation rows quantized as the dot products take them (blocks.h's Q8), owning their buffers
struct Q8Rows {
    std::vector<int8_t> q;
    std::vector<float> d, s;
    std::vector<int32_t> n4;
    int64_t K = 0;

    void resize(int64_t rows, int64_t k) {
        K = k;
        q.resize(rows * k); d.resize(rows * k / 32); s.resize(rows * k / 32); n4.resize(rows * k / 4);
    }
    Q8 row(int64_t m) const { return {q.data() + m * K, d.data() + m * K / 32, s.data() + m * K / 32, n4.data() + m * K / 4}; }
    // blocks [b0, b1) of 32 floats of x (rows side by side)
    void quantize(const float* x, int64_t b0, int64_t b1);
};

// y[m * ldy + n] = (row n of W: GGUF blocks of `type`, K wide) . (activation row m), for n in
// [n0, n1) and m in [0, M). xq: the rows quantized; xf: the rows as floats (Q5_K's float route).
void project(int type, const uint8_t* W, int64_t K, const Q8Rows& xq, const float* xf, int64_t M,
             float* y, int64_t ldy, int64_t n0, int64_t n1);

// One head's attention for one query: scores against S keys (rows `ks` floats apart), softmax,
// weighted sum of S values (rows `vs` apart) into out[0..D). p: S floats of scratch; keys where
// mask[s] is 0 get no weight (mask may be null).
void attend_head(const float* q, const float* k, int64_t ks, const float* v, int64_t vs, int64_t S, int64_t D,
                 const uint8_t* mask, float scale, float* p, float* out);

// The team of `threads` threads the one-off calls (mm, dequantize, attention) share
std::shared_ptr<Team> shared_team(int threads);
