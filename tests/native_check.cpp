// A kernel variant checked through its C interface, without Python: built with the variant's flags
// together with the library's sources, so that a variant this machine cannot load as a library
// (neon on x86) is still checked, cross-compiled and run under qemu (test_native_check.py).
// Per block type: mm against float64 on the same int8 activations (the dequantized weights are
// compared with gguf-py elsewhere), quantize_rows against the portable bytes; F16 and BF16 rows
// against float64 on the float activations, each row's numbers those it gets alone (streamed and
// tiled); int8x2 activations (refined) against float64 on their two rows of codes, and nearer the
// float activations than int8; attention against float64. Prints "ok <variant>" and exits 0, or
// names what differs and exits 1.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "api.h"
#include "blocks.h"

static std::mt19937 rng(7);

static float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }

// float -> float16 bits for values that are normal float16 numbers (the scales set below)
static uint16_t to_half(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    const uint32_t sign = (b >> 16) & 0x8000, exp = ((b >> 23) & 255) - 112, man = (b >> 13) & 1023;
    return (uint16_t)(sign | (exp << 10) | man);
}

// random bytes, with sane float16 scales where the type keeps them; F16 and BF16: weights of +-0.001..0.05
static std::vector<uint8_t> random_blocks(int type, int64_t N, int64_t K) {
    const int64_t size = block_size(type), bytes = block_bytes(type), n = N * K / size;
    std::vector<uint8_t> w(n * bytes);
    if (type == kF16 || type == kBF16) {
        for (int64_t i = 0; i < n; ++i) {
            const float f = uniform(0.001f, 0.05f) * (rng() % 2 ? 1.f : -1.f);
            uint32_t b;
            std::memcpy(&b, &f, 4);
            const uint16_t h = type == kF16 ? to_half(f) : (uint16_t)(b >> 16);
            std::memcpy(w.data() + 2 * i, &h, 2);
        }
        return w;
    }
    for (auto& b : w) b = (uint8_t)rng();
    if (type == kMXFP4) {  // e8m0 exponents 2^-13 .. 2^1 (halved), as gpt-oss's experts have
        for (int64_t i = 0; i < n; ++i) w[i * bytes] = (uint8_t)(115 + rng() % 15);
        return w;
    }
    const bool has_m = type == kQ4_1 || type == kQ5_1 || type == kQ4_K || type == kQ5_K;
    for (int64_t i = 0; i < n; ++i) {
        uint8_t* b = w.data() + i * bytes + (type == kQ6_K ? 208 : 0);
        for (int j = 0; j < (has_m ? 2 : 1); ++j) {
            const uint16_t h = to_half(uniform(0.002f, 0.02f) * (rng() % 2 ? 1.f : -1.f));
            std::memcpy(b + 2 * j, &h, 2);
        }
    }
    return w;
}

static bool check_type(int type) {
    const int64_t N = 37, M = 3, K = block_size(type) == 256 ? 768 : 544;
    const std::vector<uint8_t> w = random_blocks(type, N, K);
    std::vector<float> wf(N * K), x(M * K), y(M * N), d(M * K / 32), s(M * K / 32);
    std::vector<int8_t> q(M * K), q_ref(32);
    for (auto& v : x) v = uniform(-1.f, 1.f);
    x[5] = 0.f;
    if (llmcli_dequantize(w.data(), N, K, type, wf.data(), 2) || llmcli_quantize_rows(x.data(), M, K, q.data(), d.data(), s.data(), 0) ||
        llmcli_mm(x.data(), M, w.data(), N, K, type, y.data(), 2, 0)) {
        std::printf("type %d: refused\n", type);
        return false;
    }
    for (int64_t i = 0; i < M * K / 32; ++i) {  // the portable bytes
        float dr, sr;
        quantize_block_scalar(x.data() + 32 * i, q_ref.data(), dr, sr);
        if (std::memcmp(q_ref.data(), q.data() + 32 * i, 32) || dr != d[i] || sr != s[i]) {
            std::printf("type %d: activation block %lld quantizes differently\n", type, (long long)i);
            return false;
        }
    }
    double worst = 0, top = 0;
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            double want = 0;
            for (int64_t k = 0; k < K; ++k) {
                const bool floats = type == kQ5_K || type == kF16 || type == kBF16;  // the float routes
                const double a = floats ? x[m * K + k] : (double)q[m * K + k] * d[m * K / 32 + k / 32];
                want += a * wf[n * K + k];
            }
            worst = std::max(worst, std::fabs(want - y[m * N + n]));
            top = std::max(top, std::fabs(want));
        }
    if (worst > 1e-4 * top) {
        std::printf("type %d: mm differs from float64 by %g of %g\n", type, worst, top);
        return false;
    }
    return true;
}

