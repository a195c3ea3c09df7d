// GGUF blocks: dequantization, and y = x @ W.T read from the blocks (int8 dot products with AVX2).
// The .cpp files of llmcli/native compile as one translation unit, in native/__init__.py's order.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

static inline float h2f(const uint8_t* p) {
    uint16_t v; std::memcpy(&v, p, 2);
    return static_cast<float>(c10::Half(v, c10::Half::from_bits()));
}

// ggml's get_scale_min_k4: 6-bit scale and min of sub-block j from 12 bytes
static inline void scale_min(int j, const uint8_t* q, float& d, float& m) {
    if (j < 4) { d = q[j] & 63; m = q[j + 4] & 63; }
    else { d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

template <int T> struct Block;

template <> struct Block<0> {  // Q5_0
    static constexpr int size = 32, bytes = 22;
    static inline void deq(const uint8_t* b, float* y) {
        const float d = h2f(b); uint32_t qh; std::memcpy(&qh, b + 2, 4); const uint8_t* qs = b + 6;
        for (int j = 0; j < 16; ++j) {
            y[j] = d * (float)((int)((qs[j] & 15) | (((qh >> j) << 4) & 16)) - 16);
            y[j + 16] = d * (float)((int)((qs[j] >> 4) | ((qh >> (j + 12)) & 16)) - 16);
        }
    }
};

template <> struct Block<1> {  // Q5_1
    static constexpr int size = 32, bytes = 24;
    static inline void deq(const uint8_t* b, float* y) {
        const float d = h2f(b), m = h2f(b + 2); uint32_t qh; std::memcpy(&qh, b + 4, 4); const uint8_t* qs = b + 8;
        for (int j = 0; j < 16; ++j) {
            y[j] = d * (float)((qs[j] & 15) | (((qh >> j) << 4) & 16)) + m;
            y[j + 16] = d * (float)((qs[j] >> 4) | ((qh >> (j + 12)) & 16)) + m;
        }
    }
};

template <> struct Block<2> {  // Q5_K
    static constexpr int size = 256, bytes = 176;
    static inline void deq(const uint8_t* b, float* y) {
        const float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t* sc = b + 4; const uint8_t* qh = b + 16; const uint8_t* ql = b + 48;
        for (int c = 0; c < 4; ++c) {
            float s1, m1, s2, m2;
            scale_min(2 * c, sc, s1, m1); scale_min(2 * c + 1, sc, s2, m2);
            const float d1 = d * s1, o1 = dmin * m1, d2 = d * s2, o2 = dmin * m2;
            const int sh1 = 2 * c, sh2 = 2 * c + 1;
            for (int l = 0; l < 32; ++l) {
                y[l] = d1 * (float)((ql[l] & 15) | (((qh[l] >> sh1) & 1) << 4)) - o1;
                y[l + 32] = d2 * (float)((ql[l] >> 4) | (((qh[l] >> sh2) & 1) << 4)) - o2;
            }
            y += 64; ql += 32;
        }
    }
};

template <> struct Block<3> {  // Q6_K
    static constexpr int size = 256, bytes = 210;
    static inline void deq(const uint8_t* b, float* y) {
        const uint8_t* ql = b; const uint8_t* qh = b + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192); const float d = h2f(b + 208);
        for (int h = 0; h < 2; ++h) {
            for (int half = 0; half < 2; ++half) {  // l in 0..15, 16..31: one scale each
                const float s0 = d * sc[half], s1 = d * sc[half + 2], s2 = d * sc[half + 4], s3 = d * sc[half + 6];
                for (int l = 16 * half; l < 16 * half + 16; ++l) {
                    y[l] = s0 * (float)(((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32);
                    y[l + 32] = s1 * (float)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    y[l + 64] = s2 * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    y[l + 96] = s3 * (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
            y += 128; ql += 64; qh += 32; sc += 8;
        }
    }
};

template <> struct Block<4> {  // Q4_0
    static constexpr int size = 32, bytes = 18;
    static inline void deq(const uint8_t* b, float* y) {
        const float d = h2f(b); const uint8_t* qs = b + 2;
        for (int j = 0; j < 16; ++j) { y[j] = d * (float)((qs[j] & 15) - 8); y[j + 16] = d * (float)((qs[j] >> 4) - 8); }
    }
};

template <> struct Block<5> {  // Q4_1
    static constexpr int size = 32, bytes = 20;
    static inline void deq(const uint8_t* b, float* y) {
        const float d = h2f(b), m = h2f(b + 2); const uint8_t* qs = b + 4;
        for (int j = 0; j < 16; ++j) { y[j] = d * (float)(qs[j] & 15) + m; y[j + 16] = d * (float)(qs[j] >> 4) + m; }
    }
};

template <> struct Block<6> {  // Q8_0
    static constexpr int size = 32, bytes = 34;
    static inline void deq(const uint8_t* b, float* y) {
        const float d = h2f(b); const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
        for (int j = 0; j < 32; ++j) y[j] = d * (float)qs[j];
    }
};

template <> struct Block<7> {  // Q4_K
    static constexpr int size = 256, bytes = 144;
    static inline void deq(const uint8_t* b, float* y) {
        const float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t* sc = b + 4; const uint8_t* qs = b + 16;
        for (int c = 0; c < 4; ++c) {  // 64 elements: the low nibbles of 32 bytes, then the high ones
            float s1, m1, s2, m2;
            scale_min(2 * c, sc, s1, m1); scale_min(2 * c + 1, sc, s2, m2);
            for (int l = 0; l < 32; ++l) {
                y[l] = d * s1 * (float)(qs[l] & 15) - dmin * m1;
                y[l + 32] = d * s2 * (float)(qs[l] >> 4) - dmin * m2;
            }
            y += 64; qs += 32;
        }
    }
};

// Calls f(std::integral_constant<int, T>{}) for a runtime type id: the one switch over block types
template <typename F>
static void with_type(int64_t type, F&& f) {
    switch (type) {
        case 0: f(std::integral_constant<int, 0>{}); break;
        case 1: f(std::integral_constant<int, 1>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        case 5: f(std::integral_constant<int, 5>{}); break;
        case 6: f(std::integral_constant<int, 6>{}); break;
        case 7: f(std::integral_constant<int, 7>{}); break;
        default: TORCH_CHECK(false, "unknown GGUF block type");
    }
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LLMCLI_Q8_DOT 1

// Activations as llama.cpp takes them for these types: per row and block of 32, int8 codes with a
// scale d (x ~ d * q) and s = d * sum(q) (for the weights' offsets). The dot products are then
// integer multiply-adds, 32 weights per instruction, instead of float work per weight.
static inline void quantize_block(const float* x, int8_t* q8, float& d_out, float& s_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes packs' lane interleave
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) { v[j] = _mm256_loadu_ps(x + 8 * j); amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j])); }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    __m256i q[4];
    for (int j = 0; j < 4; ++j)  // round half to even, as nearbyint
        q[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], _mm256_set1_ps(id)),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s4 = _mm_hadd_epi32(s4, s4); s4 = _mm_hadd_epi32(s4, s4);
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q8), _mm256_permutevar8x32_epi32(packed, order));
    d_out = d; s_out = d * (float)_mm_cvtsi128_si32(s4);
}

static void quantize_rows(const float* X, int64_t M, int64_t K, int8_t* Q, float* D, float* S) {
    at::parallel_for(0, M * (K / 32), 256, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) quantize_block(X + i * 32, Q + i * 32, D[i], S[i]);
    });
}

