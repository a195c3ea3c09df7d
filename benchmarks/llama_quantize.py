"""A shaped model's F16 file quantized by llama.cpp's own llama-quantize, so that the file holds the
block types users download (Q4_K_M: the mix llama.cpp chooses for it), and where the F16 file lies
beside its output.

    f16 = f16_source(out, "Q4_K_M")                      # NAME.q4_k_m.gguf -> NAME.f16.gguf
    llama_quantize(exe, f16, out, "Q4_K_M", threads)     # threads None: llama-quantize's own (all cores)
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def f16_source(out: Path, type_name: str) -> Path:
    """NAME.q4_k_m.gguf -> NAME.f16.gguf (any other name: NAME.f16.gguf after the whole stem)."""
    tail = f".{type_name.lower()}.gguf"
    stem = out.name[:-len(tail)] if out.name.endswith(tail) else out.name.replace(".gguf", "")
    return out.with_name(stem + ".f16.gguf")


def llama_quantize(exe: Path, f16: Path, out: Path, type_name: str, threads: int | None = None) -> None:
    """`llama-quantize F16 OUT TYPE [THREADS]`; CalledProcessError where it fails."""
    subprocess.run([str(exe), str(f16), str(out), type_name, *([str(threads)] if threads else [])], check=True)
