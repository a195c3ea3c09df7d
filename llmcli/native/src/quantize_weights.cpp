// Weights quantized at load straight into GGUF blocks: rows of floats (float32, bfloat16 or float16,
// as a safetensors file holds them) -> Q8_0, Q4_1 or Q4_0 blocks with min/max scales, byte for byte
// what llmcli's Python quantizer gives (quant/primitives.py quantize(search=False), then
// quant/gguf_encode.py to_blocks), without its float32 temporaries:
//
//   Q8_0  peak = the value of largest magnitude (the positive one of a tie); s = peak / -127,
//         rounded to bfloat16; q = round(x * (1 / s)) in -127..127; d = s as float16
//   Q4_0  the same with peak / -8 and q = round(x * (1 / s)) + 8 in 0..15
//   Q4_1  s = (max - min) / 15 and z = min + 8 s, each rounded to bfloat16;
//         q = round((x - z) * (1 / s)) + 8 in 0..15; d = s, m = z - 8 s as float16
//
// Rounding is to nearest even, every product and sum rounded to float32 on its own (as torch's
// elementwise ops; the build has -ffp-contract=off). A scale of 0 gives codes 0 (or 8). A d or m
// beyond float16's range makes the call return 2 (the caller keeps llmcli's own layout then, as
// quant/held.py's as_held does).
#include <atomic>
#include <type_traits>
#include <cmath>
#include <cstring>

#include "api.h"
#include "blocks.h"
#include "half.h"
#include "kernels.h"
#include "vec.h"

namespace {

float bf16_round(float f) {  // to the nearest bfloat16, ties to even, as torch's .to(torch.bfloat16)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return f;  // NaN
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&f, &u, 4);
    return f;
}

// 32 values of `dtype` (0 float32, 1 bfloat16, 2 float16) as floats, exactly
template <int D>
void load32(const void* x, int64_t i0, float* v) {
    for (int j = 0; j < 32; j += kVW) {
        if constexpr (D == 0) vstore(v + j, vload(static_cast<const float*>(x) + i0 + j));
        else if constexpr (D == 1) vstore(v + j, vload_bf16(static_cast<const uint16_t*>(x) + i0 + j));
        else vstore(v + j, vload_half(static_cast<const uint16_t*>(x) + i0 + j));
    }
}

// false where f is beyond float16's range
bool put_half(uint8_t* p, float f) {
    const uint16_t h = float_to_half(f);
    std::memcpy(p, &h, 2);
    return (h & 0x7c00) != 0x7c00 || !std::isfinite(f);
}

// codes[j] = round((v[j] - z) * inv) + add, clamped to [lo, hi]: the subtraction and the product each
// rounded once (vfma with an exact other half: times -1, plus 0), then rounded to even
void levels(const float* v, float z, float inv, float add, float lo, float hi, float* codes) {
    const vf vz = vset1(z), vi = vset1(inv), va = vset1(add), vlo = vset1(lo), vhi = vset1(hi), zero = vset1(0.f),
             minus = vset1(-1.f);
    for (int j = 0; j < 32; j += kVW) {
        const vf d = vfma(vz, minus, vload(v + j));  // v - z
        const vf q = vround(vfma(d, vi, zero));      // (v - z) * inv, to even
        vstore(codes + j, vmin(vhi, vmax(vlo, vfma(q, vset1(1.f), va))));  // + add (exact: small integers)
    }
}

// One block of 32 values at x[i0..i0+32) of `dtype` into `out` (its type's bytes); false where its
// scale (or m) is beyond float16's range
template <int D>
bool quantize_one(const void* x, int64_t i0, int type, uint8_t* out) {
    alignas(64) float v[32], c[32];
    load32<D>(x, i0, v);
    vf lo_v = vload(v), hi_v = lo_v;
    for (int j = kVW; j < 32; j += kVW) lo_v = vmin(lo_v, vload(v + j)), hi_v = vmax(hi_v, vload(v + j));
    alignas(64) float los[kVW], his[kVW];
    vstore(los, lo_v);
    vstore(his, hi_v);
    float lo = los[0], hi = his[0];
    for (int j = 1; j < kVW; ++j) lo = los[j] < lo ? los[j] : lo, hi = his[j] > hi ? his[j] : hi;
    if (type == kQ4_1) {
        const float span = hi - lo;
        const float s = bf16_round(span == 0.f ? 0.f : span / 15.f);
        const float z = bf16_round(lo + 8.f * (span == 0.f ? 0.f : span / 15.f));
        const bool ok = put_half(out, s) & put_half(out + 2, z - 8.f * s);
        levels(v, z, s == 0.f ? 0.f : 1.f / s, 8.f, 0.f, 15.f, c);
        for (int j = 0; j < 16; ++j) out[4 + j] = (uint8_t)((uint8_t)c[j] | ((uint8_t)c[j + 16] << 4));
        return ok;
    }
    const bool q8 = type == kQ8_0;
    const float peak = -lo > hi ? lo : hi;
    const float s = bf16_round(peak == 0.f ? 0.f : peak / (q8 ? -127.f : -8.f));
    const bool ok = put_half(out, s);
    if (q8) {
        levels(v, 0.f, s == 0.f ? 0.f : 1.f / s, 0.f, -127.f, 127.f, c);
        for (int j = 0; j < 32; ++j) out[2 + j] = (uint8_t)(int8_t)c[j];
    } else {
        levels(v, 0.f, s == 0.f ? 0.f : 1.f / s, 8.f, 0.f, 15.f, c);
        for (int j = 0; j < 16; ++j) out[2 + j] = (uint8_t)((uint8_t)c[j] | ((uint8_t)c[j + 16] << 4));
    }
    return ok;
}

}  // namespace

extern "C" {

LLMCLI_API int llmcli_quantize_weights(const void* x, int dtype, int64_t N, int64_t K, int type, uint8_t* out,
                                       int threads) {
    if ((type != kQ8_0 && type != kQ4_1 && type != kQ4_0) || dtype < 0 || dtype > 2 || K % 32 || N < 0) return 1;
    const int64_t nb = K / 32, bytes = type == kQ8_0 ? 34 : type == kQ4_1 ? 20 : 18;
    std::atomic<bool> in_range{true};
    std::vector<Stage> stages{{N, 1, [&](int, int64_t lo, int64_t hi) {
        bool ok = true;
        const auto rows = [&](auto d) {
            for (int64_t n = lo; n < hi; ++n)
                for (int64_t b = 0; b < nb; ++b)
                    ok &= quantize_one<decltype(d)::value>(x, n * K + 32 * b, type, out + (n * nb + b) * bytes);
        };
        if (dtype == 1) rows(std::integral_constant<int, 1>());
        else if (dtype == 2) rows(std::integral_constant<int, 2>());
        else rows(std::integral_constant<int, 0>());
        if (!ok) in_range = false;
    }, {}}};
    shared_team(threads)->run(stages);
    return in_range ? 0 : 2;
}

}  // extern "C"