static inline __m256i nibbles(const uint8_t* qs) {  // 16 bytes -> 32 codes: low nibbles, then high ones
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

static inline __m256i bytes_from_bits(const uint8_t* p) {  // bit j of 32 -> byte j: 0xFF if set, else 0
    uint32_t x; std::memcpy(&x, p, 4);
    const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bytes = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuffle),
                                          _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

static inline float hsum(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline float f16c(const uint8_t* p) {  // one instruction with F16C (every AVX2 CPU has it)
    uint16_t v; std::memcpy(&v, p, 2);
    return _cvtsh_ss(v);
}

// A 32-block's codes as bytes for maddubs: signed (Q8_0, Q5_0) or 0..15/0..31 (the rest)
template <int T> static constexpr bool signed_codes = T == 6 || T == 0;

template <int T>
static inline __m256i block_codes(const uint8_t* b) {
    if constexpr (T == 6) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    // Q5_0: nibble | 5th bit << 4, minus 16 = nibble - 16 where the bit is 0
    if constexpr (T == 0) return _mm256_or_si256(nibbles(b + 6), _mm256_andnot_si256(bytes_from_bits(b + 2), _mm256_set1_epi8((char)0xF0)));
    // Q5_1: nibble | 5th bit << 4, 0..31
    if constexpr (T == 1) return _mm256_or_si256(nibbles(b + 8), _mm256_and_si256(bytes_from_bits(b + 4), _mm256_set1_epi8(0x10)));
    return nibbles(b + (T == 5 ? 4 : 2));
}

// The weights' offset per unit of sum(x): Q4_0 -8d, Q4_1/Q5_1 m, signed codes none
template <int T>
static inline float block_offset(const uint8_t* b, float d) {
    if constexpr (T == 4) return -8.f * d;
    if constexpr (T == 5 || T == 1) return f16c(b + 2);
    return 0.f;
}

// 32 int8 products summed in 8 float lanes: w (codes as block_codes gives them) times y
template <int T>
static inline __m256 dot32(__m256i w, __m256i y) {
    __m256i pr;
    if constexpr (signed_codes<T>) pr = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w));  // |w| times y with w's sign
    else pr = _mm256_maddubs_epi16(w, y);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pr, _mm256_set1_epi16(1)));
}

