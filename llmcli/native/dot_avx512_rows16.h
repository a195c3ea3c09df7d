// AVX-512 VNNI, 16 weight rows at a time from a copy of the weights interleaved for it (included at
// the end of dot_avx512.h). A decode step keeps such a copy of each projection of the nibble types,
// Q8_0 and the K-quants: vector lane r is weight row r, so one vpdpbusd multiplies 4 codes of 16 rows
// by 4 activation codes broadcast from memory, 8 of them sum a block's (K: a sub-block's) 32 products
// in each lane, and one conversion and one multiply-add scale them, with no sums across lanes at all.
// The same code serves one activation row and several (a batch, a prompt), each row through the
// same operations in the same order, so a row's numbers never depend on the rows beside it.
// Against the blocks as stored (dot_avx512.h), one thread: Q4_1 3072x576 1 row 70 -> 22 us,
// 8 rows 270 -> 93 us (the unpacking, the sums across lanes and the scaling were most of the work).
#pragma once

#define LLMCLI_ROWS16 1
template <int T>
constexpr bool rows16_type = T == kQ4_0 || T == kQ4_1 || T == kQ5_0 || T == kQ5_1 || T == kQ8_0 || T == kQ4_K || T == kQ5_K || T == kQ6_K;
template <int T> constexpr bool rows16_min = has_min<T> || T == kQ4_K || T == kQ5_K;  // a second sum: m * the activation's s

// A block of 16 rows, interleaved (the same bytes as their 16 blocks, laid out again):
//   d[16] f16 | m[16] f16 (Q4_1, Q5_1) | 5th bits (Q5_0, Q5_1): 8 masks of 64 bits | codes
// codes: the nibble types' qs as 4 vectors of 64 bytes, vector p's lane r row r's qs bytes 4p..4p+3
// (so codes 4p..4p+3 in the low nibbles, 16 + 4p.. in the high ones); Q8_0's as 8 vectors, lane r
// row r's codes 4p..4p+3, stored + 128 (unsigned, vpdpbusd's weights side). Mask p (p < 4: codes
// 4p.., else 16 + 4(p - 4)..) has bit 4r + t set where row r's code 4p + t (or 16 + ..) has its 5th bit.
// Q4_K, per block of 256: d[16] f16 | dmin[16] f16 | then each sub-block of 32: sc[16] | m[16] (the
// 6-bit scales and mins, a byte each) | its codes as Q4_1's (low nibbles codes 0-15, high 16-31):
// 16 * 148 bytes, 4 more a row than stored. Q5_K as Q4_K, with each sub-block's 5th bits as masks
// (Q5_0's) between its mins and its codes: 16 * 180 bytes, 4 more a row than stored.
// Q6_K, per block of 256: d[16] f16 | then each 32: sc[2][16] (the int8 scales of its two 16s) |
// the low 4 bits of its codes as Q4_1's | their top 2 bits as 2 vectors H_a: lane r byte t has in
// bits 2k, 2k + 1 those of code 16a + 4k + t (so u[4a + k]'s): 16 * 210 bytes, as stored.
template <int T> constexpr int rows16_min_at = 32;  // the offsets of the parts above
template <int T> constexpr int rows16_bits_at = has_min<T> ? 64 : 32;
template <int T> constexpr int rows16_codes_at = rows16_bits_at<T> + (T == kQ5_0 || T == kQ5_1 ? 64 : 0);
template <int T> constexpr int kKSub = T == kQ5_K ? 32 + 64 + 256 : 32 + 256;  // Q4_K's, Q5_K's sub-block: sc, m, (5th bits,) codes
template <int T> constexpr int kKGroup = 64 + 8 * kKSub<T>;  // their block's: d, dmin, 8 sub-blocks
template <int T> constexpr bool is_k45 = T == kQ4_K || T == kQ5_K;
constexpr int kQ6KSub = 32 + 256 + 128;     // a Q6_K 32's bytes: sc, low bits, top bits
constexpr int kQ6KGroup = 32 + 8 * kQ6KSub;  // a Q6_K block's: d, 8 32s
// The copy's bytes a group of 16 rows takes per 32 weights (and nb 32-blocks a row: bytes a group)
template <int T>
constexpr int64_t rows16_stride = is_k45<T> ? kKGroup<T> / 8 : T == kQ6_K ? kQ6KGroup / 8 : 16 * Block<T>::bytes;
template <int T> static inline int64_t rows16_group_bytes(int64_t nb) { return nb * rows16_stride<T>; }

