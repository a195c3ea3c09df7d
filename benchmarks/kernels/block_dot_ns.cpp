// The block kernels alone, per variant: ns per 32 weights for one activation row against 256 weight rows
// of K weights (in cache: what the instructions cost, apart from memory), best of 30 passes.
// K: the first argument, 576 by default (SmolLM2's hidden size); the K-quants take the multiple of
// 256 below it.
//
//   S=llmcli/native/src; for v in "avx512vnni:-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c -DLLMCLI_AVX512VNNI" \
//       "avxvnni:-mavx2 -mavxvnni -mfma -mf16c -DLLMCLI_AVXVNNI" "avx2:-mavx2 -mfma -mf16c -DLLMCLI_AVX2" "portable:"; do
//     g++ -O3 -std=c++17 -ffp-contract=off -pthread ${v#*:} -I$S benchmarks/kernels/block_dot_ns.cpp $S/matmul.cpp -o /tmp/kb && /tmp/kb 576; done
//
// (the flags as build.py has them; neon: "-march=armv8.2-a+dotprod -DLLMCLI_NEON" on aarch64)
#include "dot.h"
#include "kernels.h"
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <random>
template <int T> double run(int64_t N, int64_t K) {
    const int64_t rb = K / Block<T>::size * Block<T>::bytes, nb = K / 32;
    std::vector<uint8_t> W(N * rb); std::mt19937 g(1); for (auto& b : W) b = g();
    for (int64_t i = 0; i < N * K / Block<T>::size; ++i) { uint8_t* b = W.data() + i * Block<T>::bytes + (T == kQ6_K ? 208 : 0); b[0] = 0; b[1] = 20; if (T == kQ4_1 || T == kQ4_K) { b[2] = 0; b[3] = 20; } }
    std::vector<float> x(K); for (auto& v : x) v = (float)(g() % 1000) / 500.f - 1.f;
    Q8Rows xq; xq.resize(1, K); xq.quantize(x.data(), 0, 1, kNibbleLayout | kQ8_0Layout | kQ4KLayout | kQ6KLayout);
    std::vector<float> y(N); double best = 1e9;
    for (int rep = 0; rep < 30; ++rep) {
        auto t = std::chrono::steady_clock::now();
        for (int it = 0; it < 20; ++it) {
            int64_t n = 0;
#ifdef LLMCLI_DOT_4ROWS
            for (; n + 4 <= N; n += 4) dot_4rows<T>(W.data() + n * rb, rb, xq.row(0), nb, y.data() + n);
#endif
            for (; n < N; ++n) y[n] = dot_row<T>(W.data() + n * rb, xq.row(0), nb);
        }
        double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t).count() / 20 / (N * nb);
        best = std::min(best, ns);
    }
    return best;
}
int main(int argc, char** argv) {
    const int64_t N = 256, K = argc > 1 ? std::atoll(argv[1]) : 576, KK = std::max<int64_t>(256, K / 256 * 256);
    printf("%-11s ns/block: Q4_0 %.3f  Q4_1 %.3f  Q5_0 %.3f  Q8_0 %.3f  Q4_K %.3f  Q6_K %.3f\n", LLMCLI_VARIANT,
           run<kQ4_0>(N, K), run<kQ4_1>(N, K), run<kQ5_0>(N, K), run<kQ8_0>(N, K), run<kQ4_K>(N, KK), run<kQ6_K>(N, KK));
}
