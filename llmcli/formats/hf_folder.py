"""Reading a Hugging Face model folder: `config.json`, safetensors shards, tokenizer files.

Only safetensors are loaded: pickled `.bin`/`.pt` checkpoints can run arbitrary code when opened,
so they are refused with a message saying how to get safetensors instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import json
import re
import struct
from pathlib import Path
from typing import Iterator


from ..errors import CorruptModelError, ModelNotFoundError, UnsupportedModelError
from ..models import SUPPORTED_ARCHITECTURES

if TYPE_CHECKING:
    import torch

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.exists():
        raise ModelNotFoundError(f"{folder} is not a model folder (no config.json); pass a folder with config.json "
                                 "and *.safetensors, or a .gguf file")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptModelError(f"{path} is not valid JSON ({e}); download the model again") from None
    if not isinstance(config, dict):
        raise CorruptModelError(f"{path} is not a JSON object (it holds a {type(config).__name__}); "
                                "download the model again")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"architecture {model_type!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    return config


def safetensors_files(folder: Path) -> list[Path]:
    """The weight shards, in index order when there is an index."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, KeyError, json.JSONDecodeError) as e:
            raise CorruptModelError(f"{index} is malformed ({e}); download the model again") from None
        files = [folder / name for name in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise CorruptModelError(f"{folder} is missing shards {', '.join(missing)}; download the model again")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise UnsupportedModelError(
            f"{folder} only has pickled weights ({pickled[0]}), which can run code when loaded; llmcli loads "
            "safetensors or GGUF only: use the repo's safetensors revision or convert it first")
    raise ModelNotFoundError(f"{folder} has no *.safetensors weights")


# checkpoint names -> the modules' (models/moe.py): Mixtral's experts are w1 (gate), w3 (up), w2 (down)
# under block_sparse_moe on the Hub
_RENAMES = [(re.compile(r"\.block_sparse_moe\.gate\."), ".mlp.gate."),
            (re.compile(r"\.block_sparse_moe\.experts\.(\d+)\.w1\."), r".mlp.experts.\1.gate_proj."),
            (re.compile(r"\.block_sparse_moe\.experts\.(\d+)\.w3\."), r".mlp.experts.\1.up_proj."),
            (re.compile(r"\.block_sparse_moe\.experts\.(\d+)\.w2\."), r".mlp.experts.\1.down_proj.")]


def module_name(name: str) -> str:
    """A checkpoint's tensor name as llmcli's modules name it (most are the same; gpt-oss's router
    is `mlp.router`, the other families' `mlp.gate`)."""
    if "block_sparse_moe" in name:
        for pattern, repl in _RENAMES:
            name = pattern.sub(repl, name)
    return name.replace(".mlp.router.", ".mlp.gate.")


# gpt-oss: each layer's experts in 3-D tensors, plain or MXFP4 (blocks and scales)
_FUSED_EXPERTS = re.compile(r"(.+\.mlp\.experts)\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?")
# e2m1 codes -> values (the OCP microscaling spec's FP4; the sign is the code's high bit)
_FP4 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def mxfp4_values(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """HF's MXFP4: blocks (..., G, 16) uint8, scales (..., G) uint8 -> float32 (..., G * 32). Byte j of
    a block holds element 2j in its low nibble and 2j + 1 in its high one; the block's value is
    code * 2^(scale - 127) (transformers' integrations/mxfp4.py; GGUF's MXFP4 orders them as its
    other 4-bit blocks, element j low and j + 16 high: formats/gguf.py reads those)."""
    import torch

    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise CorruptModelError(f"MXFP4 blocks of shape {tuple(blocks.shape)} do not go with scales of shape "
                                f"{tuple(scales.shape)}; download the model again")
    lut = torch.tensor(_FP4, dtype=torch.float32)
    b = blocks.to(torch.uint8).long()
    v = torch.stack((lut[b & 15], lut[b >> 4]), dim=-1).reshape(*b.shape[:-1], 32)
    v = torch.ldexp(v, scales.to(torch.int32)[..., None] - 127)
    return v.reshape(*b.shape[:-2], -1)


def mxfp4_as_gguf(blocks: torch.Tensor, scales: torch.Tensor):
    """HF's MXFP4 blocks (N, G, 16) and scales (N, G) -> GGUF's MXFP4 (N, G * 17) uint8 numpy, the
    same codes: [e][byte j: element j low nibble, j + 16 high] (what formats/gguf.py and the
    quantizers read as a GGUF's)."""
    import numpy as np
    import torch

    b = blocks.to(torch.uint8).numpy()
    codes = np.stack((b & 15, b >> 4), axis=-1).reshape(*b.shape[:-1], 32)  # element 2j, 2j + 1
    packed = codes[..., :16] | (codes[..., 16:] << 4)
    out = np.concatenate((scales.to(torch.uint8).numpy()[..., None], packed), axis=-1)
    return np.ascontiguousarray(out.reshape(b.shape[0], -1))


def expert_parts(name: str, shape: tuple[int, ...]):
    """gpt-oss's 3-D expert tensors as llmcli's per-expert modules name them: [(module name, shape,
    expert e, part(get), raw(get) or None)], get(checkpoint name) giving that tensor's slice of expert
    e, part() that expert's matrix or bias from it (gate_up's columns alternate gate, up; the
    matrices are stored (in, out): transposed here) and raw() an MXFP4 matrix's blocks in GGUF's
    layout (kept packed: quant/gguf_import.py). [] for MXFP4 scales (read with their blocks); None
    for a tensor of any other name."""
    m = _FUSED_EXPERTS.fullmatch(name)
    if m is None:
        return None
    base, kind, suffix = m.groups()
    base = module_name(base)
    if suffix == "_scales":
        return []
    scales = name.removesuffix("_blocks") + "_scales"
    if kind == "down_proj":  # (E, I, H) -> (H, I); bias (E, H); blocks (E, H, I/32, 16)
        halves = [("down_proj", slice(None))]
    else:  # (E, H, 2I) -> gate (I, H) from the even columns, up from the odd ones
        halves = [("gate_proj", slice(0, None, 2)), ("up_proj", slice(1, None, 2))]
    out = []
    for e in range(shape[0]):
        for proj, cols in halves:
            if suffix == "_bias":
                n = len(range(shape[1])[cols])
                out.append((f"{base}.{e}.{proj}.bias", (n,), e, lambda get, c=cols: get(name)[c], None))
            elif suffix == "_blocks":  # rows (out features) interleaved for gate_up, as the bias
                n = len(range(shape[1])[cols])
                out.append((f"{base}.{e}.{proj}.weight", (n, shape[2] * 32), e,
                            lambda get, c=cols: mxfp4_values(get(name)[c], get(scales)[c]),
                            lambda get, c=cols: mxfp4_as_gguf(get(name)[c], get(scales)[c])))
            else:
                n = len(range(shape[2])[cols])
                out.append((f"{base}.{e}.{proj}.weight", (n, shape[1]), e,
                            lambda get, c=cols: get(name)[:, c].T.contiguous(), None))
    return out


def load_state_dict(files: list[Path], dtype: torch.dtype, device: torch.device) -> dict:
    """All tensors from the shards (memory-mapped), cast to `dtype` on `device`; gpt-oss's 3-D
    experts split into each expert's matrices (expert_parts)."""
    state, fused = {}, {}
    for name, t in read_tensors(files):
        if name.endswith("rotary_emb.inv_freq"):
            continue  # recomputed; older checkpoints stored it
        if _FUSED_EXPERTS.fullmatch(name):
            fused[name] = t
            continue
        state[module_name(name)] = t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)
    for name, t in fused.items():
        try:
            for part, _, e, take, _ in expert_parts(name, tuple(t.shape)):
                state[part] = take(lambda n: fused[n][e]).to(device=device, dtype=dtype)
        except KeyError as missing:
            raise CorruptModelError(f"{name} has no {missing}; download the model again") from None
    return state


def weights_bytes(files: list[Path]) -> int:
    return sum(f.stat().st_size for f in files)


def chat_template(folder: Path) -> str | None:
    """The template from `chat_template.jinja` or `tokenizer_config.json` (the default one of several)."""
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        try:
            return jinja.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise CorruptModelError(f"{jinja} is not UTF-8 text (byte {e.start}); download the model again") from None
        except OSError as e:
            raise CorruptModelError(f"cannot read {jinja}: {e.strerror or e}") from None
    path = folder / "tokenizer_config.json"
    if not path.exists():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptModelError(f"{path} is not valid JSON ({e}); download the model again") from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if not isinstance(template, (str, list, type(None))):
        raise CorruptModelError(f"{path} has a chat_template that is not text; download the model again")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template


def read_header(path: Path) -> dict:
    """A safetensors file's JSON header: {name: {"dtype", "shape", "data_offsets"}, "__metadata__": ...}."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                raise ValueError("header too large")
            return json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:
        raise CorruptModelError(f"{path} is truncated or corrupt ({e}); download it again") from None


def read_tensors(files: list[Path], what_to_do: str = "download it again") -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the shards, memory-mapped, as stored."""
    from safetensors import SafetensorError, safe_open

    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for key in f.keys():
                    yield key, f.get_tensor(key)
        except (SafetensorError, OSError, ValueError) as e:
            raise CorruptModelError(f"{path} is truncated or corrupt ({e}); {what_to_do}") from None
