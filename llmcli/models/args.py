"""Each family's hyperparameters (from config.json or GGUF metadata), checked once where they are
built, without torch: opening a model's files, planning its memory and the torch-free CPU path read
them before (or without) any torch model is built. The families' modules re-export theirs as
`ModelArgs`."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from ..errors import CorruptModelError, UnsupportedModelError

BERT_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")  # bert.py's ACTIVATIONS


@dataclass
class LlamaArgs:
    model_type: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rope_freq_factors: tuple[float, ...] | None = None  # GGUF `rope_freqs.weight`: inv_freq is divided by these
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # llama: bias on q, k, v and o
    qkv_bias: bool = False  # qwen2: bias on q, k, v only
    mlp_bias: bool = False
    sliding_window: int | None = None  # attend to this many most recent positions (incl. self)
    max_window_layers: int = 0  # the window applies to layers with index >= this
    layer_types: list[str] | None = None  # transformers 5.x: "sliding_attention" | "full_attention" per layer
    qk_norm: bool = False  # qwen3: RMSNorm over each head of q and k before RoPE
    partial_rotary_factor: float = 1.0  # RoPE turns only this leading fraction of each head (phi4-mini)

    def __post_init__(self):
        """The one check of the hyperparameters, wherever they come from (config.json, GGUF metadata):
        a zero, a NaN or a missing value would otherwise fail deep inside torch, or divide by zero."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "max_position_embeddings"):
            _check_count(name, getattr(self, name))
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        _check_count("num_key_value_heads", self.num_key_value_heads)
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        _check_count("head_dim", self.head_dim)
        if self.head_dim % 2:
            raise CorruptModelError(f"head_dim is {self.head_dim}; rotary embeddings need an even number")
        for name in ("rms_norm_eps", "rope_theta"):
            _check_positive(name, getattr(self, name))
        if self.sliding_window:  # 0 and None: no window
            _check_count("sliding_window", self.sliding_window)
        if isinstance(self.rope_scaling, dict) and "factor" in self.rope_scaling:
            _check_positive("rope_scaling.factor", self.rope_scaling["factor"])
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            raise CorruptModelError(f"layer_types lists {len(self.layer_types)} layers, "
                                    f"not num_hidden_layers = {self.num_hidden_layers}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedModelError(
                f"{self.num_attention_heads} attention heads cannot be grouped over {self.num_key_value_heads} KV heads")

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "LlamaArgs":
        """Build from a Hugging Face `config.json` dict; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in config.items() if k in known}
        kw.pop("rope_freq_factors", None)
        model_type = config.get("model_type", "llama")
        # transformers 5.x writes `rope_parameters` (theta and scaling in one dict) instead of both keys
        rope = config.get("rope_parameters")
        if isinstance(rope, dict) and "full_attention" in rope:
            rope = rope["full_attention"]
        if isinstance(rope, dict):
            if "rope_theta" in rope:
                kw["rope_theta"] = rope["rope_theta"]
            if rope.get("rope_type", rope.get("type", "default")) != "default":
                kw["rope_scaling"] = rope
        if isinstance(rope, dict) and "partial_rotary_factor" in rope:
            kw["partial_rotary_factor"] = rope["partial_rotary_factor"]
        if model_type == "qwen3":
            kw["qk_norm"] = True
        if model_type == "qwen2":
            kw["qkv_bias"] = True
            kw.pop("attention_bias", None)
        if model_type in ("qwen2", "qwen3"):
            if not config.get("use_sliding_window", False):
                kw["sliding_window"] = None
        elif model_type not in ("mistral", "phi3"):
            kw["sliding_window"] = None
        missing = [k for k in _REQUIRED_HF_KEYS if k not in config]
        if missing:
            raise CorruptModelError(f"config.json has no {', '.join(missing)}; download the model again")
        try:
            return cls(**kw)
        except CorruptModelError as e:
            raise CorruptModelError(f"config.json is invalid: {e}; download the model again") from None

    @property
    def n_rep(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def layer_window(self, i: int) -> int | None:
        if not self.sliding_window:
            return None
        if self.layer_types is not None:
            return self.sliding_window if self.layer_types[i] == "sliding_attention" else None
        return self.sliding_window if i >= self.max_window_layers else None

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def norms_per_layer(self) -> int:
        """Vectors of hidden_size per layer (gemma3 has four)."""
        return 2

    def parameter_count(self) -> int:
        h, hd, i, v = self.hidden_size, self.head_dim, self.intermediate_size, self.vocab_size
        attn = h * hd * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        per_layer = attn + 3 * h * i + self.norms_per_layer() * h + (2 * hd if self.qk_norm else 0)
        head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_hidden_layers * per_layer + h + head


_REQUIRED_HF_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
MAX_COUNT = 2 ** 31 - 1


def _check_count(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_COUNT:
        what = "missing" if value is None else f"{value!r}"
        raise CorruptModelError(f"{name} is {what}; it must be a whole number from 1 to {MAX_COUNT}")


def _check_positive(name: str, value) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (0 < value < math.inf):
        raise CorruptModelError(f"{name} is {value!r}; it must be a positive finite number")


@dataclass
class Gemma3Args(LlamaArgs):
    model_type: str = "gemma3_text"
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    qk_norm: bool = True
    query_pre_attn_scalar: float = 256
    rope_local_base_freq: float = 10000.0
    sliding_window_pattern: int = 6  # older configs: every Nth layer is global
    final_logit_softcapping: float | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.layer_types is None:
            n = self.sliding_window_pattern
            self.layer_types = ["sliding_attention" if (i + 1) % n else "full_attention"
                                for i in range(self.num_hidden_layers)]

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "Gemma3Args":
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in config.items() if k in known and k != "rope_freq_factors"}
        kw["model_type"], kw["qk_norm"] = "gemma3_text", True
        if "sliding_window" not in config:
            kw["sliding_window"] = 4096  # transformers' default for Gemma 3
        rope = config.get("rope_parameters")
        if isinstance(rope, dict):  # transformers 5.x: one entry per layer type
            full, local = rope.get("full_attention", {}), rope.get("sliding_attention", {})
            kw["rope_theta"] = full.get("rope_theta", 1_000_000.0)
            kw["rope_local_base_freq"] = local.get("rope_theta", 10_000.0)
            kw["rope_scaling"] = full if full.get("rope_type", "default") != "default" else None
        else:
            kw.setdefault("rope_theta", 1_000_000.0)
        return cls(**kw)

    def norms_per_layer(self) -> int:
        return 4


@dataclass
class Phi3Args(LlamaArgs):
    model_type: str = "phi3"
    original_max_position_embeddings: int | None = None

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "Phi3Args":
        args = super().from_hf_config(config)
        # transformers 4.x: `rope_scaling` ("longrope", or its old names "su"/"yarn") and top-level keys
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("long_factor") is not None:
            args.rope_scaling = {**rope, "rope_type": "longrope"}
        args.partial_rotary_factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
        args.original_max_position_embeddings = (rope.get("original_max_position_embeddings")
                                                 or config.get("original_max_position_embeddings"))
        return args

    @property
    def longrope(self) -> bool:
        return (self.rope_scaling or {}).get("rope_type") == "longrope"

    def attention_factor(self) -> float:
        """The cos/sin scale LongRoPE applies (1 without it)."""
        if not self.longrope:
            return 1.0
        if self.rope_scaling.get("attention_factor") is not None:
            return float(self.rope_scaling["attention_factor"])
        orig = self.original_max_position_embeddings or self.max_position_embeddings
        factor = self.rope_scaling.get("factor") or self.max_position_embeddings / orig
        return math.sqrt(1 + math.log(factor) / math.log(orig)) if factor > 1 else 1.0


@dataclass
class BertArgs:
    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    position_embedding_type: str = "absolute"
    tie_word_embeddings: bool = False  # no output head to tie

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CorruptModelError(f"{name} is {value!r}; it must be a whole number of at least 1")
        if self.hidden_size % self.num_attention_heads:
            raise CorruptModelError(f"hidden_size {self.hidden_size} is not a multiple of "
                                    f"{self.num_attention_heads} attention heads")
        if self.hidden_act not in BERT_ACTIVATIONS:
            raise UnsupportedModelError(f"BERT activation {self.hidden_act!r} is not supported; "
                                        f"supported: {', '.join(BERT_ACTIVATIONS)}")
        if self.position_embedding_type != "absolute":
            raise UnsupportedModelError(f"BERT position embeddings {self.position_embedding_type!r} are not "
                                        "supported; supported: absolute")

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "BertArgs":
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in config.items() if k in known})
        except CorruptModelError as e:
            raise CorruptModelError(f"config.json is invalid: {e}; download the model again") from None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def parameter_count(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h
        per_layer = 4 * (h * h + h) + 2 * h * i + i + h + 4 * h
        return embeddings + self.num_hidden_layers * per_layer



@dataclass
class MoeArgs(LlamaArgs):
    """A Llama-family decoder whose MLP, in its sparse layers (every `decoder_sparse_step`th, less
    `mlp_only_layers`), is `num_experts` SwiGLU experts of `moe_intermediate_size` behind a router,
    `num_experts_per_tok` of them a token (models/moe.py). `softmax_first`: the probabilities over
    all experts, then the top k (renormalized with `norm_topk_prob`); else the top k logits' softmax.
    `shared_expert_intermediate_size`: an expert every token runs too, behind a sigmoid gate (qwen2_moe)."""

    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int | None = None  # None: intermediate_size
    norm_topk_prob: bool = False
    softmax_first: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] | None = None
    shared_expert_intermediate_size: int = 0
    whole_qk_norm: bool = False  # olmoe: q and k normed over all heads at once (else per head, qwen3's)
    clip_qkv: float | None = None  # olmoe: q, k and v clamped to [-clip, clip]

    def __post_init__(self):
        super().__post_init__()
        if self.moe_intermediate_size is None:
            self.moe_intermediate_size = self.intermediate_size
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
            _check_count(name, getattr(self, name))
        if self.num_experts_per_tok > self.num_experts:
            raise CorruptModelError(f"num_experts_per_tok is {self.num_experts_per_tok}, more than the "
                                    f"{self.num_experts} experts")
        self.mlp_only_layers = list(self.mlp_only_layers or [])

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "MoeArgs":
        config = dict(config)
        if "num_experts" not in config and "num_local_experts" in config:  # mixtral's (and transformers 5's) name
            config["num_experts"] = config["num_local_experts"]
        args = super().from_hf_config(config)
        args.model_type = config.get("model_type", args.model_type)
        return args

    def sparse(self, i: int) -> bool:
        """Whether layer i's MLP is the experts (else a dense MLP of intermediate_size)."""
        return i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0

    def _experts_size(self, count: int) -> int:
        return count * 3 * self.hidden_size * self.moe_intermediate_size

    def parameter_count(self) -> int:
        h = self.hidden_size
        sparse = sum(self.sparse(i) for i in range(self.num_hidden_layers))
        moe = self._experts_size(self.num_experts) + self.num_experts * h
        if self.shared_expert_intermediate_size:
            moe += 3 * h * self.shared_expert_intermediate_size + h
        return super().parameter_count() + sparse * (moe - 3 * h * self.intermediate_size)

    def active_parameter_count(self) -> int:
        """The parameters one token reads: the chosen experts' only."""
        sparse = sum(self.sparse(i) for i in range(self.num_hidden_layers))
        return self.parameter_count() - sparse * self._experts_size(self.num_experts - self.num_experts_per_tok)


