// A whole decode step of a Llama-family model whose projections are GGUF blocks, for one token, in
// one call: no dispatcher, graph or Python between its ~300 small operations (native_step.py).
// Per layer: RMSNorm -> q, k, v -> (q/k norm) -> RoPE -> cache write -> attention -> o -> residual
// -> RMSNorm -> gate, up -> SiLU(gate) * up -> down -> residual; then the final norm and the output
// projection. Five stages a layer share their rows or heads among the team's threads (team.h); the
// element-wise work between them (a few thousand floats) is the `then` of the stage before.
#include <memory>
#include <string>

#include "api.h"
#include "kernels.h"
#include "vec.h"

using Group = std::vector<LlmcliProjection>;  // projections of one input, outputs side by side

static int64_t rows_of(const Group& g) {
    int64_t n = 0;
    for (const auto& p : g) n += p.N;
    return n;
}

// out[lo, hi) of the group's outputs (plus biases), from activation x (as floats and quantized)
static void project_rows(const Group& g, const Q8Rows& xq, const float* xf, float* out, int64_t lo, int64_t hi) {
    int64_t base = 0;
    for (const auto& p : g) {
        const int64_t b = std::max(lo, base) - base, e = std::min(hi, base + p.N) - base;
        if (b < e) {
            project((int)p.type, p.blocks, p.K, xq, xf, 1, out + base, p.N, b, e);
            if (p.bias)
                for (int64_t n = b; n < e; ++n) out[base + n] += p.bias[n];
        }
        base += p.N;
    }
}

// An activation vector: its floats, and quantized for the block kernels
struct Activation {
    std::vector<float> x;
    Q8Rows q;
    void resize(int64_t n) { x.resize(n); q.resize(1, n); }
    void quantize() { q.quantize(x.data(), 0, 1); }
};

struct Layer {
    LlmcliLayer spec;
    Group qkv, o, gate_up, down;
};

class DecodeSteps {
  public:
    DecodeSteps(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, float eps, float scale, int threads)
        : H(heads), KV(kv_heads), D(head_dim), R(rotary_dim), eps(eps), scale(scale), team(threads) {}

    bool add_layer(const LlmcliLayer& s) {
        Layer l{s, Group(s.qkv, s.qkv + s.n_qkv), Group(s.o, s.o + s.n_o), Group(s.gate_up, s.gate_up + s.n_gate_up),
                Group(s.down, s.down + s.n_down)};
        if (!layers.empty() && (rows_of(l.down) != hidden || rows_of(l.gate_up) != 2 * inter)) return false;
        hidden = rows_of(l.down);
        inter = rows_of(l.gate_up) / 2;
        max_len = layers.empty() ? s.max_len : std::min(max_len, s.max_len);
        layers.push_back(std::move(l));
        return true;
    }

    void set_head(const float* norm, Group h) { final_norm = norm; head = std::move(h); }

    // x (hidden,) the token's embedding -> logits (vocab,), the final normed hidden state (hidden,).
    // Its keys and values go to cache slot `slot`; cos, sin (R,) are the RoPE tables for its position.
    bool run(const float* x_in, int64_t slot, const float* cos, const float* sin, float* logits, float* normed) {
        if (layers.empty() || head.empty() || slot < 0 || slot >= max_len) return false;
        x.assign(x_in, x_in + hidden);
        a.resize(hidden); a_attn.resize(H * D); a_mlp.resize(inter);
        qkv.resize((H + 2 * KV) * D); gu.resize(2 * inter); y.resize(hidden);
        scores.resize(team.size());
        for (auto& p : scores) p.resize(slot + 1);
        slot_ = slot; cs = cos; sn = sin;

        std::vector<Stage> stages;
        stages.reserve(5 * layers.size() + 1);
        for (size_t i = 0; i < layers.size(); ++i) {
            const Layer& l = layers[i];
            const float* next_norm = i + 1 < layers.size() ? layers[i + 1].spec.in_norm : final_norm;
            stages.push_back({rows_of(l.qkv), 16, [this, &l](int, int64_t lo, int64_t hi) {
                project_rows(l.qkv, a.q, a.x.data(), qkv.data(), lo, hi);
            }, [this, &l] { place_heads(l); }});
            stages.push_back({H, 1, [this, &l](int t, int64_t lo, int64_t hi) { attend(l, t, lo, hi); },
                              [this] { a_attn.quantize(); }});
            stages.push_back({hidden, 16, [this, &l](int, int64_t lo, int64_t hi) {  // x += o(attn), each row by one thread
                project_rows(l.o, a_attn.q, a_attn.x.data(), y.data(), lo, hi);
                for (int64_t n = lo; n < hi; ++n) x[n] += y[n];
            }, [this, &l] { rms_norm(x.data(), l.spec.post_norm, hidden, eps, a.x.data()); a.quantize(); }});
            stages.push_back({2 * inter, 16, [this, &l](int, int64_t lo, int64_t hi) {
                project_rows(l.gate_up, a.q, a.x.data(), gu.data(), lo, hi);
            }, [this] {
                std::copy(gu.begin(), gu.begin() + inter, a_mlp.x.begin());
                silu_mul(a_mlp.x.data(), gu.data() + inter, inter);
                a_mlp.quantize();
            }});
            stages.push_back({hidden, 16, [this, &l](int, int64_t lo, int64_t hi) {  // x += down(silu(gate) * up)
                project_rows(l.down, a_mlp.q, a_mlp.x.data(), y.data(), lo, hi);
                for (int64_t n = lo; n < hi; ++n) x[n] += y[n];
            }, [this, next_norm] { rms_norm(x.data(), next_norm, hidden, eps, a.x.data()); a.quantize(); }});
        }
        stages.push_back({rows_of(head), 64, [this, logits](int, int64_t lo, int64_t hi) {
            project_rows(head, a.q, a.x.data(), logits, lo, hi);
        }, {}});

        rms_norm(x.data(), layers[0].spec.in_norm, hidden, eps, a.x.data());
        a.quantize();
        team.run(stages);
        std::copy(a.x.begin(), a.x.end(), normed);  // the final norm's output, which the head read
        return true;
    }