// Q4_0 (w = d(q - 8)), Q4_1 (w = dq + m), Q5_0, Q5_1, Q8_0 (w = dq): output rows [begin, end) for
// activation rows [m0, m0 + TM): each weight block is decoded once for the TM rows.
template <int T, int TM>
static void q8_dot_rows(const uint8_t* B, const int8_t* Q, const float* D, const float* S, float* O,
                        int64_t m0, int64_t N, int64_t K, int64_t begin, int64_t end) {
    constexpr int bytes = Block<T>::bytes;
    const int64_t nb = K / 32;
    for (int64_t n = begin; n < end; ++n) {
        const uint8_t* row = B + n * nb * bytes;
        __m256 acc[TM]; float off[TM];
        for (int t = 0; t < TM; ++t) { acc[t] = _mm256_setzero_ps(); off[t] = 0.f; }
        for (int64_t k = 0; k < nb; ++k) {
            const uint8_t* b = row + k * bytes;
            const float d = f16c(b), o = block_offset<T>(b, d);
            const __m256i w = block_codes<T>(b);
            for (int t = 0; t < TM; ++t) {
                const int64_t i = (m0 + t) * nb + k;
                const __m256 p = dot32<T>(w, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Q + i * 32)));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * D[i]), p, acc[t]);
                if constexpr (!signed_codes<T>) off[t] += o * S[i];
            }
        }
        for (int t = 0; t < TM; ++t) O[(m0 + t) * N + n] = hsum(acc[t]) + off[t];
    }
}

static inline void prefetch_row(const uint8_t* row, int64_t bytes) {  // the row 4 rows on
    for (int64_t c = 0; c < bytes; c += 64) _mm_prefetch(reinterpret_cast<const char*>(row + 4 * bytes + c), _MM_HINT_T0);
}

// Sums of 4 vectors' int32 lanes: low 128 bits [a0..a3 of m0..m3 summed], high [a4..a7 of m0..m3]
static inline __m256 reduce4(__m256i m0, __m256i m1, __m256i m2, __m256i m3) {
    return _mm256_cvtepi32_ps(_mm256_hadd_epi32(_mm256_hadd_epi32(m0, m1), _mm256_hadd_epi32(m2, m3)));
}

