"""A loaded model and what came with it (its tokenizer, template, where it runs and how long loading
took): what loader.py and the torch-free path (lean.py) both return. No torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..formats.tokenizer import Tokenizer


@dataclass
class LoadedModel:
    model: object  # the torch module, or the torch-free path's lean_step.LeanModel
    tokenizer: Tokenizer
    args: object  # the family's ModelArgs (models/args.py)
    chat_template: str | None
    path: Path
    format: str  # "gguf" | "safetensors"
    weights_bytes: int  # size of the weights on disk
    weights_type: str  # e.g. "Q4_1", "bfloat16 as BF16 rows", "q4 (llmcli) as Q4_1, Q8_0", "q4 (from bfloat16) as Q4_1"
    placement: object  # device.Placement
    load_seconds: float
    metadata: dict = field(default_factory=dict)  # e.g. general.name, license
    runs_as: str = ""  # in words: "GGUF Q4_1", "bfloat16 safetensors quantized to q4 at load, held as Q4_1, Q8_0"
    interleaved: tuple[int, float] = (0, 0.0)  # bytes of weights copied for the native step at load, seconds (NativeStep.prepare)

    @property
    def name(self) -> str:
        return self.metadata.get("name") or self.path.name
