// Decoding's one-query attention over a float32 KV cache (models/llama.py's attend_one), or a float32
// or float16 one (the decode step's): each head's scores, softmax (a vectorized exp) and weighted sum
// of values in one pass over its keys, no temporaries beyond S floats a head: SDPA's setup alone for a
// single query cost more than all of this (docs/performance-choices.md). The query heads that share a key and
// value head (grouped-query attention) go up to kHeadsAtOnce together, each key and value row read
// once for them: at long contexts the cache's rows, read from memory, are most of a token's time.
#include <algorithm>
#include <cmath>

#include "api.h"
#include "kernels.h"
#include "vec.h"

// NH query heads (q rows D apart, outputs likewise) against one key and value head (E: float, or
// uint16_t for float16 bits)
template <int NH, typename E>
static void attend_n(const float* q, const E* k, int64_t ks, const E* v, int64_t vs, int64_t S, int64_t D,
                     const uint8_t* mask, float scale, float* p, float* out, const float* sinks) {
    int64_t s = 0;
    const int64_t row_bytes = D * (int64_t)sizeof(E);
    for (; s + 4 <= S; s += 4) {  // four keys at a time: half the work of one by one
        // the keys 16 ahead, and these keys' values for the weighted sum after: the rows come from
        // memory (a batch's caches are past L2), and the hardware's prefetch starts anew each 4 KB
        for (int j = 0; j < 4; ++j)
            for (int64_t b = 0; b < row_bytes; b += 64) {
                if (s + 16 + j < S) __builtin_prefetch(reinterpret_cast<const char*>(k + (s + 16 + j) * ks) + b);
                __builtin_prefetch(reinterpret_cast<const char*>(v + (s + j) * vs) + b);
            }
        float t[NH][4];
        dot4_f32_heads<NH>(q, D, k + s * ks, ks, D, t);
        for (int h = 0; h < NH; ++h)
            for (int j = 0; j < 4; ++j) p[h * S + s + j] = t[h][j];
    }
    for (; s < S; ++s)
        for (int h = 0; h < NH; ++h) p[h * S + s] = dot_kv(q + h * D, k + s * ks, D);
    for (int h = 0; h < NH; ++h) {
        float* ph = p + h * S;
        const float mx = scale_and_max(ph, S, mask, scale);
        const float inv = 1.f / (exp_shifted(ph, S, mx) + (sinks ? std::exp(sinks[h] - mx) : 0.f));
        for (s = 0; s < S; ++s) ph[s] *= inv;
    }
    weighted_rows_heads<NH>(p, S, v, vs, S, D, out, D);
}

template <typename E>
static void attend_all(const float* q, int64_t n, const E* k, int64_t ks, const E* v, int64_t vs, int64_t S,
                       int64_t D, const uint8_t* mask, float scale, float* p, float* out, const float* sinks) {
    for (int64_t h = 0; h < n; h += kHeadsAtOnce) {
        const float* qh = q + h * D;
        float* oh = out + h * D;
        const float* sh = sinks ? sinks + h : nullptr;
        switch (std::min<int64_t>(kHeadsAtOnce, n - h)) {
            case 1: attend_n<1>(qh, k, ks, v, vs, S, D, mask, scale, p, oh, sh); break;
            case 2: attend_n<2>(qh, k, ks, v, vs, S, D, mask, scale, p, oh, sh); break;
            case 3: attend_n<3>(qh, k, ks, v, vs, S, D, mask, scale, p, oh, sh); break;
            default: attend_n<4>(qh, k, ks, v, vs, S, D, mask, scale, p, oh, sh); break;
        }
    }
}

void attend_heads(const float* q, int64_t n, const float* k, int64_t ks, const float* v, int64_t vs, int64_t S,
                  int64_t D, const uint8_t* mask, float scale, float* p, float* out, const float* sinks) {
    attend_all(q, n, k, ks, v, vs, S, D, mask, scale, p, out, sinks);
}

void attend_heads(const float* q, int64_t n, const uint16_t* k, int64_t ks, const uint16_t* v, int64_t vs, int64_t S,
                  int64_t D, const uint8_t* mask, float scale, float* p, float* out, const float* sinks) {
    attend_all(q, n, k, ks, v, vs, S, D, mask, scale, p, out, sinks);
}

int64_t heads_a_part(int64_t G, int64_t groups, int threads) {
    // parts enough for two items a thread (SmolLM2's 3 key heads as 3 items would leave one of 2
    // threads idle half the time), but two heads a part at least: sharing a key head's rows is the point
    const int64_t parts = std::max<int64_t>(1, (2 * threads + groups - 1) / groups);
    return std::clamp<int64_t>((G + parts - 1) / parts, std::min<int64_t>(G, 2), kHeadsAtOnce);
}

extern "C" LLMCLI_API int llmcli_attend_one(const float* q, int64_t B, int64_t H, int64_t D, const float* k,
                                            const int64_t* k_strides, const float* v, const int64_t* v_strides,
                                            int64_t KV, int64_t S, const uint8_t* mask, int64_t mask_rows, float scale,
                                            float* out, int threads) {
    if (KV <= 0 || H % KV || S <= 0 || (mask && mask_rows != 1 && mask_rows != B)) return 1;
    const int64_t G = H / KV, per = heads_a_part(G, B * KV, threads), parts = (G + per - 1) / per;
    const int64_t items_a_chunk = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, S * D * per));
    std::vector<Stage> stages{{B * KV * parts, items_a_chunk, [&](int, int64_t lo, int64_t hi) {
        static thread_local std::vector<float> p;  // this thread's scores
        if ((int64_t)p.size() < kHeadsAtOnce * S) p.resize(kHeadsAtOnce * S);
        for (int64_t i = lo; i < hi; ++i) {
            const int64_t b = i / (KV * parts), g = i / parts % KV, h = g * G + i % parts * per;
            attend_heads(q + (b * H + h) * D, std::min(per, (g + 1) * G - h), k + b * k_strides[0] + g * k_strides[1],
                         k_strides[2], v + b * v_strides[0] + g * v_strides[1], v_strides[2], S, D,
                         mask ? mask + (mask_rows == 1 ? 0 : b) * S : nullptr, scale, p.data(), out + (b * H + h) * D);
        }
    }, {}}};
    shared_team(threads)->run(stages);
    return 0;
}
