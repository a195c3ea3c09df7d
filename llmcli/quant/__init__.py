"""Quantization: group-wise 8- and 4-bit weights, presets, checkpoints.

    primitives.py   pure functions: quantize / dequantize / pack, the scale search
    kernels.py      torch's weight-only kernels, and the one place that picks one per device and rows
    packed.py       Int4Weight, Int8Weight: a weight in the form its device runs, plus its portable form
    bnb_formats.py  bitsandbytes' NF4 and LLM.int8, in bitsandbytes' layout
    modules.py      Int4Linear, Int8Linear, NF4Linear, LLMInt8Linear, QuantEmbedding (with from_linear)
    presets.py      TOML rules from tensor names to formats (shipped in the top-level quant/ folder)
    gguf_import.py  GGUF Q4_0 / Q4_1 / Q8_0 blocks taken as they are
    gguf_blocks.py  GGUF blocks kept as they are (the native kernels' formats), and the block type sets
    held.py         how each weight is held on its device: llmcli's g32 formats as GGUF blocks on the CPU
    gguf_encode.py  the other way: llmcli's codes and scales as Q4_0 / Q4_1 / Q8_0 block bytes
    gguf_export.py  `quantize --format gguf`: a model as a GGUF file llama.cpp and ollama load
    convert.py      a model's tensors -> formats, one tensor at a time
    model.py        the walker: swap modules by Hugging Face name; build a quantized model
    checkpoint.py   the checkpoint folder: config.json `quantization` block, safetensors, tokenizer
    pipeline.py     quantize_to_folder / cached_quantized / building models for the loader
"""

QUANTIZING = "quantizing"  # how the loader's progress reports of quantizing at load start their label
