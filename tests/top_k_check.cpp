// TopK (llmcli/native/src/top_k.h) fed a row in pieces in any order, split among several finders and
// merged, as a decode step's threads give it the head's chunks (a thread's own range, then chunks
// taken from another thread's range, before its own). Rows full of ties, -inf and NaN; the k largest
// must be torch.topk's: larger first, of equal values the earlier index, NaN as the largest.
// Prints "ok" and exits 0, or the first difference and exits 1 (test_top_k.py builds and runs it).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "top_k.h"

int main() {
    std::mt19937 rng(3);
    for (int trial = 0; trial < 3000; ++trial) {
        const int64_t n = 1 + rng() % 300, k = 1 + rng() % std::min<int64_t>(n, 40);
        std::vector<float> x(n);
        const int kind = trial % 3;  // a few values (ties everywhere); some -inf and NaN; mostly -inf
        for (auto& v : x) {
            const unsigned r = rng() % 100;
            v = kind == 0 ? (float)(rng() % 5) : r < (kind == 1 ? 30u : 92u) ? -INFINITY : r < (kind == 1 ? 33u : 93u) ? NAN : (float)(rng() % 7) - 3.f;
        }
        std::vector<int64_t> cut{0, n};  // pieces [cut[i], cut[i + 1])
        for (int c = rng() % 6; c > 0; --c) cut.push_back(rng() % (n + 1));
        std::sort(cut.begin(), cut.end());
        cut.erase(std::unique(cut.begin(), cut.end()), cut.end());
        std::vector<int64_t> order(cut.size() - 1);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<TopK> finders(1 + rng() % 3);
        for (auto& f : finders) f.reset(k);
        for (size_t i = 0; i < order.size(); ++i)
            finders[i % finders.size()].offer(x.data(), cut[order[i]], cut[order[i] + 1]);
        for (size_t f = 1; f < finders.size(); ++f) finders[f].merge_into(finders[0]);
        std::vector<float> values(k);
        std::vector<int64_t> got(k), want(n);
        finders[0].finish(x.data(), values.data(), got.data());
        std::iota(want.begin(), want.end(), 0);
        std::stable_sort(want.begin(), want.end(), [&](int64_t a, int64_t b) { return TopK::nan_last(x[a]) > TopK::nan_last(x[b]); });
        for (int64_t j = 0; j < k; ++j)
            if (got[j] != want[j]) {
                std::printf("trial %d (n %ld, k %ld, %zu pieces, %zu finders): place %ld has index %ld, not %ld\n", trial,
                            (long)n, (long)k, order.size(), finders.size(), (long)j, (long)got[j], (long)want[j]);
                return 1;
            }
    }
    std::printf("ok\n");
    return 0;
}
