"""Real models' shapes (from their config.json) for the random-weight GGUF files of shaped_gguf.py,
and where those files go.

    s = LLAMAS["llama3.1-8b"]   # hidden, intermediate, layers, heads, kv_heads, vocab, ctx, rope_theta, eps, ...
"""

from __future__ import annotations

from pathlib import Path

# Qwen2.5-0.5B-Instruct and TinyLlama-1.1B-Chat-v1.0, from their config.json
QWEN2 = dict(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936, ctx=32768,
             rope_theta=1000000.0, eps=1e-6)
TINYLLAMA = dict(hidden=2048, intermediate=5632, layers=22, heads=32, kv_heads=4, vocab=32000, ctx=2048,
                 rope_theta=10000.0, eps=1e-5)
# Llama-3.2-3B and Llama-3.1-8B (Instruct), from their config.json
LLAMA3_ROPE = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
LLAMA32_3B = dict(hidden=3072, intermediate=8192, layers=28, heads=24, kv_heads=8, vocab=128256, ctx=131072,
                  rope_theta=500000.0, eps=1e-5, tied=True, rope_scaling=dict(LLAMA3_ROPE, factor=32.0))
LLAMA31_8B = dict(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=128256, ctx=131072,
                  rope_theta=500000.0, eps=1e-5, tied=False, rope_scaling=dict(LLAMA3_ROPE, factor=8.0))
LLAMAS = {"llama3.2-3b": LLAMA32_3B, "llama3.1-8b": LLAMA31_8B}
# Qwen3-30B-A3B (config.json): 48 layers of 128 experts of 768, 8 a token; heads of 128 (q is 4096 wide)
QWEN3_30B_A3B = dict(hidden=2048, intermediate=6144, layers=48, heads=32, kv_heads=4, head_dim=128, vocab=151936,
                     ctx=40960, rope_theta=1000000.0, eps=1e-6, experts=128, experts_used=8, expert_ff=768)
OUT = Path.home() / ".cache" / "llmcli-bench"
