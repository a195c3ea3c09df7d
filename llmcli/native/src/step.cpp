// The decode step of a Llama-family model (or Gemma 3) whose projections are GGUF blocks, for n tokens
// in one call: no dispatcher, graph or Python between its ~300 small operations (through ctypes:
// native/step.py's Step, which runtime/native_step.py drives).
// The n tokens are the rows of a batch (one token each, at its own slot) or the tokens a speculative
// pass checks (one row, consecutive slots), or both.
// Per layer: RMSNorm -> q, k, v -> (q/k norm) -> RoPE -> cache write -> attention -> o -> (norm) ->
// residual -> RMSNorm -> gate, up -> act(gate) * up -> down -> (norm) -> residual; then the final
// norm and the output projection. Five stages a layer share their rows or heads among the team's
// threads (team.h); each projection reads a weight row once for all n tokens. The qkv projection's
// chunks are whole heads, which the thread that made them norms, turns and puts in the cache (a norm
// over all heads at once, OLMoE's, needs a token's whole q and k: a per-token step after the stage
// norms, turns and places them); each
// attention item quantizes the blocks of the heads it wrote. The other per-token work (norms,
// quantization: a few thousand floats a token) is the `then` of the stage before for one token, a
// stage of its own over the tokens for more (per_token). The head finds each row's largest logits
// as it makes them, where the caller asks (top).
//
// The int8 activations are refined where the step was made so (int8x2: kernels.h's Q8Rows::refined,
// two stored rows a token, whose values project() adds up), each of the three kinds (api.h's
// kRefine*) or none; the stages below see tokens either way.
//
// Every token's numbers are those of a call with that token alone: its activations quantize per row,
// and project(..., alone) takes the one-row kernels, or the row-group kernels that give each row the
// same operations whatever rows come with it, so a batch never changes what a row decodes. F16 and
// BF16 projections read the float activations (the norm's output) as they are, with the same promise
// (half_rows.h); their rows are read as stored, never copied.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>

#include "api.h"
#include "kernels.h"
#include "thread_choice.h"
#include "top_k.h"
#include "vec.h"

// A projection as the step reads it: its blocks, or the caller's copy of them interleaved for the
// variant's row-group kernels (llmcli_interleave, row_groups.h), faster than the blocks as stored for
// one activation row or eight (docs/performance-choices.md)
using Projection = LlmcliProjection;

using Group = std::vector<Projection>;

// f(k, v) with the layer's cache as the pointers it holds: float16 bits, or float32
template <typename F>
static void with_kv(const LlmcliLayer& s, F&& f) {
    if (s.kv_half) f(static_cast<uint16_t*>(s.k_cache), static_cast<uint16_t*>(s.v_cache));
    else f(static_cast<float*>(s.k_cache), static_cast<float*>(s.v_cache));
}
static inline void store_kv(const float* x, uint16_t* to, int64_t n) { to_halves(x, to, n); }  // rounded to nearest even
static inline void store_kv(const float* x, float* to, int64_t n) { std::copy(x, x + n, to); }  // projections of one input, outputs side by side

static int64_t rows_of(const Group& g) {
    int64_t n = 0;
    for (const auto& p : g) n += p.N;
    return n;
}

static unsigned layouts_of(const Group& g) {  // the activation layouts the group's weights read
    unsigned l = 0;
    for (const auto& p : g) l |= p.grouped ? kColsLayout : layout_of((int)p.type);
    return l;
}

// Outputs [lo, hi) of the group (plus biases) for activation rows [m0, m0 + M) (as floats xf and
// quantized xq), into out (M rows, ldo apart)
static void project_rows(const Group& g, const Q8Rows& xq, const float* xf, int64_t m0, int64_t M, float* out,
                         int64_t ldo, int64_t lo, int64_t hi) {
    int64_t base = 0;
    for (const auto& p : g) {
        const int64_t b = std::max(lo, base) - base, e = std::min(hi, base + p.N) - base;
        if (b < e) {
            project((int)p.type, p.blocks, p.K, xq, xf, m0, M, out + base, ldo, b, e, true, p.grouped);
            if (p.bias)
                for (int64_t m = 0; m < M; ++m)
                    for (int64_t n = b; n < e; ++n) out[m * ldo + base + n] += p.bias[n];
        }
        base += p.N;
    }
}

// Activation rows: their floats, and quantized for the block kernels
struct Activation {
    std::vector<float> x;
    Q8Rows q;  // (refined: int8x2, as the step was made)
    int64_t width = 0;
    void resize(int64_t rows, int64_t n) { width = n; x.resize(rows * n); q.resize(rows, n); }
    float* row(int64_t m) { return x.data() + m * width; }
};

// A mixture of experts in place of a layer's MLP (llmcli_step_set_experts): a float32 router, each
// expert's gate and up (one group, outputs side by side, as a dense gate_up) and its down
struct Experts {
    const float* router = nullptr;  // (E, hidden)
    const float* router_bias = nullptr;  // (E,) or null (gpt-oss)
    int64_t used = 0;               // experts a token runs
    bool renormalize = false;       // the chosen experts' probabilities rescaled to sum to one
    std::vector<Group> gate_up, down;
    int64_t inter = 0;
    // a shared expert every token runs beside its chosen ones (Qwen2-MoE), weighted by
    // sigmoid(shared_gate . x): none where shared_gate is null (llmcli_step_set_shared_expert)
    const float* shared_gate = nullptr;  // (hidden)
    Group shared_gate_up, shared_down;
    int64_t shared_inter = 0;
    unsigned shared_down_in = 0;
};