// Q4_K's or Q5_K's rows row[0..15] (nb 32-blocks a row) -> their interleaved blocks at out
template <int T>
static void rows16_interleave_k45(const uint8_t* const row[16], int64_t nb, uint8_t* out) {
    constexpr int qs_at = T == kQ5_K ? 48 : 16;
    for (int64_t k = 0; k < nb / 8; ++k) {
        uint8_t* o = out + k * kKGroup<T>;
        uint64_t masks[8][8] = {};  // Q5_K: sub-block j's mask p
        for (int r = 0; r < 16; ++r) {
            const uint8_t* blk = row[r] + k * Block<T>::bytes;
            std::memcpy(o + 2 * r, blk, 2);
            std::memcpy(o + 32 + 2 * r, blk + 2, 2);
            uint8_t sc[8], mn[8];
            k_scales(blk + 4, sc, mn);
            for (int j = 0; j < 8; ++j) {
                uint8_t* sub = o + 64 + j * kKSub<T>;
                sub[r] = sc[j];
                sub[16 + r] = mn[j];
                const uint8_t* qs = blk + qs_at + 32 * (j / 2);  // sub-block j: nibble j % 2 of these 32 bytes
                uint8_t packed[16];
                for (int i = 0; i < 16; ++i) {
                    const int lo = j % 2 ? qs[i] >> 4 : qs[i] & 15, hi = j % 2 ? qs[16 + i] >> 4 : qs[16 + i] & 15;
                    packed[i] = (uint8_t)(lo | hi << 4);
                }
                for (int p = 0; p < 4; ++p) std::memcpy(sub + kKSub<T> - 256 + 64 * p + 4 * r, packed + 4 * p, 4);
                if constexpr (T == kQ5_K)  // code l's 5th bit: bit j of qh[l]; mask p bit 4r + t for code 4p + t
                    for (int l = 0; l < 32; ++l) masks[j][l / 4] |= (uint64_t)(blk[16 + l] >> j & 1) << (4 * r + l % 4);
            }
        }
        if constexpr (T == kQ5_K)
            for (int j = 0; j < 8; ++j) std::memcpy(o + 64 + j * kKSub<T> + 32, masks[j], sizeof masks[j]);
    }
}

