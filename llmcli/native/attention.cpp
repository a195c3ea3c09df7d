// Decoding's one-query attention over a float32 KV cache (models/llama.py's attend_one, and the
// decode step's): each head's scores, softmax (a vectorized exp) and weighted sum of values in one
// pass over its keys, no temporaries beyond S floats. SDPA's setup for a single query cost 37 us a
// layer, this 15 (SmolLM2 at ~100 tokens, 2 threads).
#include <algorithm>
#include <cmath>

#include "api.h"
#include "kernels.h"
#include "vec.h"

void attend_head(const float* q, const float* k, int64_t ks, const float* v, int64_t vs, int64_t S, int64_t D,
                 const uint8_t* mask, float scale, float* p, float* out) {
    float mx = -INFINITY;
    int64_t s = 0;
    for (; s + 4 <= S; s += 4) dot4_f32(q, k + s * ks, ks, D, p + s);  // four keys at a time: half the work of one by one
    for (; s < S; ++s) p[s] = dot_f32(q, k + s * ks, D);
    for (s = 0; s < S; ++s) {
        p[s] = (mask && !mask[s]) ? -INFINITY : p[s] * scale;
        mx = std::max(mx, p[s]);
    }
    const float inv = 1.f / exp_shifted(p, S, mx);
    for (int64_t s = 0; s < S; ++s) p[s] *= inv;
    weighted_rows(p, v, vs, S, D, out);
}

extern "C" LLMCLI_API int llmcli_attend_one(const float* q, int64_t B, int64_t H, int64_t D, const float* k,
                                            const int64_t* k_strides, const float* v, const int64_t* v_strides,
                                            int64_t KV, int64_t S, const uint8_t* mask, int64_t mask_rows, float scale,
                                            float* out, int threads) {
    if (KV <= 0 || H % KV || S <= 0 || (mask && mask_rows != 1 && mask_rows != B)) return 1;
    const int64_t G = H / KV;
    const int64_t heads_a_chunk = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, S * D));
    std::vector<Stage> stages{{B * H, heads_a_chunk, [&](int, int64_t lo, int64_t hi) {
        static thread_local std::vector<float> p;  // this thread's scores
        if ((int64_t)p.size() < S) p.resize(S);
        for (int64_t bh = lo; bh < hi; ++bh) {
            const int64_t b = bh / H, g = bh % H / G;
            attend_head(q + bh * D, k + b * k_strides[0] + g * k_strides[1], k_strides[2],
                        v + b * v_strides[0] + g * v_strides[1], v_strides[2], S, D,
                        mask ? mask + (mask_rows == 1 ? 0 : b) * S : nullptr, scale, p.data(), out + bh * D);
        }
    }, {}}};
    shared_team(threads)->run(stages);
    return 0;
}
