#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <tuple>

// A whole decode step of a Llama-family model whose projections are GGUF blocks, for one token, in
// one call: no dispatcher, graph or Python between its ~300 small operations (native_step.py).
// Per layer: RMSNorm -> q, k, v -> (q/k norm) -> RoPE -> cache write -> attention -> o -> residual
// -> RMSNorm -> gate, up -> SiLU(gate) * up -> down -> residual; then the final norm and the output
// projection. Six stages a layer run on every thread of a Team, sharing rows or heads, and meet at
// barriers; the element-wise work between them (a few thousand floats) each thread repeats for
// itself rather than wait for one to do it.

// A projection y = W x (+ b): W's blocks as stored, (N, row bytes) uint8.
struct Projection {
    torch::Tensor blocks, bias;  // bias (N,) float32, or empty
    int64_t type, N, K;
    const uint8_t* B;
    const float* b;
};

// Projections that read the same input, their outputs side by side (q, k, v: or one fused qkv)
using Group = std::vector<Projection>;

struct DecodeLayer {
    torch::Tensor in_norm, post_norm, q_norm, k_norm, k_cache, v_cache;  // norms (dim,) float32; q/k norm may be empty
    Group qkv, o, gate_up, down;
    int64_t window;  // attend to this many most recent slots (0: all)
};

// x as the block kernels take it: the floats, and per block of 32 int8 codes with a scale and sum.
// Each thread of the step quantizes its own copy (a few microseconds) instead of waiting for one.
struct Activation {
    std::vector<float> x;
    std::vector<int8_t> q;
    std::vector<float> d, s;
    explicit Activation(int64_t K) : x(K), q(K), d(K / 32 + 1), s(K / 32 + 1) {}
    void quantize() {
#ifdef LLMCLI_Q8_DOT
        for (int64_t i = 0; i < (int64_t)x.size() / 32; ++i) quantize_block(x.data() + 32 * i, q.data() + 32 * i, d[i], s[i]);
#endif
    }
};

static int64_t rows_of(const Group& g) {
    int64_t n = 0;
    for (const auto& p : g) n += p.N;
    return n;
}

// out[lo, hi) of the group's outputs side by side (plus biases), from activation a
static void project_rows(const Group& g, const Activation& a, float* out, int64_t lo, int64_t hi) {
    int64_t base = 0;
    for (const auto& p : g) {
        const int64_t b = std::max(lo, base) - base, e = std::min(hi, base + p.N) - base;
        if (b < e) {
            with_type(p.type, [&](auto t) {
                constexpr int T = decltype(t)::value;
#ifdef LLMCLI_Q8_DOT
                if constexpr (T != 2) {
                    q8_dot_all<T>(p.B, a.q.data(), a.d.data(), a.s.data(), out + base, 1, p.N, p.K, b, e);
                    return;
                }
#endif
                mm_row_range<T>(a.x.data(), p.B, out + base, 1, p.N, p.K, b, e);
            });
            if (p.b)
                for (int64_t n = b; n < e; ++n) out[base + n] += p.b[n];
        }
        base += p.N;
    }
}