// The same for one activation row (decoding), four blocks a step: their int32 products reduced
// together (hadd) and scaled by one vector, where one block at a time spends a conversion, a
// broadcast and a multiply-add on each. The next rows are prefetched: 1.24x the blocks a second
// streamed from memory (SmolLM2's Q4_1 shapes, one thread), 1.18x from cache.
template <int T>
static void q8_dot_row(const uint8_t* B, const int8_t* Q, const float* D, const float* S, float* O,
                       int64_t K, int64_t begin, int64_t end) {
    constexpr int bytes = Block<T>::bytes;
    const int64_t nb = K / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t n = begin; n < end; ++n) {
        const uint8_t* row = B + n * nb * bytes;
        prefetch_row(row, nb * bytes);
        __m256 acc = _mm256_setzero_ps();
        __m128 off = _mm_setzero_ps();
        int64_t k = 0;
        for (; k + 4 <= nb; k += 4) {
            const uint8_t* b = row + k * bytes;
            __m256i m[4];
            for (int j = 0; j < 4; ++j) {
                const __m256i w = block_codes<T>(b + j * bytes);
                const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Q + (k + j) * 32));
                const __m256i pr = signed_codes<T> ? _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w))
                                                   : _mm256_maddubs_epi16(w, y);
                m[j] = _mm256_madd_epi16(pr, ones);
            }
            const __m256 h = reduce4(m[0], m[1], m[2], m[3]);  // blocks 0..3 over their low 16 codes, then high 16
            uint16_t dh[4];
            for (int j = 0; j < 4; ++j) std::memcpy(&dh[j], b + j * bytes, 2);
            const __m128 dw = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(dh)));
            const __m128 s4 = _mm_mul_ps(dw, _mm_loadu_ps(D + k));
            acc = _mm256_fmadd_ps(h, _mm256_set_m128(s4, s4), acc);
            if constexpr (!signed_codes<T>) {  // the weights' offsets: Q4_0 -8d, Q4_1 and Q5_1 m
                __m128 mw = _mm_mul_ps(dw, _mm_set1_ps(-8.f));
                if constexpr (T != 4) {
                    uint16_t mh[4];
                    for (int j = 0; j < 4; ++j) std::memcpy(&mh[j], b + j * bytes + 2, 2);
                    mw = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mh)));
                }
                off = _mm_fmadd_ps(mw, _mm_loadu_ps(S + k), off);
            }
        }
        float o = 0.f;
        for (; k < nb; ++k) {
            const uint8_t* b = row + k * bytes;
            const float d = f16c(b);
            const __m256 p = dot32<T>(block_codes<T>(b), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Q + k * 32)));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * D[k]), p, acc);
            if constexpr (!signed_codes<T>) o += block_offset<T>(b, d) * S[k];
        }
        __m128 r = _mm_add_ps(off, _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)));
        r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        r = _mm_add_ss(r, _mm_movehdup_ps(r));
        O[n] = _mm_cvtss_f32(r) + o;
    }
}

// Q4_K (w = d*sc*q - dmin*m per sub-block of 32): 8 sub-blocks a 256-block, each one int8 block of x.
template <int TM>
static void q4k_dot_rows(const uint8_t* B, const int8_t* Q, const float* D, const float* S, float* O,
                         int64_t m0, int64_t N, int64_t K, int64_t begin, int64_t end) {
    const int64_t nb = K / 256, nx = K / 32;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int64_t n = begin; n < end; ++n) {
        const uint8_t* row = B + n * nb * 144;
        __m256 acc[TM]; float off[TM];
        for (int t = 0; t < TM; ++t) { acc[t] = _mm256_setzero_ps(); off[t] = 0.f; }
        for (int64_t k = 0; k < nb; ++k) {
            const uint8_t* b = row + k * 144;
            const float d = f16c(b), dmin = f16c(b + 2);
            float sc[8], mn[8];
            for (int j = 0; j < 8; ++j) { scale_min(j, b + 4, sc[j], mn[j]); sc[j] *= d; mn[j] *= dmin; }
            for (int c = 0; c < 4; ++c) {
                const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
                const __m256i w1 = _mm256_and_si256(raw, low4), w2 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                for (int t = 0; t < TM; ++t) {
                    const int64_t i = (m0 + t) * nx + k * 8 + 2 * c;  // x blocks of sub-blocks 2c and 2c + 1
                    const __m256i y1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Q + i * 32));
                    const __m256i y2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Q + (i + 1) * 32));
                    const __m256 p1 = dot32<7>(w1, y1), p2 = dot32<7>(w2, y2);  // unsigned codes
                    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(sc[2 * c] * D[i]), p1, acc[t]);
                    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(sc[2 * c + 1] * D[i + 1]), p2, acc[t]);
                    off[t] -= mn[2 * c] * S[i] + mn[2 * c + 1] * S[i + 1];
                }
            }
        }
        for (int t = 0; t < TM; ++t) O[(m0 + t) * N + n] = hsum(acc[t]) + off[t];
    }
}