// Q6_K's rows row[0..15] (nb 32-blocks a row) -> their interleaved blocks at out
static void rows16_interleave_q6k(const uint8_t* const row[16], int64_t nb, uint8_t* out) {
    for (int64_t k = 0; k < nb / 8; ++k) {
        uint8_t* o = out + k * kQ6KGroup;
        for (int r = 0; r < 16; ++r) {
            const uint8_t* blk = row[r] + k * Block<kQ6_K>::bytes;
            std::memcpy(o + 2 * r, blk + 208, 2);
            uint8_t q[256];  // the 6-bit codes in order (Block<kQ6_K>::deq's)
            for (int h = 0; h < 2; ++h) {
                const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
                for (int l = 0; l < 32; ++l) {
                    q[128 * h + l] = (uint8_t)((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4);
                    q[128 * h + l + 32] = (uint8_t)((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4);
                    q[128 * h + l + 64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
                    q[128 * h + l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
                }
            }
            for (int j = 0; j < 8; ++j) {
                uint8_t* sub = o + 32 + j * kQ6KSub;
                const uint8_t* c = q + 32 * j;
                sub[r] = blk[192 + 2 * j];
                sub[16 + r] = blk[192 + 2 * j + 1];
                for (int i = 0; i < 16; ++i) sub[32 + 64 * (i / 4) + 4 * r + i % 4] = (uint8_t)((c[i] & 15) | (c[16 + i] & 15) << 4);
                for (int a = 0; a < 2; ++a)
                    for (int t = 0; t < 4; ++t) {
                        uint8_t top = 0;
                        for (int kk = 0; kk < 4; ++kk) top |= (uint8_t)((c[16 * a + 4 * kk + t] >> 4) << 2 * kk);
                        sub[288 + 64 * a + 4 * r + t] = top;
                    }
            }
        }
    }
}

// The 32-block types' rows row[0..15] (nb blocks a row) -> their interleaved blocks at out
template <int T>
static void rows16_interleave_32(const uint8_t* const row[16], int64_t nb, uint8_t* out) {
    constexpr int bytes = Block<T>::bytes, qs_at = T == kQ4_0 ? 2 : T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : T == kQ5_1 ? 8 : 2;
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t* o = out + b * 16 * bytes;
        uint64_t masks[8] = {};
        for (int r = 0; r < 16; ++r) {
            const uint8_t* blk = row[r] + b * bytes;
            std::memcpy(o + 2 * r, blk, 2);
            if constexpr (has_min<T>) std::memcpy(o + rows16_min_at<T> + 2 * r, blk + 2, 2);
            uint8_t* codes = o + rows16_codes_at<T>;
            if constexpr (T == kQ8_0) {
                for (int p = 0; p < 8; ++p) {
                    uint32_t four;
                    std::memcpy(&four, blk + qs_at + 4 * p, 4);
                    four ^= 0x80808080u;
                    std::memcpy(codes + 64 * p + 4 * r, &four, 4);
                }
            } else {
                for (int p = 0; p < 4; ++p) std::memcpy(codes + 64 * p + 4 * r, blk + qs_at + 4 * p, 4);
            }
            if constexpr (T == kQ5_0 || T == kQ5_1) {
                uint32_t qh;
                std::memcpy(&qh, blk + qs_at - 4, 4);
                for (int p = 0; p < 8; ++p) masks[p] |= (uint64_t)(qh >> 4 * p & 0xF) << 4 * r;  // codes 4p..4p+3
            }
        }
        if constexpr (T == kQ5_0 || T == kQ5_1) std::memcpy(o + rows16_bits_at<T>, masks, sizeof masks);
    }
}

// Rows row[0..15] (blocks of T, nb 32-blocks a row) -> their interleaved blocks at out
template <int T>
static void rows16_interleave(const uint8_t* const row[16], int64_t nb, uint8_t* out) {
    if constexpr (is_k45<T>) rows16_interleave_k45<T>(row, nb, out);
    else if constexpr (T == kQ6_K) rows16_interleave_q6k(row, nb, out);
    else rows16_interleave_32<T>(row, nb, out);
}

// 32-block b of the group at w: where its codes are, its 16 rows' scales d (and for rows16_min
// types their m, as they add: Q4_K's -dmin * m)
template <int T>
static inline const uint8_t* rows16_block(const uint8_t* w, int64_t b) {
    if constexpr (is_k45<T>) return w + b / 8 * kKGroup<T> + 64 + b % 8 * kKSub<T>;
    else if constexpr (T == kQ6_K) return w + b / 8 * kQ6KGroup + 32 + b % 8 * kQ6KSub;
    else return w + b * rows16_stride<T>;
}
static inline __m512 bytes_times(const uint8_t* p, const uint8_t* half, bool sign = false) {  // 16 bytes times 16 float16
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(sign ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v)), _mm512_cvtph_ps(load256(half)));
}
// (Q6_K: half h's, the scale of codes 16h..16h + 15)
template <int T>
static inline __m512 rows16_d(const uint8_t* w, int64_t b, int h = 0) {
    if constexpr (is_k45<T>) return bytes_times(rows16_block<T>(w, b), w + b / 8 * kKGroup<T>);
    else if constexpr (T == kQ6_K) return bytes_times(rows16_block<T>(w, b) + 16 * h, w + b / 8 * kQ6KGroup, true);
    else return _mm512_cvtph_ps(load256(rows16_block<T>(w, b)));
}
template <int T>
static inline __m512 rows16_m(const uint8_t* w, int64_t b) {
    if constexpr (is_k45<T>) {
        const __m512 m = bytes_times(rows16_block<T>(w, b) + 16, w + b / 8 * kKGroup<T> + 32);
        return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(m), _mm512_set1_epi32(INT32_MIN)));  // -m, exactly
    } else {
        return _mm512_cvtph_ps(load256(rows16_block<T>(w, b) + rows16_min_at<T>));
    }
}

static inline __m512i broadcast4(const int8_t* p) { int32_t v; std::memcpy(&v, p, 4); return _mm512_set1_epi32(v); }