struct Layer {
    LlmcliLayer spec;
    Group qkv, o, gate_up, down;
    unsigned qkv_in, o_in, gate_up_in, down_in;  // the activation layouts each group's weights read
    std::shared_ptr<Experts> experts;  // null: a dense MLP
};

class Step {
  public:
    Step(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, float eps, float scale,
                int64_t act, int threads, int refined)
        : H(heads), KV(kv_heads), D(head_dim), R(rotary_dim), QKV((heads + 2 * kv_heads) * head_dim), act(act),
          eps(eps), scale(scale), team(threads), threads_used(threads) {
        // refined: a mask of the activations made int8x2 (api.h's kRefine*): the layers' norms' outputs
        // (q/k/v, gate/up, the experts' gate/up), the attention's (o), the MLP's (down), the final norm's (head)
        a.q.refined = a_sorted.q.refined = (refined & kRefineNormed) != 0;
        a_attn.q.refined = (refined & kRefineAttention) != 0;
        a_mlp.q.refined = a_moe.q.refined = a_shared.q.refined = (refined & kRefineMlp) != 0;
        a_head.q.refined = (refined & kRefineHead) != 0;
    }

    bool add_layer(const LlmcliLayer& s) {
        Layer l{s, {}, {}, {}, {}, 0, 0, 0, 0, nullptr};
        if (!own(s.qkv, s.n_qkv, l.qkv) || !own(s.o, s.n_o, l.o) || !own(s.gate_up, s.n_gate_up, l.gate_up) ||
            !own(s.down, s.n_down, l.down))
            return false;
        l.qkv_in = layouts_of(l.qkv); l.o_in = layouts_of(l.o); l.gate_up_in = layouts_of(l.gate_up); l.down_in = layouts_of(l.down);
        if (!layers.empty() && (rows_of(l.down) != hidden || rows_of(l.gate_up) != 2 * inter)) return false;
        hidden = rows_of(l.down);
        inter = rows_of(l.gate_up) / 2;
        max_len = layers.empty() ? s.max_len : std::min(max_len, s.max_len);
        cache_rows = layers.empty() ? s.rows : std::min(cache_rows, s.rows);
        local |= s.local_rope != 0;
        layers.push_back(std::move(l));
        return true;
    }

    // See llmcli_step_set_experts (api.h)
    bool set_experts(int64_t layer, const float* router, int64_t n_experts, int64_t used, int64_t renormalize,
                     const LlmcliProjection* ps) {
        if (layer < 0 || layer >= (int64_t)layers.size() || !router || n_experts < 1 || used < 1 || used > n_experts)
            return false;
        Layer& l = layers[layer];
        auto e = std::make_shared<Experts>();
        e->router = router, e->used = used, e->renormalize = renormalize != 0;
        unsigned gu_in = 0, down_in = 0;
        for (int64_t i = 0; i < n_experts; ++i) {
            Group gu, dn;
            const LlmcliProjection* p = ps + 3 * i;
            if (!own(p, 2, gu) || !own(p + 2, 1, dn)) return false;  // (as stored, or interleaved copies)
            const int64_t inter_e = p[0].N;
            if (p[1].N != inter_e || p[0].K != hidden || p[1].K != hidden || p[2].N != hidden || p[2].K != inter_e ||
                (i > 0 && inter_e != e->inter))
                return false;
            e->inter = inter_e;
            gu_in |= layouts_of(gu), down_in |= layouts_of(dn);
            e->gate_up.push_back(std::move(gu));
            e->down.push_back(std::move(dn));
        }
        l.gate_up_in = gu_in, l.down_in = down_in;  // (row layouts, and the columns where a copy reads them)
        l.experts = std::move(e);
        return true;
    }

    // See llmcli_step_set_router_bias (api.h)
    bool set_router_bias(int64_t layer, const float* bias) {
        if (layer < 0 || layer >= (int64_t)layers.size() || !layers[layer].experts) return false;
        layers[layer].experts->router_bias = bias;
        return true;
    }

    // See llmcli_step_set_shared_expert (api.h)
    bool set_shared_expert(int64_t layer, const float* gate, const LlmcliProjection* p) {
        if (layer < 0 || layer >= (int64_t)layers.size() || !layers[layer].experts || !gate) return false;
        Layer& l = layers[layer];
        Experts& e = *l.experts;
        Group gu, dn;
        if (p[0].grouped || p[1].grouped || p[2].grouped || !own(p, 2, gu) || !own(p + 2, 1, dn)) return false;
        const int64_t si = p[0].N;
        if (p[1].N != si || p[0].K != hidden || p[1].K != hidden || p[2].N != hidden || p[2].K != si) return false;
        e.shared_gate = gate, e.shared_inter = si, e.shared_down_in = layouts_of(dn);
        l.gate_up_in |= layouts_of(gu);  // (the normed input, quantized for the experts' and its own rows)
        e.shared_gate_up = std::move(gu), e.shared_down = std::move(dn);
        return true;
    }

    bool set_head(const float* norm, const LlmcliProjection* h, int64_t n) {
        Group g;
        if (!own(h, n, g)) return false;
        final_norm = norm;
        head = std::move(g);
        return true;
    }