// Q6_K: half h (128 weights) of block b as 4 vectors of 32 signed codes q - 32, as Q8_0's: low
// nibbles of ql and 2 bits of qh each
static inline void q6k_codes(const uint8_t* b, int h, __m256i w[4]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3), c32 = _mm256_set1_epi8(32);
    const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
    const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m256i lo[4] = {_mm256_and_si256(l0, low4), _mm256_and_si256(l1, low4),
                           _mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(_mm256_srli_epi16(l1, 4), low4)};
    for (int j = 0; j < 4; ++j)
        w[j] = _mm256_sub_epi8(_mm256_or_si256(lo[j], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), two), 4)), c32);
}

// Q6_K (w = d*sc*(q - 32) per 16, q 6 bits: ql low nibbles/high nibbles + 2 bits of qh): signed codes
// against int8 x with the sign trick; each 32-code vector spans two scales (lanes 0-3, 4-7).
template <int TM>
static void q6k_dot_rows(const uint8_t* B, const int8_t* Q, const float* D, float* O,
                         int64_t m0, int64_t N, int64_t K, int64_t begin, int64_t end) {
    const int64_t nb = K / 256, nx = K / 32;
    for (int64_t n = begin; n < end; ++n) {
        const uint8_t* row = B + n * nb * 210;
        __m256 acc[TM];
        for (int t = 0; t < TM; ++t) acc[t] = _mm256_setzero_ps();
        for (int64_t k = 0; k < nb; ++k) {
            const uint8_t* b = row + k * 210;
            const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
            const float d = f16c(b + 208);
            for (int h = 0; h < 2; ++h) {
                __m256i w[4];
                q6k_codes(b, h, w);
                for (int j = 0; j < 4; ++j) {
                    const __m256i ws = w[j];  // signed, as Q8_0 codes
                    const int8_t* s = sc + 8 * h + 2 * j;
                    const __m256 scale = _mm256_set_m128(_mm_set1_ps(d * s[1]), _mm_set1_ps(d * s[0]));
                    for (int t = 0; t < TM; ++t) {
                        const int64_t i = (m0 + t) * nx + k * 8 + 4 * h + j;
                        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Q + i * 32));
                        const __m256 p = dot32<6>(ws, y);
                        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_set1_ps(D[i])), p, acc[t]);
                    }
                }
            }
        }
        for (int t = 0; t < TM; ++t) O[(m0 + t) * N + n] = hsum(acc[t]);
    }
}

