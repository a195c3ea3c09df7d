// How fast this machine reads memory: `threads` threads each sum their share of a buffer of `bytes`
// (far beyond the caches), `rounds` times; prints the best round's GB/s. A decode step that reads
// every weight once a token can go no faster than this (the roofline benchmarks/kernels/read_bandwidth.py reports).
//   read_bandwidth BYTES THREADS ROUNDS
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
    if (argc != 4) return 2;
    const size_t bytes = std::strtoull(argv[1], nullptr, 10);
    const int threads = std::atoi(argv[2]), rounds = std::atoi(argv[3]);
    const size_t n = bytes / sizeof(uint64_t);
    std::vector<uint64_t> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = i * 0x9e3779b97f4a7c15ull;  // touched: real pages, not the zero page
    std::vector<uint64_t> sums(threads * 8);
    double best = 0;
    for (int r = 0; r < rounds; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> team;
        for (int t = 0; t < threads; ++t)
            team.emplace_back([&, t] {
                const size_t lo = n * t / threads, hi = n * (t + 1) / threads;
                uint64_t a[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // eight sums: the loop vectorizes
                for (size_t i = lo; i + 8 <= hi; i += 8)
                    for (int j = 0; j < 8; ++j) a[j] += data[i + j];
                for (int j = 0; j < 8; ++j) sums[t * 8 + j] = a[j];
            });
        for (auto& th : team) th.join();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, bytes / s / 1e9);
    }
    uint64_t check = 0;
    for (uint64_t v : sums) check ^= v;
    std::printf("%.2f %llu\n", best, (unsigned long long)check);
    return 0;
}