@dataclass
class Qwen3MoeArgs(MoeArgs):
    """Qwen3-MoE: Qwen3's attention (q/k norm per head); softmax, then the top k."""

    model_type: str = "qwen3_moe"
    qk_norm: bool = True


@dataclass
class Qwen2MoeArgs(MoeArgs):
    """Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): q/k/v bias, a shared expert behind a sigmoid gate."""

    model_type: str = "qwen2_moe"
    qkv_bias: bool = True


@dataclass
class MixtralArgs(MoeArgs):
    """Mixtral: Mistral's attention; the top 2 of 8 logits' softmax (experts of intermediate_size)."""

    model_type: str = "mixtral"
    softmax_first: bool = False


@dataclass
class OlmoeArgs(MoeArgs):
    """OLMoE: q and k normed over all heads, optionally clamped; 64 experts, the top 8 of the softmax."""

    model_type: str = "olmoe"
    qk_norm: bool = True
    whole_qk_norm: bool = True

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "OlmoeArgs":
        args = super().from_hf_config(config)
        args.qk_norm = args.whole_qk_norm = True
        return args


@dataclass
class GptOssArgs(MoeArgs):
    """gpt-oss: biased attention with a learned sink logit per head, sliding-window (128) and full
    layers alternating, YaRN RoPE; in every layer `num_experts` experts of intermediate_size with
    biases and a clamped SwiGLU, behind a biased router (the top k logits' softmax)."""

    model_type: str = "gpt_oss"
    attention_bias: bool = True
    softmax_first: bool = False
    sliding_window: int | None = 128
    rms_norm_eps: float = 1e-5
    rope_theta: float = 150000.0
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def __post_init__(self):
        super().__post_init__()
        if self.layer_types is None:  # transformers' default: even layers slide, odd ones see everything
            self.layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                for i in range(self.num_hidden_layers)]
        for name in ("swiglu_alpha", "swiglu_limit"):
            _check_positive(name, getattr(self, name))

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> "GptOssArgs":
        args = super().from_hf_config(config)
        args.sliding_window = config.get("sliding_window", 128)  # (LlamaArgs drops it for other families)
        args.attention_bias = config.get("attention_bias", True)
        args.__post_init__()  # (checks the window and the layer types again)
        return args

    def _expert_size(self) -> int:
        h, i = self.hidden_size, self.moe_intermediate_size
        return 3 * h * i + 2 * i + h  # gate, up and down with their biases

    def parameter_count(self) -> int:
        h, hd, H, KV, E = self.hidden_size, self.head_dim, self.num_attention_heads, self.num_key_value_heads, \
            self.num_experts
        attn = h * hd * (2 * H + 2 * KV) + hd * (H + 2 * KV) + h + H  # weights, biases, sinks
        per_layer = attn + 2 * h + E * h + E + E * self._expert_size()  # norms, router, experts
        return self.vocab_size * h * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * per_layer + h

    def active_parameter_count(self) -> int:
        idle = self.num_hidden_layers * (self.num_experts - self.num_experts_per_tok) * self._expert_size()
        return self.parameter_count() - idle


# model_type -> its ModelArgs (models/__init__.py's family(): the module with its Transformer)
ARGS = {"llama": LlamaArgs, "mistral": LlamaArgs, "qwen2": LlamaArgs, "qwen3": LlamaArgs, "phi3": Phi3Args,
        "gemma3_text": Gemma3Args, "qwen3_moe": Qwen3MoeArgs, "qwen2_moe": Qwen2MoeArgs, "mixtral": MixtralArgs,
        "olmoe": OlmoeArgs, "gpt_oss": GptOssArgs, "bert": BertArgs}
SUPPORTED_ARCHITECTURES = tuple(ARGS)
# encoders: no cache, no output head; they make vectors (llmcli embed), never text
ENCODERS = ("bert",)


def is_encoder(args) -> bool:
    return args.model_type in ENCODERS


def args_from_hf_config(config: dict):
    """The family's ModelArgs for a `config.json` dict (its `model_type` picks the family)."""
    return ARGS[config.get("model_type", "llama")].from_hf_config(config)