    // See llmcli_step_set_embedding and llmcli_step_set_rope (api.h)
    bool set_embedding(const void* table, int type, int64_t rows, float scale) {
        if (!table || rows <= 0 || hidden <= 0 || type < -1 || type >= kTypes || (type >= 0 && hidden % block_size(type)))
            return false;
        emb = static_cast<const uint8_t*>(table);
        emb_type = type;
        emb_rows = rows;
        emb_scale = scale;
        emb_row_bytes = type < 0 ? hidden * 4 : hidden / block_size(type) * block_bytes(type);
        return true;
    }
    bool set_rope(const float* cos, const float* sin, const float* cos_l, const float* sin_l, int64_t L) {
        if (!cos || !sin || L <= 0 || (local && (!cos_l || !sin_l))) return false;
        tables[0] = cos, tables[1] = sin, tables[2] = cos_l, tables[3] = sin_l;
        table_len = L;
        return true;
    }

    // See llmcli_step_run_ids (api.h): 0, 1 (bad arguments), 2 (a position beyond the tables)
    int run_ids(int64_t n, const int64_t* ids, const int64_t* rows, const int64_t* slots, const int64_t* positions,
                int64_t from, float* logits, float* normed, int64_t top, float* top_values, int64_t* top_indices) {
        if (!emb || n < 1) return 1;  // (no tables yet: table_len 0, every position beyond them)
        for (int64_t m = 0; m < n; ++m) {
            if (ids[m] < 0 || ids[m] >= emb_rows) return 1;
            if (positions[m] < 0 || positions[m] >= table_len) return 2;
        }
        x_ids.resize(n * hidden);
        for (int64_t m = 0; m < n; ++m) {  // the embedding rows, as the model's embed gives them
            float* xm = x_ids.data() + m * hidden;
            const uint8_t* row = emb + ids[m] * emb_row_bytes;
            if (emb_type < 0) std::memcpy(xm, row, hidden * sizeof(float));
            else llmcli_dequantize(row, 1, hidden, emb_type, xm, 1);
            if (emb_scale != 1.f)
                for (int64_t i = 0; i < hidden; ++i) xm[i] *= emb_scale;
        }
        for (int t = 0; t < 4; ++t) {  // each token's rows of the RoPE tables
            rope_rows[t].resize(tables[t] ? n * R : 0);
            for (int64_t m = 0; tables[t] && m < n; ++m)
                std::memcpy(rope_rows[t].data() + m * R, tables[t] + positions[m] * R, R * sizeof(float));
        }
        const float* local_cs = tables[2] ? rope_rows[2].data() : nullptr;
        const float* local_sn = tables[3] ? rope_rows[3].data() : nullptr;
        return run(n, x_ids.data(), rows, slots, rope_rows[0].data(), rope_rows[1].data(), local_cs, local_sn, from, logits,
                   normed, top, top_values, top_indices) ? 0 : 1;
    }