  private:
    const int64_t H, KV, D, R;
    const float eps, scale;
    int64_t hidden = 0, inter = 0, max_len = 0;
    std::vector<Layer> layers;
    const float* final_norm = nullptr;
    Group head;
    Team team;
    // one run's state, shared by the team's threads
    std::vector<float> x, qkv, gu, y;
    Activation a, a_attn, a_mlp;
    std::vector<std::vector<float>> scores;  // each thread's
    int64_t slot_ = 0;
    const float *cs = nullptr, *sn = nullptr;

    // q/k norms and RoPE on the new q and k heads; the new k and v rows to the cache
    void place_heads(const Layer& l) {
        const LlmcliLayer& s = l.spec;
        for (int64_t h = 0; h < H + KV; ++h) {
            float* v = qkv.data() + h * D;
            const float* norm = h < H ? s.q_norm : s.k_norm;
            if (norm) rms_norm(v, norm, D, eps, v);
            rope(v, cs, sn, R);
            if (h >= H) {
                const int64_t g = h - H;
                std::copy(v, v + D, s.k_cache + g * s.k_strides[0] + slot_ * s.k_strides[1]);
                const float* vv = qkv.data() + (H + KV + g) * D;
                std::copy(vv, vv + D, s.v_cache + g * s.v_strides[0] + slot_ * s.v_strides[1]);
            }
        }
    }

    void attend(const Layer& l, int t, int64_t lo, int64_t hi) {
        const LlmcliLayer& s = l.spec;
        const int64_t first = s.window > 0 ? std::max<int64_t>(0, slot_ - s.window + 1) : 0, S = slot_ + 1 - first;
        for (int64_t h = lo; h < hi; ++h) {
            const int64_t g = h / (H / KV);
            attend_head(qkv.data() + h * D, s.k_cache + g * s.k_strides[0] + first * s.k_strides[1], s.k_strides[1],
                        s.v_cache + g * s.v_strides[0] + first * s.v_strides[1], s.v_strides[1], S, D, nullptr, scale,
                        scores[t].data(), a_attn.x.data() + h * D);
        }
    }
};

extern "C" {

LLMCLI_API void* llmcli_steps_new(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, float eps,
                                  float scale, int threads) {
    if (heads <= 0 || kv_heads <= 0 || heads % kv_heads || rotary_dim % 2 || rotary_dim > head_dim) return nullptr;
    return new DecodeSteps(heads, kv_heads, head_dim, rotary_dim, eps, scale, threads);
}

LLMCLI_API int llmcli_steps_add_layer(void* steps, const LlmcliLayer* layer) {
    return static_cast<DecodeSteps*>(steps)->add_layer(*layer) ? 0 : 1;
}

LLMCLI_API int llmcli_steps_set_head(void* steps, const float* norm, const LlmcliProjection* head, int64_t n_head) {
    static_cast<DecodeSteps*>(steps)->set_head(norm, Group(head, head + n_head));
    return 0;
}

LLMCLI_API int llmcli_steps_run(void* steps, const float* x, int64_t slot, const float* cos, const float* sin,
                                float* logits, float* hidden) {
    return static_cast<DecodeSteps*>(steps)->run(x, slot, cos, sin, logits, hidden) ? 0 : 1;
}

LLMCLI_API void llmcli_steps_free(void* steps) { delete static_cast<DecodeSteps*>(steps); }

}  // extern "C"
