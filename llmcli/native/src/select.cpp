// The k largest of n floats (sampling's top-k, greedy decoding's near-tie check, where the decode
// step did not find them): TopK's pass (top_k.h) from a floor under the k-th largest (kth_floor),
// many times faster than torch.topk on a vocabulary's logits (docs/performance-choices.md).
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "api.h"
#include "top_k.h"
#include "vec.h"

namespace {

// A floor under the k-th largest of x: the k-th largest of the maxima of 4k or more disjoint chunks
// (each maximum is one of its chunk's values, NaN as the largest, so k of them are k values at least
// that large). One pass of vector maxima; the pass after it then looks at a few dozen values one by
// one where, rising from the first k values, it looked at hundreds (and at most of them where the
// logits ascend). -inf where the chunks would be too short to pay.
float kth_floor(const float* x, int64_t n, int64_t k) {
    const int64_t chunk = n / (4 * k) / (4 * kVW) * (4 * kVW);
    if (chunk < 16 * kVW) return -INFINITY;
    std::vector<float> maxima;
    maxima.reserve(n / chunk);
    for (int64_t at = 0; at + chunk <= n; at += chunk) {
        vf m = vload(x + at);
        for (int64_t i = kVW; i < chunk; i += kVW) m = vmax(m, vload(x + at + i));
        float lanes[kVW], best = -INFINITY;
        vstore(lanes, m);
        for (float y : lanes) best = std::max(best, TopK::nan_last(y));
        maxima.push_back(best);
    }
    std::nth_element(maxima.begin(), maxima.begin() + (k - 1), maxima.end(), std::greater<float>());
    return maxima[k - 1];
}

}  // namespace

extern "C" LLMCLI_API int llmcli_top_k(const float* x, int64_t n, int64_t k, float* values, int64_t* indices) {
    if (k < 1 || k > n) return 1;
    TopK best;
    best.reset(k, kth_floor(x, n, k));
    best.offer(x, 0, n);
    best.finish(x, values, indices);
    return 0;
}