    // See llmcli_step_run (api.h)
    bool run(int64_t n, const float* x_in, const int64_t* rows, const int64_t* slots, const float* cos,
             const float* sin, const float* cos_l, const float* sin_l, int64_t from, float* logits, float* normed,
             int64_t top, float* top_values, int64_t* top_indices) {
        if (layers.empty() || head.empty() || n < 1 || from < 0 || from > n || (local && (!cos_l || !sin_l)))
            return false;
        if (top < 0 || top > rows_of(head) || (top > 0 && (!top_values || !top_indices))) return false;
        int64_t longest = 0;
        for (int64_t m = 0; m < n; ++m) {
            if (rows[m] < 0 || rows[m] >= cache_rows || slots[m] < 0 || slots[m] >= max_len) return false;
            longest = std::max(longest, slots[m] + 1);
        }
        N = n; cols_apart = n > 1; rows_ = rows; slots_ = slots; cs = cos; sn = sin; cs_l = cos_l; sn_l = sin_l;
        x.assign(x_in, x_in + n * hidden);
        a.resize(n, hidden); a_attn.resize(n, H * D); a_mlp.resize(n, inter); a_head.resize(n, hidden);
        qkv.resize(n * QKV); gu.resize(n * 2 * inter); y.resize(n * hidden);
        scores.resize(team.size());
        for (auto& p : scores) p.resize(kHeadsAtOnce * longest);
        per_part = heads_a_part(H / KV, n * KV, team.size());
        parts = (H / KV + per_part - 1) / per_part;

        std::vector<Stage> stages;
        stages.reserve(10 * layers.size() + 2);
        const unsigned head_in = layouts_of(head);
        if (n > kColGroup)
            per_token(stages, [this](int64_t m) { norm_in(m, layers[0].spec.in_norm, layers[0].qkv_in); }, &a, layers[0].qkv_in);
        for (size_t i = 0; i < layers.size(); ++i) {
            const Layer& l = layers[i];
            const bool last = i + 1 == layers.size();  // (then the final norm, into the head's own activations)
            const float* next_norm = last ? final_norm : layers[i + 1].spec.in_norm;
            const unsigned next_in = last ? head_in : layers[i + 1].qkv_in;
            // chunks of whole heads: each chunk's heads normed, turned and placed by the thread that made
            // them, from its cache (a stage of its own a layer read the other core's rows, and cost more)
            const bool whole = l.spec.whole_qk_norm != 0;  // (q and k normed whole: after every chunk)
            stages.push_back({rows_of(l.qkv), head_rows, [this, &l, whole](int, int64_t lo, int64_t hi) {
                project_rows(l.qkv, a.q, a.x.data(), 0, N, qkv.data(), QKV, lo, hi);
                if (!whole)
                    for (int64_t m = 0; m < N; ++m) place_heads(l, m, lo / D, hi / D);
            }, {}});
            if (whole) per_token(stages, [this, &l](int64_t m) { place_heads(l, m, 0, H + 2 * KV); });
            // each attention item quantizes the blocks of the heads it wrote, where the o projection
            // reads nothing that takes whole rows; then the rows to their columns
            const bool by_blocks = l.o_in && N <= kColGroup && D % 32 == 0 && Q8Rows::by_blocks(l.o_in);
            std::function<void()> cols;
            if (by_blocks && (l.o_in & kColsLayout)) cols = [this] { a_attn.q.to_cols(0, N); };
            stages.push_back({N * KV * parts, 1, [this, &l, by_blocks](int t, int64_t lo, int64_t hi) {
                attend(l, t, lo, hi, by_blocks);
            }, cols});
            if (!by_blocks && l.o_in)
                per_token(stages, [this, &l](int64_t m) { quantize(a_attn, m, l.o_in); }, &a_attn, l.o_in);
            stages.push_back({hidden, 16, [this, &l](int, int64_t lo, int64_t hi) {
                project_rows(l.o, a_attn.q, a_attn.x.data(), 0, N, y.data(), hidden, lo, hi);
            }, {}});
            per_token(stages, [this, &l](int64_t m) { add_residual(m, l.spec.attn_out_norm); norm_in(m, l.spec.post_norm, l.gate_up_in); },
                      &a, l.gate_up_in);
            if (l.experts) {
                moe_stages(stages, l);
            } else {
                stages.push_back({2 * inter, 16, [this, &l](int, int64_t lo, int64_t hi) {
                    project_rows(l.gate_up, a.q, a.x.data(), 0, N, gu.data(), 2 * inter, lo, hi);
                }, {}});
                per_token(stages, [this, &l](int64_t m) { gate(m, l.down_in); }, &a_mlp, l.down_in);
                stages.push_back({hidden, 16, [this, &l](int, int64_t lo, int64_t hi) {
                    project_rows(l.down, a_mlp.q, a_mlp.x.data(), 0, N, y.data(), hidden, lo, hi);
                }, {}});
            }
            per_token(stages, [this, &l, next_norm, next_in, last](int64_t m) {
                add_residual(m, l.spec.mlp_out_norm);
                norm_in(m, next_norm, next_in, last ? a_head : a);
            }, last ? &a_head : &a, next_in);
        }
        if (from < n) {
            const int64_t vocab = rows_of(head), P = n - from;
            std::function<void()> merge;
            if (top > 0) {
                tops.resize(team.size());
                for (auto& t : tops) {
                    t.resize(P);
                    for (auto& f : t) f.reset(top);
                }
                merge = [this, logits, vocab, P, top, top_values, top_indices] {
                    for (int64_t r = 0; r < P; ++r) {
                        for (size_t t = 1; t < tops.size(); ++t) tops[t][r].merge_into(tops[0][r]);
                        tops[0][r].finish(logits + r * vocab, top_values + r * top, top_indices + r * top);
                    }
                };
            }
            stages.push_back({vocab, 64, [this, logits, from, vocab, P, top](int t, int64_t lo, int64_t hi) {
                project_rows(head, a_head.q, a_head.x.data(), from, P, logits, vocab, lo, hi);
                if (top > 0)  // while the chunk's logits are in this core's cache
                    for (int64_t r = 0; r < P; ++r) tops[t][r].offer(logits + r * vocab, lo, hi);
            }, merge});
        }

        if (n <= kColGroup) {  // (per_token's work as the `then` of a stage before the first)
            for (int64_t m = 0; m < n; ++m) norm_in(m, layers[0].spec.in_norm, layers[0].qkv_in);
            if (cols_apart && (layers[0].qkv_in & kColsLayout)) a.q.to_cols(0, n);
        }
        if (n > kChosenSteps) {
            team.run(stages);
        } else {  // a decode step: on as many threads as run it fastest now (thread_choice.h)
            const int t = threads_used.next(n);
            const auto start = std::chrono::steady_clock::now();
            team.run(stages, t);
            threads_used.took(n, t, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        std::copy(a_head.x.begin(), a_head.x.end(), normed);  // the final norm's output, which the head read
        return true;
    }

  private:
    const int64_t H, KV, D, R, QKV, act;
    const float eps, scale;
    int64_t hidden = 0, inter = 0, max_len = 0, cache_rows = 0;
    bool local = false;
    std::vector<Layer> layers;
    const float* final_norm = nullptr;
    Group head;
    Team team;
    static constexpr int64_t kChosenSteps = 16;  // steps of up to this many tokens: decode (a prompt's take every thread)
    ThreadChoice threads_used;
    // one run's state, shared by the team's threads: N tokens' rows of each
    int64_t N = 0;
    bool cols_apart = false;  // the tokens' quantized activations go to their columns after all of them (per_token)
    const int64_t *rows_ = nullptr, *slots_ = nullptr;
    const float *cs = nullptr, *sn = nullptr, *cs_l = nullptr, *sn_l = nullptr;
    std::vector<float> x, qkv, gu, y;  // (N, hidden), (N, QKV), (N, 2 inter), (N, hidden)
    Activation a, a_attn, a_mlp, a_head;  // inputs of q/k/v and gate/up, of o, of down, of the head
    // a mixture of experts' run: each (token, choice) pair's expert and weight, gate/up outputs and
    // activation row; each thread's down outputs
    // each pair's expert; the pairs by expert, and each pair's place in that order; expert x's first place
    std::vector<int64_t> moe_ids, moe_order, moe_row, moe_start;
    std::vector<float> moe_w, moe_gu, moe_dn;  // each pair's weight; gate/up outputs; down outputs (a row a pair)
    Activation a_moe, a_sorted;  // act(gate) * up a pair; several tokens' inputs copied to their pairs' rows
    std::vector<float> shared_w, shared_gu, shared_dn;  // the shared expert's: a token's weight, gate/up, down
    Activation a_shared;  // its act(gate) * up, a row a token
    std::vector<std::vector<float>> scores;  // each thread's
    // each thread's finders of the k largest logits of each row (a thread's chunks of the head come
    // in any order: its own range's, then those it takes from another's), merged after the head: a
    // pass over a row's logits after the step found them gone from the cache; here each chunk is read
    // as it is made
    std::vector<std::vector<TopK>> tops;
    // run_ids': the embedding table (GGUF blocks of emb_type, or float32 rows for -1) and the RoPE
    // tables for positions [0, table_len), the caller's; the tokens' rows of them
    const uint8_t* emb = nullptr;
    int emb_type = -1;
    int64_t emb_rows = 0, emb_row_bytes = 0, table_len = 0;
    float emb_scale = 1.f;
    const float* tables[4] = {nullptr, nullptr, nullptr, nullptr};
    std::vector<float> x_ids, rope_rows[4];
    int64_t per_part = 1, parts = 1;  // query heads an attention item takes, items a key head's group makes
    const int64_t head_rows = std::lcm<int64_t>(D, 16);  // the qkv stage's chunks: whole heads, whole row groups

    // The group of n projections at ps, as given; false where one is an interleaved copy the variant
    // does not take, or whose rows do not start at a multiple of a row group in the group (the
    // stages split at multiples of 16)
    bool own(const LlmcliProjection* ps, int64_t n, Group& g) {
        int64_t base = 0;
        for (int64_t i = 0; i < n; ++i) {
            if (ps[i].grouped && (!grouped_takes((int)ps[i].type, ps[i].N) || base % group_rows())) return false;
            base += ps[i].N;
            g.push_back(ps[i]);
        }
        return true;
    }

    // f(m) for every token m after the last stage, which quantizes `out`'s row m in `layouts` (if
    // out). One token: the last stage's `then`. Up to a group of kColGroup: a stage of one token a
    // chunk, then the rows to their columns (Q8Cols) on one thread, as its `then`: the tokens of a
    // group have their activations side by side, and two threads writing one group's cache lines
    // took longer than one writing all of them. More: a stage of whole groups, each chunk's columns
    // written by its thread. (Eight tokens' work as one thread's `then`, the other thread waiting,
    // was a visible part of an 8-row step.)
    void per_token(std::vector<Stage>& stages, std::function<void(int64_t)> f, Activation* out = nullptr,
                   unsigned layouts = 0) {
        if (N == 1 && !stages.empty() && !stages.back().then) {
            stages.back().then = [f] { f(0); };
            return;
        }
        if (N <= kColGroup) {
            std::function<void()> then;
            if (out && (layouts & kColsLayout)) then = [out, n = N] { out->q.to_cols(0, n); };
            stages.push_back({N, 1, [f](int, int64_t lo, int64_t hi) { for (int64_t m = lo; m < hi; ++m) f(m); }, then});
            return;
        }
        const bool cols = out && (layouts & kColsLayout);
        stages.push_back({N, kColGroup, [f, out, cols](int, int64_t lo, int64_t hi) {
            for (int64_t m = lo; m < hi; ++m) f(m);
            if (cols) out->q.to_cols(lo, hi);
        }, {}});
    }

    // token m's row of act quantized in `layouts`, less the columns when there are several tokens
    // (per_token writes them); none where no weight reads int8 (F16, BF16 and Q5_K's float route)
    void quantize(Activation& act, int64_t m, unsigned layouts) {
        if (!layouts) return;
        act.q.quantize(act.x.data(), m, m + 1, cols_apart ? layouts & ~kColsLayout : layouts);
    }

    // A mixture of experts in place of the MLP's three stages, for the N tokens: each token's router
    // scores and its chosen experts (the `then` of the stage before, as a per_token step: E dot
    // products of the normed input); then the chosen experts' gate and up rows, one (token, choice)
    // pair an activation row (alone: the numbers each token gets alone); act(gate) * up into a
    // quantized row a pair; then down over the hidden rows, each token's pairs weighted and summed
    // into y. Experts' blocks are read as stored, each pair's rows once.
    void moe_stages(std::vector<Stage>& stages, const Layer& l) {
        const Experts& e = *l.experts;
        const int64_t k = e.used, I = e.inter, P = N * k, E = (int64_t)e.gate_up.size();
        moe_ids.resize(P), moe_w.resize(P), moe_gu.resize(P * 2 * I), moe_dn.resize(P * hidden);
        a_moe.resize(P, I);
        const int64_t SI = e.shared_gate ? e.shared_inter : 0;  // (the shared expert's rows follow the experts' in each stage)
        shared_w.resize(N), shared_gu.resize(N * 2 * SI), shared_dn.resize(N * hidden);
        a_shared.resize(N, SI);
        per_token(stages, [this, &e](int64_t m) { route(e, m); });
        if (N == 1) {  // a decode step: its k pairs are k experts, each read once
            stages.push_back({P * 2 * I + 2 * SI, 16, [this, &e, I, P](int, int64_t lo, int64_t hi) {
                for (int64_t p = lo / (2 * I); p < P && p * 2 * I < hi; ++p) {
                    const int64_t b = std::max(lo, p * 2 * I) - p * 2 * I, end = std::min(hi, (p + 1) * 2 * I) - p * 2 * I;
                    project_rows(e.gate_up[moe_ids[p]], a.q, a.x.data(), p / e.used, 1, moe_gu.data() + p * 2 * I,
                                 2 * I, b, end);
                }
                shared_up(e, P * 2 * I, lo, hi);
            }, {}});
            moe_gate(stages, l, I, P);
            stages.push_back({hidden, 16, [this, &e, P](int, int64_t lo, int64_t hi) {
                for (int64_t p = 0; p < P; ++p)
                    project_rows(e.down[moe_ids[p]], a_moe.q, a_moe.x.data(), p, 1, moe_dn.data() + p * hidden, hidden,
                                 lo, hi);
                shared_down(e, lo, hi);
                moe_sum(lo, hi, e.shared_gate != nullptr);
            }, {}});
            return;
        }
        // Several tokens: the pairs sorted by expert (counting sort, one thread), each token's normed
        // input copied to its pairs' rows in that order and quantized; then each expert's rows are
        // read once for all its pairs, and the numbers are each pair's alone (project's `alone`)
        a_sorted.resize(P, hidden);
        moe_order.resize(P), moe_row.resize(P), moe_start.assign(E + 1, 0);
        stages.push_back({1, 1, [this, E, P](int, int64_t, int64_t) {  // (the buffers are every layer's: counted afresh)
            std::fill(moe_start.begin(), moe_start.end(), 0);
            for (int64_t p = 0; p < P; ++p) ++moe_start[moe_ids[p] + 1];
            for (int64_t i = 0; i < E; ++i) moe_start[i + 1] += moe_start[i];
            std::vector<int64_t> at(moe_start.begin(), moe_start.end() - 1);
            for (int64_t p = 0; p < P; ++p) {
                moe_row[p] = at[moe_ids[p]]++;
                moe_order[moe_row[p]] = p;
            }
        }, {}});
        stages.push_back({P, 16, [this, &l, &e](int, int64_t lo, int64_t hi) {
            for (int64_t r = lo; r < hi; ++r) {
                const float* from = a.row(moe_order[r] / e.used);
                std::copy(from, from + hidden, a_sorted.row(r));
                if (l.gate_up_in) a_sorted.q.quantize(a_sorted.x.data(), r, r + 1, l.gate_up_in & ~kColsLayout);
            }
        }, [this, &l, P] {  // (the rows side by side for interleaved experts, on one thread: to_cols)
            if (l.gate_up_in & kColsLayout) a_sorted.q.to_cols(0, P);
        }});
        stages.push_back({E * 2 * I + 2 * SI, 16, [this, &e, I, E](int, int64_t lo, int64_t hi) {
            for (int64_t x = lo / (2 * I); x < E && x * 2 * I < hi; ++x) {  // expert x's rows of [lo, hi)
                const int64_t s0 = moe_start[x], s1 = moe_start[x + 1];
                if (s0 == s1) continue;
                const int64_t b = std::max(lo, x * 2 * I) - x * 2 * I, end = std::min(hi, (x + 1) * 2 * I) - x * 2 * I;
                project_rows(e.gate_up[x], a_sorted.q, a_sorted.x.data(), s0, s1 - s0, moe_gu.data() + s0 * 2 * I,
                             2 * I, b, end);
            }
            shared_up(e, E * 2 * I, lo, hi);
        }, {}});
        moe_gate(stages, l, I, P);
        stages.push_back({hidden, 16, [this, &e, E](int, int64_t lo, int64_t hi) {
            for (int64_t x = 0; x < E; ++x) {
                const int64_t s0 = moe_start[x], s1 = moe_start[x + 1];
                if (s0 < s1)
                    project_rows(e.down[x], a_moe.q, a_moe.x.data(), s0, s1 - s0, moe_dn.data() + s0 * hidden, hidden,
                                 lo, hi);
            }
            shared_down(e, lo, hi);
            moe_sum(lo, hi, e.shared_gate != nullptr);
        }, {}});
    }

    // The shared expert's gate and up rows of [lo, hi) past `at` (where the experts' rows of the
    // stage end), every token's from its normed input
    void shared_up(const Experts& e, int64_t at, int64_t lo, int64_t hi) {
        if (!e.shared_gate || hi <= at) return;
        project_rows(e.shared_gate_up, a.q, a.x.data(), 0, N, shared_gu.data(), 2 * e.shared_inter,
                     std::max(lo, at) - at, hi - at);
    }

    // The shared expert's down rows [lo, hi) of every token
    void shared_down(const Experts& e, int64_t lo, int64_t hi) {
        if (e.shared_gate)
            project_rows(e.shared_down, a_shared.q, a_shared.x.data(), 0, N, shared_dn.data(), hidden, lo, hi);
    }

    // act(gate) * up of each of the P rows of moe_gu (in pair order for one token, expert order for
    // several) into a_moe's row, quantized for the experts' down
    // (and the shared expert's: N rows more, into a_shared)
    void moe_gate(std::vector<Stage>& stages, const Layer& l, int64_t I, int64_t P) {
        const Experts& e = *l.experts;
        stages.push_back({P + (e.shared_gate ? N : 0), 1, [this, &l, &e, I, P](int, int64_t lo, int64_t hi) {
            for (int64_t r = lo; r < hi; ++r) {
                const bool shared = r >= P;
                const int64_t n = shared ? e.shared_inter : I;
                const float* g = shared ? shared_gu.data() + (r - P) * 2 * n : moe_gu.data() + r * 2 * I;
                Activation& out = shared ? a_shared : a_moe;
                const int64_t row = shared ? r - P : r;
                float* o = out.row(row);
                std::copy(g, g + n, o);
                if (act == 1) gelu_tanh_mul(o, g + n, n);
                else if (act == 2) swiglu_oai_mul(o, g + n, n);
                else silu_mul(o, g + n, n);
                const unsigned in = shared ? e.shared_down_in : l.down_in;
                if (in) out.q.quantize(out.x.data(), row, row + 1, in & ~kColsLayout);
            }
        }, [this, &l, &e, P] {  // (interleaved experts' down reads the rows side by side)
            if (l.down_in & kColsLayout) a_moe.q.to_cols(0, P);
            if (e.shared_gate && (e.shared_down_in & kColsLayout)) a_shared.q.to_cols(0, N);
        }});
    }

    // y's columns [lo, hi) of every token: its pairs' down outputs weighted, summed in its choices'
    // order (a token's numbers whatever tokens came with it). moe_dn holds a row a pair: in pair
    // order for one token, in expert order (moe_order) for several
    // (then the shared expert's output times its weight, where the layer has one)
    void moe_sum(int64_t lo, int64_t hi, bool shared) {
        const int64_t k = (int64_t)moe_ids.size() / N;
        for (int64_t m = 0; m < N; ++m) {
            float* ym = y.data() + m * hidden;
            std::fill(ym + lo, ym + hi, 0.f);
            for (int64_t s = 0; s < k; ++s) {
                const int64_t p = m * k + s;
                const float* d = moe_dn.data() + (N > 1 ? moe_row[p] : p) * hidden;
                const float w = moe_w[p];
                for (int64_t i = lo; i < hi; ++i) ym[i] += w * d[i];
            }
            if (shared) {
                const float* d = shared_dn.data() + m * hidden;
                const float w = shared_w[m];
                for (int64_t i = lo; i < hi; ++i) ym[i] += w * d[i];
            }
        }
    }

    // token m's router: softmax over the experts of the normed input's scores, the `used` largest
    // (of equals, the lower index), renormalized where the model says so
    void route(const Experts& e, int64_t m) {
        const int64_t E = (int64_t)e.gate_up.size(), k = e.used;
        const float* xm = a.row(m);
        std::vector<float> score(E);
        for (int64_t i = 0; i < E; ++i) {
            const float* w = e.router + i * hidden;
            float s = 0.f;
            for (int64_t j = 0; j < hidden; ++j) s += w[j] * xm[j];
            score[i] = e.router_bias ? s + e.router_bias[i] : s;
        }
        const float top = *std::max_element(score.begin(), score.end());
        float total = 0.f;
        for (auto& s : score) total += (s = std::exp(s - top));
        std::vector<int64_t> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](int64_t i, int64_t j) { return score[i] > score[j] || (score[i] == score[j] && i < j); });
        float chosen = 0.f;
        for (int64_t s = 0; s < k; ++s) chosen += score[order[s]];
        for (int64_t s = 0; s < k; ++s) {
            moe_ids[m * k + s] = order[s];
            moe_w[m * k + s] = score[order[s]] / (e.renormalize ? chosen : total);
        }
        if (e.shared_gate) {
            float g = 0.f;
            for (int64_t j = 0; j < hidden; ++j) g += e.shared_gate[j] * xm[j];
            shared_w[m] = 1.f / (1.f + std::exp(-g));
        }
    }