// The step's threads: the caller is member 0, the others wait for work spinning (Python samples the
// next token meanwhile, a fraction of a millisecond) and then asleep. Stages meet at spin barriers,
// ~0.1 us, where forking torch's pool for each of a token's ~180 parallel stages costs more and
// splits rows in fixed halves: here threads take chunks of rows as they come free, so one thread
// held up by the machine does not stall the other.
class Team {
  public:
    explicit Team(int n) : n_(std::max(1, n)) {
        for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { serve(i); });
    }
    ~Team() {
        { std::lock_guard<std::mutex> g(m_); stop_ = true; gen_.fetch_add(1); }
        cv_.notify_all();
        for (auto& t : workers_) t.join();
    }

    // f(thread index) on every member, which share() rows in at most `stages` stages; returns when all are done
    void run(int64_t stages, const std::function<void(int)>& f) {
        std::lock_guard<std::mutex> one_at_a_time(run_);
        if ((int64_t)counters_.size() < stages) counters_ = std::vector<std::atomic<int64_t>>(stages);
        for (auto& c : counters_) c.store(0, std::memory_order_relaxed);
        job_ = &f;
        pending_.store(n_ - 1, std::memory_order_relaxed);
        { std::lock_guard<std::mutex> g(m_); gen_.fetch_add(1, std::memory_order_release); }
        cv_.notify_all();
        f(0);
        for (int spins = 0; pending_.load(std::memory_order_acquire) > 0; ++spins) wait_a_little(spins);
    }

    void barrier() {
        const int phase = phase_.load(std::memory_order_relaxed);
        if (arrived_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
            arrived_.store(0, std::memory_order_relaxed);
            phase_.store(phase + 1, std::memory_order_release);
        } else {
            for (int spins = 0; phase_.load(std::memory_order_acquire) == phase; ++spins) wait_a_little(spins);
        }
    }

    // Rows [0, n) handed out in chunks (multiples of `align`, about eight a thread) to whichever
    // thread asks; every thread calls it for each stage in the same order (`stage` counts them),
    // then meets the others at a barrier. Chunks of 16 rows cost each token ~11k grabs of a shared
    // counter, and the cache line bouncing between cores took longer than the second thread gained.
    template <class F>
    void share(int64_t& stage, int64_t n, int64_t align, F&& f) {
        const int64_t chunk = std::max<int64_t>(1, (n + 8 * n_ * align - 1) / (8 * n_ * align)) * align;
        auto& next = counters_[stage++];
        for (int64_t lo; (lo = next.fetch_add(chunk, std::memory_order_relaxed)) < n;) f(lo, std::min(n, lo + chunk));
    }

  private:
    static void pause() {
#if defined(__x86_64__) || defined(_M_X64)
        _mm_pause();
#endif
    }

    // Spin, then give the CPU away: with more threads than free CPUs, the thread waited for may be
    // the one this CPU should run.
    static void wait_a_little(int spins) {
        if (spins < 4096) pause();
        else std::this_thread::yield();
    }

    void serve(int i) {
        uint64_t seen = 0;
        for (;;) {
            const auto start = std::chrono::steady_clock::now();
            for (int spins = 0; gen_.load(std::memory_order_acquire) == seen; ++spins) {
                pause();
                if (spins % 1024 == 0 && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(2)) {
                    std::unique_lock<std::mutex> lk(m_);
                    cv_.wait(lk, [&] { return gen_.load() != seen; });
                }
            }
            seen = gen_.load(std::memory_order_acquire);
            if (stop_) return;
            (*job_)(i);
            pending_.fetch_sub(1, std::memory_order_release);
        }
    }

    const int n_;
    std::vector<std::thread> workers_;
    std::mutex m_, run_;
    std::condition_variable cv_;
    std::atomic<uint64_t> gen_{0};
    std::atomic<int> pending_{0}, arrived_{0}, phase_{0};
    const std::function<void(int)>* job_ = nullptr;
    bool stop_ = false;
    std::vector<std::atomic<int64_t>> counters_;
};

// y = x * rsqrt(mean(x^2) + eps) * w, in float32 as models/llama.py's RMSNorm
static void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += (double)x[i] * x[i];
    const float r = 1.f / std::sqrt((float)(ss / n) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
}

// RoPE in the half-split layout: channel i < R/2 turns with channel i + R/2; channels >= R pass
static void rope(float* v, const float* cs, const float* sn, int64_t R) {
    const int64_t half = R / 2;
    for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
    }
}

