"""What a model on disk is, read from its headers only (formats/open.py; no weights loaded), for `llmcli show`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import LlmcliError
from .open import ModelFile


@dataclass
class ModelInfo:
    path: str
    format: str  # "gguf" | "safetensors"
    architecture: str | None = None
    parameters: int | None = None
    context_length: int | None = None
    quantization: str | None = None  # e.g. "Q4_1 (Q4_1 x 210, Q8_0 x 1, F32 x 61)" or "none (bfloat16)"
    chat_template: str | None = None
    license: str | None = None
    files: list[dict] = field(default_factory=list)  # [{"name", "size"}]
    experts: int | None = None  # a mixture of experts: experts per sparse layer
    active_experts: int | None = None  # of them, the ones a token runs
    active_parameters: int | None = None  # the parameters a token reads (the chosen experts' only)

    @property
    def size(self) -> int:
        return sum(f["size"] for f in self.files)

    def as_dict(self) -> dict:
        return {**asdict(self), "size": self.size}


def runs_as(fmt: str | None, stored: str | None, quant: str | None = None) -> str:
    """What a model's weights run as, in words: "GGUF Q4_K_M", "bfloat16 safetensors", "bfloat16
    safetensors quantized to q4 at load", "llmcli q4 checkpoint"."""
    stored = stored or "?"
    if stored.endswith(" (llmcli)"):
        return f"llmcli {stored.removesuffix(' (llmcli)')} checkpoint"
    kind = "GGUF" if fmt == "gguf" else fmt or "?"
    if quant:
        return f"{stored} {kind} quantized to {quant} at load"
    return f"GGUF {stored}" if fmt == "gguf" else f"{stored} {kind}"


def inspect(model: ModelFile) -> ModelInfo:
    if model.is_gguf:
        types = model.tensor_types()
        kind = model.file_type or (types.most_common(1)[0][0] if types else "unknown")
        mix = ", ".join(f"{t} x {n}" for t, n in types.most_common())
        quantization = f"{kind} ({mix})"
    else:
        quantized = model.metadata.get("quantization_config")
        method = quantized.get("quant_method") if isinstance(quantized, dict) else None
        plain = ", ".join(_DTYPE_NAMES.get(d, d) for d, _ in model.tensor_types().most_common())
        quantization = method or f"none ({plain})"
    parameters = model.parameters()
    info = ModelInfo(path=str(model.path), format=model.format, architecture=model.architecture,
                     parameters=parameters, context_length=model.context_length,
                     quantization=quantization, chat_template=model.stored_chat_template, license=model.license,
                     files=model.files_on_disk())
    args = _args(model)
    if getattr(args, "num_experts", None):
        idle = args.parameter_count() - args.active_parameter_count()  # the experts a token does not run
        info.experts, info.active_experts = args.num_experts, args.num_experts_per_tok
        info.active_parameters = parameters - idle
    return info


def _args(model: ModelFile):
    """The model's args, or None where llmcli does not run its architecture (show still shows it)."""
    try:
        return model.args
    except LlmcliError:  # an unsupported or broken header: show says what it can
        return None


_DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