    // token m's state normed into the next projections' input, quantized in the layouts they read
    void norm_in(int64_t m, const float* w, unsigned layouts) { norm_in(m, w, layouts, a); }
    void norm_in(int64_t m, const float* w, unsigned layouts, Activation& to) {
        rms_norm(x.data() + m * hidden, w, hidden, eps, to.row(m));
        quantize(to, m, layouts);
    }

    // x += y (normed first where the layer has that norm), token m
    void add_residual(int64_t m, const float* norm) {
        float* ym = y.data() + m * hidden;
        if (norm) rms_norm(ym, norm, hidden, eps, ym);
        float* xm = x.data() + m * hidden;
        for (int64_t i = 0; i < hidden; ++i) xm[i] += ym[i];
    }

    void gate(int64_t m, unsigned layouts) {
        const float* g = gu.data() + m * 2 * inter;
        float* o = a_mlp.row(m);
        std::copy(g, g + inter, o);
        if (act == 1) gelu_tanh_mul(o, g + inter, inter);
        else if (act == 2) swiglu_oai_mul(o, g + inter, inter);
        else silu_mul(o, g + inter, inter);
        quantize(a_mlp, m, layouts);
    }

    // token m's heads [h0, h1) of its H + 2 KV new ones (q, k, v): q/k norms and RoPE on the q and
    // k heads; the k and v heads to its cache row and slot. Norms over all heads at once (whole_qk_norm):
    // h0, h1 are 0, H + 2 KV, and q (H D) and k (KV D) are normed first, each as one vector
    void place_heads(const Layer& l, int64_t m, int64_t h0, int64_t h1) {
        const LlmcliLayer& s = l.spec;
        const float* c = (s.local_rope ? cs_l : cs) + m * R;
        const float* sn_m = (s.local_rope ? sn_l : sn) + m * R;
        float* t = qkv.data() + m * QKV;
        const int64_t row = rows_[m], slot = slots_[m];
        if (s.whole_qk_norm) {
            if (s.q_norm) rms_norm(t, s.q_norm, H * D, eps, t);
            if (s.k_norm) rms_norm(t + H * D, s.k_norm, KV * D, eps, t + H * D);
        }
        for (int64_t h = h0; h < h1; ++h) {
            float* v = t + h * D;
            if (h < H + KV) {
                const float* norm = s.whole_qk_norm ? nullptr : h < H ? s.q_norm : s.k_norm;
                if (norm) rms_norm(v, norm, D, eps, v);
                rope(v, c, sn_m, R);
            }
            if (h >= H) {
                const bool key = h < H + KV;
                const int64_t g = key ? h - H : h - H - KV;
                const int64_t* st = key ? s.k_strides : s.v_strides;
                const int64_t at = row * st[0] + g * st[1] + slot * st[2];
                with_kv(s, [&](auto* k_cache, auto* v_cache) { store_kv(v, (key ? k_cache : v_cache) + at, D); });
            }
        }
    }