// Q4_K for one activation row, as q8_dot_row: the 8 sub-blocks' products reduced in two vectors
static void q4k_dot_row(const uint8_t* B, const int8_t* Q, const float* D, const float* S, float* O,
                        int64_t K, int64_t begin, int64_t end) {
    const int64_t nb = K / 256;
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int64_t n = begin; n < end; ++n) {
        const uint8_t* row = B + n * nb * 144;
        prefetch_row(row, nb * 144);
        __m256 acc = _mm256_setzero_ps(), off = _mm256_setzero_ps();
        for (int64_t k = 0; k < nb; ++k) {
            const uint8_t* b = row + k * 144;
            alignas(32) float sc[8], mn[8];
            for (int j = 0; j < 8; ++j) scale_min(j, b + 4, sc[j], mn[j]);
            const int8_t* y = Q + k * 256;
            __m256i m[8];
            for (int c = 0; c < 4; ++c) {
                const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
                const __m256i w1 = _mm256_and_si256(raw, low4), w2 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
                m[2 * c] = _mm256_madd_epi16(_mm256_maddubs_epi16(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 64 * c))), ones);
                m[2 * c + 1] = _mm256_madd_epi16(_mm256_maddubs_epi16(w2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 64 * c + 32))), ones);
            }
            const __m256 s = _mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(sc), _mm256_set1_ps(f16c(b))), _mm256_loadu_ps(D + k * 8));
            const __m128 s_lo = _mm256_castps256_ps128(s), s_hi = _mm256_extractf128_ps(s, 1);
            acc = _mm256_fmadd_ps(reduce4(m[0], m[1], m[2], m[3]), _mm256_set_m128(s_lo, s_lo), acc);
            acc = _mm256_fmadd_ps(reduce4(m[4], m[5], m[6], m[7]), _mm256_set_m128(s_hi, s_hi), acc);
            off = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_load_ps(mn), _mm256_set1_ps(f16c(b + 2))), _mm256_loadu_ps(S + k * 8), off);
        }
        O[n] = hsum(acc) - hsum(off);
    }
}

// Q6_K for one activation row: per half of a block, its 4 vectors' products reduced together; the
// low lanes take each vector's first 16 codes (scales 0, 2, 4, 6), the high lanes the next 16
static void q6k_dot_row(const uint8_t* B, const int8_t* Q, const float* D, float* O,
                        int64_t K, int64_t begin, int64_t end) {
    const int64_t nb = K / 256;
    const __m256i ones = _mm256_set1_epi16(1), even_odd = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    for (int64_t n = begin; n < end; ++n) {
        const uint8_t* row = B + n * nb * 210;
        prefetch_row(row, nb * 210);
        __m256 acc = _mm256_setzero_ps();
        for (int64_t k = 0; k < nb; ++k) {
            const uint8_t* b = row + k * 210;
            const float d = f16c(b + 208);
            for (int h = 0; h < 2; ++h) {
                __m256i w[4];
                q6k_codes(b, h, w);
                const int64_t i = k * 8 + 4 * h;  // the x blocks of this half's 4 vectors
                __m256i m[4];
                for (int j = 0; j < 4; ++j) {
                    const __m256i ws = w[j];  // signed, as Q8_0 codes
                    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Q + (i + j) * 32));
                    m[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(ws, ws), _mm256_sign_epi8(y, ws)), ones);
                }
                const __m256 sc = _mm256_permutevar8x32_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                    _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 192 + 8 * h)))), even_odd);
                const __m128 dx = _mm_mul_ps(_mm_loadu_ps(D + i), _mm_set1_ps(d));
                acc = _mm256_fmadd_ps(reduce4(m[0], m[1], m[2], m[3]), _mm256_mul_ps(sc, _mm256_set_m128(dx, dx)), acc);
            }
        }
        O[n] = hsum(acc);
    }
}

template <int T>
static void q8_dot_all(const uint8_t* B, const int8_t* Q, const float* D, const float* S, float* O,
                       int64_t M, int64_t N, int64_t K, int64_t begin, int64_t end) {
    int64_t m = 0;
    if constexpr (T == 3) {
        for (; m + 4 <= M; m += 4) q6k_dot_rows<4>(B, Q, D, O, m, N, K, begin, end);
        for (; m < M; ++m) q6k_dot_row(B, Q + m * K, D + m * (K / 32), O + m * N, K, begin, end);
        return;
    }
    if constexpr (T == 7) {
        for (; m + 4 <= M; m += 4) q4k_dot_rows<4>(B, Q, D, S, O, m, N, K, begin, end);
        for (; m < M; ++m) q4k_dot_row(B, Q + m * K, D + m * (K / 32), S + m * (K / 32), O + m * N, K, begin, end);
        return;
    }
    for (; m + 4 <= M; m += 4) q8_dot_rows<T, 4>(B, Q, D, S, O, m, N, K, begin, end);
    for (; m < M; ++m) q8_dot_row<T>(B, Q + m * K, D + m * (K / 32), S + m * (K / 32), O + m * N, K, begin, end);
}