// Block b's codes for the 16 rows (o: the interleaved block): u[p] lane r holds row r's codes
// 4p..4p+3 (p < 4) or 16 + 4(p - 4).. (p >= 4), unsigned
template <int T>
static LLMCLI_INLINE void rows16_codes(const uint8_t* o, __m512i u[8]) {
    const uint8_t* codes = o + (is_k45<T> ? kKSub<T> - 256 : T == kQ6_K ? 32 : rows16_codes_at<T>);
    if constexpr (T == kQ8_0) {
        for (int p = 0; p < 8; ++p) u[p] = load512(codes + 64 * p);
    } else {
        const __m512i low4 = _mm512_set1_epi8(0x0F);
        for (int p = 0; p < 4; ++p) {
            const __m512i v = load512(codes + 64 * p);
            u[p] = _mm512_and_si512(v, low4);
            u[p + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        }
        if constexpr (T == kQ6_K) {  // the top 2 bits to bits 4, 5: u | (H_a shifted & 0x30)
            const __m512i top2 = _mm512_set1_epi8(0x30);
            for (int a = 0; a < 2; ++a) {
                const __m512i h = load512(codes + 256 + 64 * a);
                const __m512i at[4] = {_mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 2), h, _mm512_srli_epi16(h, 2)};
                for (int k = 0; k < 4; ++k) u[4 * a + k] = _mm512_ternarylogic_epi32(u[4 * a + k], at[k], top2, 0xF8);  // A | (B & C)
            }
        }
        if constexpr (T == kQ5_0 || T == kQ5_1 || T == kQ5_K) {
            const __m512i fifth = _mm512_set1_epi8(16);
            for (int p = 0; p < 8; ++p) {
                uint64_t m;
                std::memcpy(&m, o + (T == kQ5_K ? 32 : rows16_bits_at<T>) + 8 * p, 8);
                u[p] = _mm512_mask_add_epi8(u[p], (__mmask64)m, u[p], fifth);
            }
        }
    }
}

// The accumulator's start for codes stored with a zero point z (q - z): -z * (the block's codes' sum;
// Q6_K's, whose scales go by 16: half h's)
template <int T> constexpr int rows16_halves = T == kQ6_K ? 2 : 1;
template <int T>
static inline __m512i rows16_start(const Q8& x, int64_t b, int h) {
    constexpr int z = T == kQ4_0 ? 8 : T == kQ5_0 ? 16 : T == kQ8_0 ? 128 : T == kQ6_K ? 32 : 0;
    if constexpr (T == kQ6_K) return _mm512_set1_epi32(z * x.n16[2 * b + h]);
    return z ? _mm512_set1_epi32(z * x.n32[b]) : _mm512_setzero_si512();
}

// The interleaved group of 16 rows at w (nb blocks) against activation rows x[0..C): out[16 * c + r]
// = row r . x[c]. Each (row, activation row) lane: for each block in order, the 32 products summed
// in int32, times (d * the activation's d) added to its sum; Q4_1's, Q5_1's and Q4_K's m * the
// activation's s added to another sum, block by block, then to the first. The activation rows' sums go side by
// side, a vpdpbusd of each in turn: one row's 8 in a row wait on each other (5 cycles each), and the
// scheduler did not look far enough ahead to overlap the rows (8 rows: 1.3x slower so).
// `ahead`: bytes to fetch meanwhile, as many a block as it takes (the next group's, or null).
template <int T, int C>
static void rows16_tile(const uint8_t* w, int64_t nb, const Q8* x, float* out, const uint8_t* ahead) {
    constexpr int bytes = rows16_stride<T>;
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* o = rows16_block<T>(w, b);
        if (ahead)
            for (int at = 0; at < bytes; at += 64) __builtin_prefetch(ahead + b * bytes + at);
        __m512i u[8], s[C];
        rows16_codes<T>(o, u);
        constexpr int H = rows16_halves<T>, P = 8 / H;  // (Q6_K: codes 0-15, then 16-31, each half scaled alone)
#pragma GCC unroll 2
        for (int h = 0; h < H; ++h) {
            for (int c = 0; c < C; ++c) s[c] = rows16_start<T>(x[c], b, h);
#pragma GCC unroll 8
            for (int p = P * h; p < P * h + P; ++p)
#pragma GCC unroll 8
                for (int c = 0; c < C; ++c) s[c] = _mm512_dpbusd_epi32(s[c], u[p], broadcast4(x[c].q + 32 * b + 4 * (p % 4) + 16 * (p / 4)));
            const __m512 d = rows16_d<T>(w, b, h);
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[c]), _mm512_mul_ps(d, _mm512_set1_ps(x[c].d[b])), acc[c]);
        }
    }
    if constexpr (rows16_min<T>) {
        __m512 off[C];
        for (int c = 0; c < C; ++c) off[c] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            const __m512 m = rows16_m<T>(w, b);
#pragma GCC unroll 8
            for (int c = 0; c < C; ++c) off[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(x[c].s[b]), off[c]);
        }
        for (int c = 0; c < C; ++c) acc[c] = _mm512_add_ps(acc[c], off[c]);
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
}