// g[i] = silu(g[i]) * u[i]
static void silu_mul(float* g, const float* u, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = exp8(_mm256_xor_ps(x, sign));  // e^-x
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

class DecodeSteps {
  public:
    DecodeSteps(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, double eps, double scale,
                int64_t threads)
        : H(heads), KV(kv_heads), D(head_dim), R(rotary_dim), eps((float)eps), scale((float)scale), team((int)threads) {
        TORCH_CHECK(H % KV == 0 && R % 2 == 0 && R <= D, "inconsistent shapes");
    }

    // One projection: (blocks, GGUF type id, K, bias or an empty tensor)
    using Spec = std::tuple<torch::Tensor, int64_t, int64_t, torch::Tensor>;

    void add_layer(torch::Tensor in_norm, std::vector<Spec> qkv, torch::Tensor q_norm, torch::Tensor k_norm,
                   std::vector<Spec> o, torch::Tensor post_norm, std::vector<Spec> gate_up, std::vector<Spec> down,
                   torch::Tensor k_cache, torch::Tensor v_cache, int64_t window) {
        DecodeLayer l;
        l.in_norm = as_floats(in_norm); l.post_norm = as_floats(post_norm);
        l.q_norm = as_floats(q_norm); l.k_norm = as_floats(k_norm);
        l.qkv = group(qkv); l.o = group(o); l.gate_up = group(gate_up); l.down = group(down);
        const int64_t hidden = l.in_norm.numel();
        TORCH_CHECK(rows_of(l.qkv) == (H + 2 * KV) * D && l.qkv[0].K == hidden, "q, k, v do not match the heads");
        TORCH_CHECK(rows_of(l.o) == hidden && l.o[0].K == H * D, "o does not match the heads");
        TORCH_CHECK(rows_of(l.gate_up) % 2 == 0 && l.gate_up[0].K == hidden && rows_of(l.down) == hidden &&
                    l.down[0].K == rows_of(l.gate_up) / 2, "MLP shapes do not match");
        TORCH_CHECK(layers.empty() || (hidden == layers[0].in_norm.numel() && rows_of(l.gate_up) == rows_of(layers[0].gate_up)),
                    "layers differ in shape");
        for (auto* c : {&k_cache, &v_cache})
            TORCH_CHECK(c->scalar_type() == torch::kFloat && c->dim() == 4 && c->size(0) == 1 && c->size(1) == KV &&
                        c->size(3) == D && c->stride(3) == 1, "the KV cache must be float32 (1, KV, max_len, D)");
        l.k_cache = k_cache; l.v_cache = v_cache; l.window = window;
        layers.push_back(std::move(l));
    }

    // The final norm and output projection
    void set_head(torch::Tensor norm, std::vector<Spec> head) {
        final_norm = as_floats(norm); this->head = group(head);
    }

    // x (hidden,) the token's embedding -> (logits (vocab,), the final normed hidden state (hidden,)).
    // Its keys and values go to cache slot `slot`; cos, sin (R,) are the model's RoPE tables for the
    // token's position (half-split: entries i and i + R/2 are equal).
    std::tuple<torch::Tensor, torch::Tensor> run(torch::Tensor x_in, int64_t slot, torch::Tensor cos, torch::Tensor sin) {
        TORCH_CHECK(!layers.empty() && !head.empty(), "no layers or no head");
        const int64_t hidden = layers[0].in_norm.numel(), inter = rows_of(layers[0].gate_up) / 2;
        TORCH_CHECK(x_in.numel() == hidden && slot >= 0 && slot < layers[0].k_cache.size(2), "bad step");
        auto xt = x_in.to(torch::kFloat).contiguous().clone();
        auto logits = torch::empty({rows_of(head)}, torch::kFloat), normed = torch::empty({hidden}, torch::kFloat);
        float* x = xt.data_ptr<float>();
        TORCH_CHECK(cos.numel() == R && sin.numel() == R, "RoPE tables do not match the rotary dims");
        auto cos_f = cos.to(torch::kFloat).contiguous(), sin_f = sin.to(torch::kFloat).contiguous();
        const float* cs = cos_f.data_ptr<float>(); const float* sn = sin_f.data_ptr<float>();
        std::vector<float> qkv((H + 2 * KV) * D), attn(H * D), gu(2 * inter);
        team.run(6 * (int64_t)layers.size() + 1, [&](int t) {  // six shared stages a layer, then the head
            Activation a(hidden), a_attn(H * D), a_mlp(inter);  // this thread's copies
            std::vector<float> y(hidden), p(slot + 1);  // o's and down's rows, attention's scores
            int64_t stage = 0;
            for (auto& l : layers) {
                rms_norm(x, l.in_norm.data_ptr<float>(), hidden, eps, a.x.data());
                a.quantize();
                team.share(stage, rows_of(l.qkv), 16, [&](int64_t lo, int64_t hi) { project_rows(l.qkv, a, qkv.data(), lo, hi); });
                team.barrier();
                float* K = l.k_cache.data_ptr<float>(); float* V = l.v_cache.data_ptr<float>();
                const int64_t ks1 = l.k_cache.stride(1), ks = l.k_cache.stride(2), vs1 = l.v_cache.stride(1), vs = l.v_cache.stride(2);
                team.share(stage, H + KV, 1, [&](int64_t lo, int64_t hi) {  // q heads, then k heads with their v
                    for (int64_t h = lo; h < hi; ++h) {
                        float* v = qkv.data() + h * D;
                        const auto& norm = h < H ? l.q_norm : l.k_norm;
                        if (norm.numel()) rms_norm(v, norm.data_ptr<float>(), D, eps, v);
                        rope(v, cs, sn, R);
                        if (h >= H) {
                            const int64_t g = h - H;
                            std::memcpy(K + g * ks1 + slot * ks, v, D * sizeof(float));
                            std::memcpy(V + g * vs1 + slot * vs, qkv.data() + (H + KV + g) * D, D * sizeof(float));
                        }
                    }
                });
                team.barrier();
                const int64_t lo_slot = l.window > 0 ? std::max<int64_t>(0, slot - l.window + 1) : 0, S = slot + 1 - lo_slot;
                team.share(stage, H, 1, [&](int64_t lo, int64_t hi) {
                    for (int64_t h = lo; h < hi; ++h) {
                        const int64_t g = h / (H / KV);
                        attend_head(qkv.data() + h * D, K + g * ks1 + lo_slot * ks, ks, V + g * vs1 + lo_slot * vs, vs, S, D,
                                    nullptr, scale, p.data(), attn.data() + h * D);
                    }
                });
                team.barrier();
                std::memcpy(a_attn.x.data(), attn.data(), H * D * sizeof(float));
                a_attn.quantize();
                team.share(stage, hidden, 16, [&](int64_t lo, int64_t hi) {  // x += o(attn), each row by one thread
                    project_rows(l.o, a_attn, y.data(), lo, hi);
                    for (int64_t n = lo; n < hi; ++n) x[n] += y[n];
                });
                team.barrier();
                rms_norm(x, l.post_norm.data_ptr<float>(), hidden, eps, a.x.data());
                a.quantize();
                team.share(stage, 2 * inter, 16, [&](int64_t lo, int64_t hi) { project_rows(l.gate_up, a, gu.data(), lo, hi); });
                team.barrier();
                std::memcpy(a_mlp.x.data(), gu.data(), inter * sizeof(float));
                silu_mul(a_mlp.x.data(), gu.data() + inter, inter);
                a_mlp.quantize();
                team.share(stage, hidden, 16, [&](int64_t lo, int64_t hi) {  // x += down(silu(gate) * up)
                    project_rows(l.down, a_mlp, y.data(), lo, hi);
                    for (int64_t n = lo; n < hi; ++n) x[n] += y[n];
                });
                team.barrier();
            }
            rms_norm(x, final_norm.data_ptr<float>(), hidden, eps, a.x.data());
            if (t == 0) std::memcpy(normed.data_ptr<float>(), a.x.data(), hidden * sizeof(float));
            a.quantize();
            float* out = logits.data_ptr<float>();
            team.share(stage, rows_of(head), 64, [&](int64_t lo, int64_t hi) { project_rows(head, a, out, lo, hi); });
        });
        return {logits, normed};
    }

  private:
    int64_t H, KV, D, R;
    float eps, scale;
    torch::Tensor final_norm;
    std::vector<DecodeLayer> layers;
    Group head;
    Team team;

    static torch::Tensor as_floats(const torch::Tensor& t) { return t.to(torch::kFloat).contiguous(); }

    static Group group(const std::vector<Spec>& specs) {
        Group g;
        for (const auto& [blocks, type, K, bias] : specs) {
            Projection p{blocks.contiguous(), bias.numel() ? as_floats(bias) : bias, type, blocks.size(0), K, nullptr, nullptr};
            TORCH_CHECK(p.blocks.scalar_type() == torch::kUInt8 && K % 32 == 0, "blocks must be uint8 rows");
            TORCH_CHECK(!p.bias.numel() || p.bias.numel() == p.N, "bias does not match the rows");
            p.B = p.blocks.data_ptr<uint8_t>();
            p.b = p.bias.numel() ? p.bias.data_ptr<float>() : nullptr;
            g.push_back(std::move(p));
        }
        TORCH_CHECK(!g.empty(), "a projection group is empty");
        for (const auto& p : g) TORCH_CHECK(p.K == g[0].K, "a group's projections read inputs of one size");
        return g;
    }
};