    // items [lo, hi) of (token, key head, part of its query heads): each token over its own row's
    // slots up to its own; `by_blocks`: then the blocks of its heads' output quantized (D % 32 == 0)
    void attend(const Layer& l, int t, int64_t lo, int64_t hi, bool by_blocks) {
        const LlmcliLayer& s = l.spec;
        const int64_t G = H / KV;
        for (int64_t i = lo; i < hi; ++i) {
            const int64_t m = i / (KV * parts), g = i / parts % KV, h = g * G + i % parts * per_part;
            const int64_t row = rows_[m], slot = slots_[m];
            const int64_t first = s.window > 0 ? std::max<int64_t>(0, slot - s.window + 1) : 0, S = slot + 1 - first;
            const int64_t ko = row * s.k_strides[0] + g * s.k_strides[1] + first * s.k_strides[2];
            const int64_t vo = row * s.v_strides[0] + g * s.v_strides[1] + first * s.v_strides[2];
            const int64_t n = std::min(per_part, (g + 1) * G - h);
            with_kv(s, [&](auto* k_cache, auto* v_cache) {
                attend_heads(qkv.data() + m * QKV + h * D, n, k_cache + ko, s.k_strides[2], v_cache + vo, s.v_strides[2],
                             S, D, nullptr, scale, scores[t].data(), a_attn.row(m) + h * D, s.sinks ? s.sinks + h : nullptr);
            });
            if (by_blocks) a_attn.q.quantize_blocks(a_attn.x.data(), m, h * D / 32, (h + n) * D / 32);
        }
    }
};

