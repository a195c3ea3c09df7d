// The libraries' C interface, what library.py and step.py call through ctypes. Arrays are
// contiguous unless strides are given (in elements); float32 unless named otherwise. Functions
// return 0, or non-zero for arguments they do not take (the Python side checks shapes first).
#pragma once
#include <cstdint>

#define LLMCLI_API __attribute__((visibility("default")))

extern "C" {

LLMCLI_API const char* llmcli_variant();      // "avx512vnni", "avxvnni", "avx2", "neon" or "portable"
LLMCLI_API const char* llmcli_source_hash();  // build.py's hash of the sources and flags it was built from

// y (M, N) = x (M, K) @ W.T, W (N, row bytes) uint8: GGUF blocks of `type` (quant/gguf_blocks.py's TYPE_IDS);
// Q5_K through the row-group kernels where this variant has them (int8 activations, as the decode step
// takes it), else the float route. refined: 1 for int8x2 activations (each row as 16-bit codes, their high and
// low bytes two int8 rows: kernels.h's Q8Rows::refined), 0 for llama.cpp's int8; the float routes read x as it is
LLMCLI_API int llmcli_mm(const float* x, int64_t M, const uint8_t* w, int64_t N, int64_t K, int type, float* y, int threads,
                         int refined);
// The weight rows a group of this variant's row-group kernels takes (16, 8, or 0: none), and
// whether they take N rows of `type` (1) or not (0)
LLMCLI_API int llmcli_group_rows(void);
LLMCLI_API int llmcli_grouped_takes(int type, int64_t N);
// The bytes llmcli_interleave writes for N rows of `type`, K wide (0 where the variant has no
// row-group kernels for them)
LLMCLI_API int64_t llmcli_grouped_bytes(int type, int64_t N, int64_t K);
// out (llmcli_grouped_bytes) = W's N rows interleaved for the row-group kernels, row n read from W's
// row order[n] (order null: row n): what a step's projection reads where `grouped`. 2 where the
// variant does not take them (grouped_takes), nothing written
LLMCLI_API int llmcli_interleave(int type, const uint8_t* W, int64_t N, int64_t K, const int64_t* order, uint8_t* out,
                                 int threads);
// The same through the row-group kernels a decode step takes (where this variant has them for this
// type and N: else 2, nothing written), each row's numbers as with that row alone
LLMCLI_API int llmcli_mm_grouped(const float* x, int64_t M, const uint8_t* w, int64_t N, int64_t K, int type, float* y,
                                 int threads, int refined);
// y (N, K) = W's rows dequantized
LLMCLI_API int llmcli_dequantize(const uint8_t* w, int64_t N, int64_t K, int type, float* y, int threads);
// x (M, K) -> q (M, K) int8, d and s (M, K/32): the activations as mm's integer dot products take them
// out[ids[i]] = row ids[i] of W (N rows of GGUF blocks of `type`, K wide), dequantized, . x (K floats),
// summed in float64 and rounded once, for i < n (a near tie's candidates recomputed from the final
// hidden state: decode/picker.py's rescore_near_ties); 1 for an id outside W
LLMCLI_API int llmcli_dot_rows(const uint8_t* w, int64_t N, int64_t K, int type, const int64_t* ids, int64_t n,
                               const float* x, float* out);
// x (M, K) -> the int8 activations mm multiplies: codes q (M, K), d and s (M, K / 32); refined: int8x2's,
// each row of x two rows of each, its high codes' and its low ones' (blocks.h's quantize_pair_scalar)
LLMCLI_API int llmcli_quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s, int refined);
// x (N, K) weights (dtype 0 float32, 1 bfloat16, 2 float16) -> out (N, K/32 blocks of `type`: Q8_0,
// Q4_1 or Q4_0) with min/max scales, as quant/primitives.py's quantize(search=False) and
// gguf_encode.to_blocks make them; 2 where a scale is beyond float16's range (out is then unusable)
LLMCLI_API int llmcli_quantize_weights(const void* x, int dtype, int64_t N, int64_t K, int type, uint8_t* out,
                                       int threads);

// One query per row: q (B, H, D), k and v (B, KV, S, D) with strides {batch, head, slot} and rows of
// D contiguous, mask (mask_rows of 1 or B, S) uint8 or null -> out (B, H, D)
LLMCLI_API int llmcli_attend_one(const float* q, int64_t B, int64_t H, int64_t D, const float* k, const int64_t* k_strides,
                                 const float* v, const int64_t* v_strides, int64_t KV, int64_t S, const uint8_t* mask,
                                 int64_t mask_rows, float scale, float* out, int threads);

// values, indices (k,) = the k largest of x (n,), largest first, equal values in index order; NaN
// counts as largest, as in torch.topk (select.cpp)
LLMCLI_API int llmcli_top_k(const float* x, int64_t n, int64_t k, float* values, int64_t* indices);

// The decode step (step.cpp): its weights and cache stay owned by the caller, who keeps them alive
struct LlmcliProjection {  // y = W x (+ b)
    const uint8_t* blocks;  // (N, row bytes), or where `grouped` llmcli_interleave's copy of them
    const float* bias;      // (N,) or null
    int64_t type, N, K;
    int64_t grouped;  // 1: blocks is the rows interleaved for this variant's row-group kernels
};