// int8x2 activations: quantize_rows' pairs are the portable bytes (blocks.h's quantize_pair_scalar: a
// row's high codes, then its low ones), mm equals float64 on each row's two rows of codes, and its
// error against the float activations is a tenth of int8's at most;
// the float routes (Q5_K here, F16, BF16) read x as it is, refined or not
static bool check_refined(int type) {
    const int64_t N = 37, M = 3, K = block_size(type) == 256 ? 768 : 544;
    const std::vector<uint8_t> w = random_blocks(type, N, K);
    std::vector<float> wf(N * K), x(M * K), y1(M * N), y2(M * N), d(2 * M * K / 32), s(2 * M * K / 32);
    std::vector<int8_t> q(2 * M * K), hi(32), lo(32);
    for (auto& v : x) v = uniform(-1.f, 1.f);
    x[40] = 30.f;  // a block with one large value
    for (int k = 64; k < 96; ++k) x[k] = 0.f;  // and one of zeros
    if (llmcli_dequantize(w.data(), N, K, type, wf.data(), 2) || llmcli_mm(x.data(), M, w.data(), N, K, type, y1.data(), 2, 0) ||
        llmcli_mm(x.data(), M, w.data(), N, K, type, y2.data(), 2, 1) ||
        llmcli_quantize_rows(x.data(), M, K, q.data(), d.data(), s.data(), 1))
        return false;
    if (type == kQ5_K || type == kF16 || type == kBF16) {
        if (std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float))) {
            std::printf("type %d: refined activations changed a float route\n", type);
            return false;
        }
        return true;
    }
    const int64_t nb = K / 32;
    for (int64_t i = 0; i < M * nb; ++i) {  // the portable bytes; row m's blocks at rows 2m and 2m + 1
        const int64_t h = 2 * (i / nb) * nb + i % nb, l = h + nb;
        float dd[2], ss[2];
        quantize_pair_scalar(x.data() + 32 * i, hi.data(), lo.data(), dd, ss);
        if (std::memcmp(hi.data(), q.data() + 32 * h, 32) || std::memcmp(lo.data(), q.data() + 32 * l, 32) ||
            dd[0] != d[h] || dd[1] != d[l] || ss[0] != s[h] || ss[1] != s[l]) {
            std::printf("type %d: block %ld's int8x2 codes differ from the portable ones\n", type, (long)i);
            return false;
        }
    }
    double worst = 0, top = 0, err1 = 0, err2 = 0;
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            double want = 0, exact = 0;
            for (int64_t k = 0; k < K; ++k) {
                const int64_t i = m * K + k;
                const int64_t h = 2 * m * K + k, l = h + K;  // (its high and low codes)
                want += ((double)q[h] * d[h / 32] + (double)q[l] * d[l / 32]) * wf[n * K + k];
                exact += (double)x[i] * wf[n * K + k];
            }
            worst = std::max(worst, std::fabs(want - y2[m * N + n]));
            top = std::max(top, std::fabs(want));
            err1 = std::max(err1, std::fabs(exact - y1[m * N + n]));
            err2 = std::max(err2, std::fabs(exact - y2[m * N + n]));
        }
    if (worst > 1e-4 * top || !(10 * err2 < err1)) {
        std::printf("type %d: refined mm differs from float64 by %g of %g; from the float activations by %g (int8: %g)\n",
                    type, worst, top, err2, err1);
        return false;
    }
    return true;
}

// F16/BF16: 20 activation rows in one call (tiled) give what each gives alone (streamed)
static bool check_alone(int type) {
    const int64_t N = 21, M = 20, K = 576;
    const std::vector<uint8_t> w = random_blocks(type, N, K);
    std::vector<float> x(M * K), y(M * N), one(N);
    for (auto& v : x) v = uniform(-1.f, 1.f);
    if (llmcli_mm(x.data(), M, w.data(), N, K, type, y.data(), 2, 0)) return false;
    for (int64_t m = 0; m < M; ++m) {
        if (llmcli_mm(x.data() + m * K, 1, w.data(), N, K, type, one.data(), 1, 0)) return false;
        if (std::memcmp(one.data(), y.data() + m * N, N * sizeof(float))) {
            std::printf("type %d: row %lld differs from its numbers alone\n", type, (long long)m);
            return false;
        }
    }
    return true;
}

static bool check_attention() {
    const int64_t B = 2, H = 6, KV = 3, S = 37, D = 80;
    std::vector<float> q(B * H * D), k(B * KV * S * D), v(B * KV * S * D), out(B * H * D);
    for (auto* t : {&q, &k, &v})
        for (auto& e : *t) e = uniform(-2.f, 2.f);
    const int64_t ks[3] = {KV * S * D, S * D, D};
    if (llmcli_attend_one(q.data(), B, H, D, k.data(), ks, v.data(), ks, KV, S, nullptr, 0, 0.3f, out.data(), 2)) return false;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
            const int64_t g = h / (H / KV);
            std::vector<double> p(S);
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j < S; ++j) {
                double dot = 0;
                for (int64_t c = 0; c < D; ++c) dot += (double)q[(b * H + h) * D + c] * k[b * ks[0] + g * ks[1] + j * D + c];
                p[j] = 0.3 * dot;
                mx = std::max(mx, p[j]);
            }
            for (auto& e : p) sum += (e = std::exp(e - mx));
            for (int64_t c = 0; c < D; ++c) {
                double o = 0;
                for (int64_t j = 0; j < S; ++j) o += p[j] / sum * v[b * ks[0] + g * ks[1] + j * D + c];
                if (std::fabs(o - out[(b * H + h) * D + c]) > 1e-5 + 1e-5 * std::fabs(o)) {
                    std::printf("attention differs: %g against %g\n", out[(b * H + h) * D + c], o);
                    return false;
                }
            }
        }
    return true;
}

int main() {
    bool ok = check_attention();
    for (int type = 0; type < kTypes; ++type) ok = check_type(type) && check_refined(type) && ok;
    ok = check_alone(kF16) && check_alone(kBF16) && ok;
    std::printf("%s %s\n", ok ? "ok" : "FAILED", llmcli_variant());
    return ok ? 0 : 1;
}