extern "C" {

LLMCLI_API void* llmcli_step_new(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, float eps,
                                 float scale, int64_t act, int threads, int refined) {
    if (heads <= 0 || kv_heads <= 0 || heads % kv_heads || rotary_dim % 2 || rotary_dim > head_dim || act < 0 || act > 2)
        return nullptr;
    return new Step(heads, kv_heads, head_dim, rotary_dim, eps, scale, act, threads, refined);
}

LLMCLI_API int llmcli_step_add_layer(void* step, const LlmcliLayer* layer) {
    return static_cast<Step*>(step)->add_layer(*layer) ? 0 : 1;
}

LLMCLI_API int llmcli_step_set_shared_expert(void* step, int64_t layer, const float* gate, const LlmcliProjection* expert) {
    return static_cast<Step*>(step)->set_shared_expert(layer, gate, expert) ? 0 : 1;
}

LLMCLI_API int llmcli_step_set_experts(void* step, int64_t layer, const float* router, int64_t n_experts,
                                       int64_t used, int64_t renormalize, const LlmcliProjection* experts) {
    return static_cast<Step*>(step)->set_experts(layer, router, n_experts, used, renormalize, experts) ? 0 : 1;
}

LLMCLI_API int llmcli_step_set_router_bias(void* step, int64_t layer, const float* bias) {
    return static_cast<Step*>(step)->set_router_bias(layer, bias) ? 0 : 1;
}

LLMCLI_API int llmcli_step_set_head(void* step, const float* norm, const LlmcliProjection* head, int64_t n_head) {
    return static_cast<Step*>(step)->set_head(norm, head, n_head) ? 0 : 1;
}

LLMCLI_API int llmcli_step_run(void* step, int64_t n, const float* x, const int64_t* rows, const int64_t* slots,
                               const float* cos, const float* sin, const float* cos_local, const float* sin_local,
                               int64_t logits_from, float* logits, float* hidden, int64_t top, float* top_values,
                               int64_t* top_indices) {
    return static_cast<Step*>(step)->run(n, x, rows, slots, cos, sin, cos_local, sin_local, logits_from, logits,
                                         hidden, top, top_values, top_indices) ? 0 : 1;
}

LLMCLI_API int llmcli_step_set_embedding(void* step, const void* table, int type, int64_t rows, float scale) {
    return static_cast<Step*>(step)->set_embedding(table, type, rows, scale) ? 0 : 1;
}

LLMCLI_API int llmcli_step_set_rope(void* step, const float* cos, const float* sin, const float* cos_local,
                                    const float* sin_local, int64_t L) {
    return static_cast<Step*>(step)->set_rope(cos, sin, cos_local, sin_local, L) ? 0 : 1;
}

LLMCLI_API int llmcli_step_run_ids(void* step, int64_t n, const int64_t* ids, const int64_t* rows, const int64_t* slots,
                                   const int64_t* positions, int64_t logits_from, float* logits, float* hidden,
                                   int64_t top, float* top_values, int64_t* top_indices) {
    return static_cast<Step*>(step)->run_ids(n, ids, rows, slots, positions, logits_from, logits, hidden, top,
                                             top_values, top_indices);
}

LLMCLI_API void llmcli_step_free(void* step) { delete static_cast<Step*>(step); }


}  // extern "C"