template <int T>
static void q8_mm(const float* X, const uint8_t* B, float* O, int64_t M, int64_t N, int64_t K) {
    const int64_t nb = K / 32;
    std::vector<int8_t> Q(M * K); std::vector<float> D(M * nb), S(M * nb);
    quantize_rows(X, M, K, Q.data(), D.data(), S.data());
    at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
        q8_dot_all<T>(B, Q.data(), D.data(), S.data(), O, M, N, K, begin, end);
    });
}
#endif

// The float route (Q5_K, and every type without AVX2): output rows [begin, end) of all M rows of x,
// each weight block dequantized once into a buffer and dotted with every row.
template <int T>
static void mm_row_range(const float* X, const uint8_t* B, float* O, int64_t M, int64_t N, int64_t K,
                         int64_t begin, int64_t end) {
    using Bk = Block<T>;
    const int64_t nb = K / Bk::size, rb = nb * Bk::bytes;
    alignas(64) float buf[256];
    std::vector<float> acc(M);
    for (int64_t n = begin; n < end; ++n) {
        std::fill(acc.begin(), acc.end(), 0.f);
        const uint8_t* row = B + n * rb;
        for (int64_t k = 0; k < nb; ++k) {
            Bk::deq(row + k * Bk::bytes, buf);
            const float* xb = X + k * Bk::size;
            for (int64_t m = 0; m < M; ++m) {
                const float* xm = xb + m * K;
                float s = 0.f;
                #pragma omp simd reduction(+:s)
                for (int i = 0; i < Bk::size; ++i) s += buf[i] * xm[i];
                acc[m] += s;
            }
        }
        for (int64_t m = 0; m < M; ++m) O[m * N + n] = acc[m];
    }
}

template <int T>
static void mm_rows(const float* X, const uint8_t* B, float* O, int64_t M, int64_t N, int64_t K) {
    at::parallel_for(0, N, 8, [&](int64_t begin, int64_t end) { mm_row_range<T>(X, B, O, M, N, K, begin, end); });
}

template <int T>
static void deq_rows(const uint8_t* B, float* O, int64_t N, int64_t K) {
    using Bk = Block<T>;
    const int64_t nb = K / Bk::size, rb = nb * Bk::bytes;
    at::parallel_for(0, N, 4, [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n)
            for (int64_t k = 0; k < nb; ++k) Bk::deq(B + n * rb + k * Bk::bytes, O + n * K + k * Bk::size);
    });
}

torch::Tensor mm(torch::Tensor x, torch::Tensor blocks, int64_t type, int64_t K) {
    auto xf = x.to(torch::kFloat).contiguous();
    auto b = blocks.contiguous();
    const int64_t M = xf.size(0), N = b.size(0);
    auto out = torch::empty({M, N}, xf.options());
    const float* X = xf.data_ptr<float>(); const uint8_t* B = b.data_ptr<uint8_t>(); float* O = out.data_ptr<float>();
    with_type(type, [&](auto t) {
        constexpr int T = decltype(t)::value;
#ifdef LLMCLI_Q8_DOT
        if constexpr (T != 2) { q8_mm<T>(X, B, O, M, N, K); return; }  // every type but Q5_K
#endif
        mm_rows<T>(X, B, O, M, N, K);
    });
    return out;
}

torch::Tensor dequantize(torch::Tensor blocks, int64_t type, int64_t K) {
    auto b = blocks.contiguous();
    const int64_t N = b.size(0);
    auto out = torch::empty({N, K}, torch::dtype(torch::kFloat));
    const uint8_t* B = b.data_ptr<uint8_t>(); float* O = out.data_ptr<float>();
    with_type(type, [&](auto t) { deq_rows<decltype(t)::value>(B, O, N, K); });
    return out;
}