struct LlmcliLayer {
    const float *in_norm, *post_norm, *q_norm, *k_norm;  // (hidden,), (hidden,), (head_dim,) or null; post_norm: the MLP's input
    const float *attn_out_norm, *mlp_out_norm;  // (hidden,) or null: gemma3's norms of attention's and the MLP's outputs
    const LlmcliProjection *qkv, *o, *gate_up, *down;  // groups: projections of one input, outputs side by side
    int64_t n_qkv, n_o, n_gate_up, n_down;
    void *k_cache, *v_cache;  // (rows, KV, max_len, D), rows of D contiguous: float32, or float16 where kv_half
    int64_t k_strides[3], v_strides[3];  // {row, head, slot}, in elements
    int64_t rows, max_len, window;  // window: attend to this many most recent slots (0: all)
    int64_t local_rope;  // 1: q and k turn by the second RoPE table (gemma3's local layers), 0: the first
    int64_t kv_half;  // 1: the cache holds float16 (keys and values rounded to nearest even as they are written)
    const float* sinks;  // (heads,) or null: gpt-oss's logit a head that joins each softmax's denominator
    // 1: q_norm (heads * head_dim,) and k_norm (kv_heads * head_dim,) norm all of a token's q heads at
    // once, and all its k heads (OLMoE); 0: each head by a (head_dim,) weight (Qwen3, Gemma 3)
    int64_t whole_qk_norm;
};

// act: the MLP's gate, 0 SiLU (SwiGLU), 1 tanh-approximated GELU (GeGLU), 2 gpt-oss's clamped SwiGLU
// ((clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7)); refined: which activations go
// into the integer dot products as int8x2 (llmcli_mm's), a mask of the kRefine* below (0: all int8)
enum LlmcliRefine { kRefineNormed = 1, kRefineAttention = 2, kRefineMlp = 4, kRefineHead = 8, kRefineAll = 15 };  // (q/k/v, gate/up), o, down, head
LLMCLI_API void* llmcli_step_new(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, float eps,
                                 float scale, int64_t act, int threads, int refined);
LLMCLI_API int llmcli_step_add_layer(void* step, const LlmcliLayer* layer);
LLMCLI_API int llmcli_step_set_head(void* step, const float* norm, const LlmcliProjection* head, int64_t n_head);
// Layer `layer`'s MLP as a mixture of experts (after its add_layer, whose gate_up and down then go
// unread): router (n_experts, hidden) float32 scores, softmax over them, the `used` largest,
// renormalized to sum to one where `renormalize`; experts: 3 x n_experts projections, each expert's
// gate, up and down, blocks as stored (not interleaved). The caller keeps them alive.
LLMCLI_API int llmcli_step_set_experts(void* step, int64_t layer, const float* router, int64_t n_experts,
                                       int64_t used, int64_t renormalize, const LlmcliProjection* experts);
// A bias (n_experts,) float32 added to layer `layer`'s router scores (after its set_experts; gpt-oss)
LLMCLI_API int llmcli_step_set_router_bias(void* step, int64_t layer, const float* bias);
// Layer `layer`'s shared expert (after its set_experts): every token runs it beside its chosen
// experts and adds its output times sigmoid(gate . the normed input); gate (hidden) float32; expert:
// its gate, up and down projections, blocks as stored. The caller keeps them alive.
LLMCLI_API int llmcli_step_set_shared_expert(void* step, int64_t layer, const float* gate, const LlmcliProjection* expert);
// n tokens at once, x (n, hidden) their embeddings: token i's keys and values go to cache row
// rows[i], slot slots[i], and it attends to that row's slots up to its own (tokens of one row at
// consecutive slots see each other causally; rows never see each other). cos, sin (n, rotary_dim):
// the RoPE tables of each token's position; cos_local, sin_local the same for local_rope layers (or
// null without them). -> logits (n - logits_from, vocab) of tokens logits_from.., hidden (n, hidden)
// the final normed states; with top > 0, also the `top` largest logits of each of those rows
// (top_values, top_indices (n - logits_from, top): largest first, of equals the earlier, NaN as
// the largest: llmcli_top_k's). Each token's numbers are those of a call with that token alone.
LLMCLI_API int llmcli_step_run(void* step, int64_t n, const float* x, const int64_t* rows, const int64_t* slots,
                               const float* cos, const float* sin, const float* cos_local, const float* sin_local,
                               int64_t logits_from, float* logits, float* hidden, int64_t top, float* top_values,
                               int64_t* top_indices);
// The embedding table llmcli_step_run_ids looks token ids up in (after every add_layer): `rows`
// rows of the hidden size, GGUF blocks of `type` (llmcli_dequantize's) or float32 (type -1), each
// value times `scale` (Gemma's normalizer; 1 else), as the model's embed gives them. The caller
// keeps the table alive.
LLMCLI_API int llmcli_step_set_embedding(void* step, const void* table, int type, int64_t rows, float scale);
// The RoPE tables of positions [0, L) (L, rotary_dim), and the local layers' pair (or null
// without them), which llmcli_step_run_ids takes its tokens' rows of. The caller keeps them alive.
LLMCLI_API int llmcli_step_set_rope(void* step, const float* cos, const float* sin, const float* cos_local,
                                    const float* sin_local, int64_t L);
// llmcli_step_run for n token ids at RoPE positions `positions`: their embeddings and RoPE rows
// from the tables above (no tensors of them for the caller to make). 0; 1: bad arguments (an id
// outside the table, no table); 2: a position beyond the RoPE tables (nothing was run).
LLMCLI_API int llmcli_step_run_ids(void* step, int64_t n, const int64_t* ids, const int64_t* rows, const int64_t* slots,
                                   const int64_t* positions, int64_t logits_from, float* logits, float* hidden,
                                   int64_t top, float* top_values, int64_t* top_indices);
LLMCLI_API void llmcli_step_free(void* step);

}  // extern "C"
