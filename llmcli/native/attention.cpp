// Decoding's one-query attention over a float32 KV cache.
#if defined(__AVX2__) && defined(__FMA__)
// e^x for 8 floats (Cephes' polynomial, as in avx_mathfun): relative error ~1e-7; below -87, ~1e-38
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.f)), _mm256_set1_ps(-87.f));  // 2^n stays a normal float
    __m256 fx = _mm256_round_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(0x7f)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

static inline float dot_f32(const float* a, const float* b, int64_t n) {
    int64_t i = 0; float s = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (; i + 32 <= n; i += 32)  // four independent chains: one would wait on each multiply-add
        for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * j), _mm256_loadu_ps(b + i + 8 * j), acc[j]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[0]);
    s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
#endif
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

// o[0..D) = sum over s of w[s] * V[s * stride + 0..D): 64 columns at a time held in registers
static inline void weighted_rows(const float* w, const float* V, int64_t stride, int64_t S, int64_t D, float* o) {
    int64_t c = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; c + 64 <= D; c += 64) {
        __m256 acc[8];
        for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
        for (int64_t s = 0; s < S; ++s) {
            const __m256 ws = _mm256_set1_ps(w[s]); const float* vr = V + s * stride + c;
            for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(ws, _mm256_loadu_ps(vr + 8 * j), acc[j]);
        }
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(o + c + 8 * j, acc[j]);
    }
#endif
    for (; c < D; ++c) {
        float acc = 0.f;
        for (int64_t s = 0; s < S; ++s) acc += w[s] * V[s * stride + c];
        o[c] = acc;
    }
}

// p[0..S) = exp(p - max), returns their sum
static inline float exp_shifted(float* p, int64_t S, float mx) {
    int64_t s = 0; float sum = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (; s + 8 <= S; s += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + s), _mm256_set1_ps(mx)));
        _mm256_storeu_ps(p + s, e); acc = _mm256_add_ps(acc, e);
    }
    sum = hsum(acc);
#endif
    for (; s < S; ++s) { p[s] = std::exp(p[s] - mx); sum += p[s]; }
    return sum;
}

// One head's attention for one query: scores against S keys (rows `ks` floats apart), softmax,
// weighted sum of S values (rows `vs` apart) into out[0..D). p: S floats of scratch; keys where
// mask[s] is false get no weight (mask may be null).
static inline void attend_head(const float* qv, const float* kb, int64_t ks, const float* vb, int64_t vs,
                               int64_t S, int64_t D, const bool* mask, float scale, float* p, float* out) {
    float mx = -INFINITY;
    for (int64_t s = 0; s < S; ++s) {
        const float dot = dot_f32(qv, kb + s * ks, D);
        p[s] = (mask && !mask[s]) ? -INFINITY : dot * scale;
        mx = std::max(mx, p[s]);
    }
    const float inv = 1.f / exp_shifted(p, S, mx);
    for (int64_t s = 0; s < S; ++s) p[s] *= inv;
    weighted_rows(p, vb, vs, S, D, out);
}

// One query per row against a float32 KV cache: q (B, H, 1, D), k and v (B, KV, S, D) with rows of D
// contiguous, mask (1 or B, S) bool or empty -> (B, H, 1, D) float32. Each head's scores, softmax
// and weighted sum of values in one pass over its keys, no temporaries beyond S floats.
torch::Tensor attend_one(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor mask, double scale) {
    TORCH_CHECK(k.scalar_type() == torch::kFloat && v.scalar_type() == torch::kFloat, "float32 cache only");
    TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1, "cache rows must be contiguous");
    auto qf = q.to(torch::kFloat).contiguous();
    const int64_t B = q.size(0), H = q.size(1), D = q.size(3), KV = k.size(1), S = k.size(2), G = H / KV;
    auto out = torch::empty({B, H, 1, D}, qf.options());
    const bool masked = mask.numel() > 0;
    auto m = masked ? mask.to(torch::kBool).contiguous() : mask;
    const int64_t mrows = masked ? m.size(0) : 0;
    const float* Q = qf.data_ptr<float>(); float* O = out.data_ptr<float>();
    const float* Kp = k.data_ptr<float>(); const float* Vp = v.data_ptr<float>();
    const bool* Mp = masked ? m.data_ptr<bool>() : nullptr;
    const int64_t kb0 = k.stride(0), kb1 = k.stride(1), ks = k.stride(2), vb0 = v.stride(0), vb1 = v.stride(1), vs = v.stride(2);
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, S * D));
    at::parallel_for(0, B * H, grain, [&](int64_t begin, int64_t end) {
        std::vector<float> p(S);
        for (int64_t bh = begin; bh < end; ++bh) {
            const int64_t b = bh / H, g = bh % H / G;
            attend_head(Q + bh * D, Kp + b * kb0 + g * kb1, ks, Vp + b * vb0 + g * vb1, vs, S, D,
                        masked ? Mp + (mrows == 1 ? 0 : b) * S : nullptr, (float)scale, p.data(), O + bh * D);
        }
    });
    return out;
}
