"""`llmcli quantize MODEL --preset P --format gguf -o model.gguf`: a GGUF file llama.cpp and ollama load.

The preset's formats map onto GGUF block types where llama.cpp has one (the others are refused):

    int4 g32 with a zero point  -> Q4_1     int4 g32 symmetric -> Q4_0     int8 g32 -> Q8_0
    kept in floating point      -> BF16 / F16 / F32 (the preset's dtype); norms, biases and RoPE tables F32

Tensors are quantized exactly as for a checkpoint (convert.quantize_source: the same codes), then
written as blocks (gguf_encode.py) under llama.cpp's names, Q/K rows permuted for llama-type files.
From a Hugging Face folder the metadata is what llama.cpp's convert_hf_to_gguf.py writes
(formats/gguf_hparams.py, formats/gguf_vocab.py); from a GGUF file every key is copied but
general.file_type, and a tensor already in its target type is copied byte for byte.

The file is streamed: tensor infos first, then one tensor at a time, so only one tensor's float
copy exists at once; it appears under its name only when complete (checkpoint.atomic_file).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import LlmcliError
from ..formats import gguf as gguf_file
from ..formats.gguf_hparams import add_hparams, extra_tensors, gguf_architecture
from ..formats.gguf_vocab import add_vocab, quiet_gguf
from ..formats.open import ModelFile, open_model_file
from ..formats.tensors import Source
from . import checkpoint
from .convert import EMBEDDING, HEAD, KEEP, Progress, plan, quantize_source
from .gguf_encode import encode_blocks
from .pipeline import Summary, check_quantizable
from .presets import Preset, QuantSpec, load_preset, shipped_names

# llmcli format -> the GGUF block type that holds it exactly (codes unchanged)
BLOCK_TYPES = {QuantSpec(4, 32, False): "Q4_1", QuantSpec(4, 32, True): "Q4_0", QuantSpec(8, 32, True): "Q8_0"}
FLOAT_TYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
_TORCH_FLOATS = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
# general.file_type (llama.cpp's llama_ftype) for the type most of a model's layer matrices have
FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "F16": 1, "BF16": 32, "F32": 0}
# keys the writer sets itself, never copied from a GGUF source
_OWN_KEYS = ("general.architecture", "general.file_type", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


class NotWritableError(LlmcliError):
    """A preset whose formats GGUF has no block type for."""

    exit_code = 2


@dataclass
class Planned:
    """One tensor of the output: its GGUF name, shape (rows first), type, and how to make its data."""

    name: str
    shape: tuple[int, ...]
    type_name: str
    data: Callable[[], np.ndarray]  # raw bytes (blocks, BF16) or float32 values
    numel: int
    copied: bool = False  # the source's bytes as they are


def writable_presets() -> list[str]:
    """The shipped presets `--format gguf` writes: every rule a GGUF block type or kept in float."""
    def fits(name: str) -> bool:
        preset = load_preset(name)
        return all(r.spec in BLOCK_TYPES or not r.spec.quantized for r in preset.rules)
    return [name for name in shipped_names() if fits(name)]


def gguf_types(specs: dict[str, QuantSpec], shapes: dict[str, tuple], preset: Preset) -> dict[str, str]:
    """Each tensor's GGUF type, or the one-line refusal for a format GGUF has no type for."""
    out = {}
    for name, spec in specs.items():
        if len(shapes[name]) != 2:
            out[name] = "F32"
        elif spec == KEEP:
            out[name] = FLOAT_TYPES[preset.dtype]
        elif spec in BLOCK_TYPES:
            out[name] = BLOCK_TYPES[spec]
        else:
            raise NotWritableError(f"preset {preset.name} stores {name} as {spec.name()}, which GGUF has no type for; "
                                   f"--format gguf writes groups of 32: the presets {', '.join(writable_presets())}")
    return out


def file_type(types: dict[str, str], shapes: dict[str, tuple], preset: Preset) -> int:
    """The type most layer matrices have (a Q4_1 file's embedding is Q8_0, as llama.cpp's are)."""
    layer = Counter(t for name, t in types.items() if ".layers." in name and len(shapes[name]) == 2)
    return FILE_TYPES[layer.most_common(1)[0][0] if layer else FLOAT_TYPES[preset.dtype]]


def quantize_to_gguf(source: Path, preset: Preset | str, out: Path, *, force: bool = False, search: bool = True,
                     progress: Progress | None = None) -> Summary:
    """Convert `source` (a folder or a GGUF file) with `preset` into the GGUF file `out` (atomically)."""
    import gguf

    t0 = time.perf_counter()
    preset = load_preset(preset) if isinstance(preset, (str, Path)) else preset
    out, source = Path(out).expanduser(), Path(source).expanduser()
    if source.exists() and out.resolve() == source.resolve():
        raise checkpoint.OutputExistsError(f"{out} would overwrite the source model; choose another -o")
    mf = open_model_file(source)
    check_quantizable(mf)  # an embedding model or an llmcli checkpoint: quantize the original
    args, sources = mf.args, mf.sources()
    arch = mf.architecture if mf.is_gguf else gguf_architecture(args.model_type)
    specs = plan(sources, preset, args.num_hidden_layers, args.tie_word_embeddings)
    shapes = {s.name: s.shape for s in sources}
    types = gguf_types(specs, shapes, preset)
    n_vocab = _vocab_rows(mf, sources, arch)
    tensors = [_planned(s, specs[s.name], types[s.name], arch, args, search, n_vocab, mf.is_gguf)
               for s in sources if s.name in specs]
    tensors += _rope_tensors(mf, arch, args)
    notes = list(dict.fromkeys(preset.notes))
    with checkpoint.atomic_file(out, force) as tmp, quiet_gguf():
        writer = gguf.GGUFWriter(str(tmp), arch)
        if mf.is_gguf:
            _copy_metadata(writer, mf)
        else:
            _folder_metadata(writer, mf, args, arch, n_vocab, sum(t.numel for t in tensors), notes)
        writer.add_file_type(file_type(types, shapes, preset))
        for t in tensors:
            # shapes in elements (a uint8 dtype would make gguf-py read them as bytes)
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), _nbytes(t),
                                   raw_dtype=gguf.GGMLQuantizationType[t.type_name])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        total, done = sum(t.numel for t in tensors), 0
        for t in tensors:
            data = t.data()
            if data.nbytes != _nbytes(t):
                raise AssertionError(f"{t.name}: {data.nbytes} bytes for {_nbytes(t)}")
            writer.write_tensor_data(data)
            done += t.numel
            if progress:
                progress(done, total, t.name)
        writer.close()
    counts = Counter(t.type_name for t in tensors)
    params = sum(s.numel for s in sources if not (args.tie_word_embeddings and s.name == HEAD))
    size = out.stat().st_size
    return Summary(source, out, preset.name, mf.nbytes, size, params, 8 * size / max(1, params),
                   time.perf_counter() - t0, sum(counts[t] for t in BLOCK_TYPES.values()),
                   sum(t.copied and t.type_name in BLOCK_TYPES.values() for t in tensors), notes, "gguf",
                   dict(counts.most_common()))


def _nbytes(t: Planned) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[t.type_name]]
    return t.numel // block * size


def _vocab_rows(mf: ModelFile, sources: list[Source], arch: str) -> int:
    """The embedding's rows, which the vocabulary must match. Gemma 3's converter trims the embedding
    to the tokenizer's real size (Gemma3Model.modify_tensors)."""
    rows = next(s.shape[0] for s in sources if s.name == EMBEDDING)
    if arch != "gemma3" or mf.is_gguf:
        return rows
    if (mf.path / "tokenizer.model").is_file():
        return rows  # the SentencePiece vocabulary is padded to the config's vocab_size
    import json

    tok = json.loads((mf.path / "tokenizer.json").read_text(encoding="utf-8"))
    return min(rows, len(tok["model"]["vocab"]) + len(tok.get("added_tokens", [])))


def _planned(s: Source, spec: QuantSpec, type_name: str, arch: str, args, search: bool, n_vocab: int,
             from_gguf: bool) -> Planned:
    """How tensor `s` is written: a GGUF source's bytes where they are already `type_name`, else its values
    (HF layout) quantized or cast, then laid out as llama.cpp's converter lays them out."""
    name = gguf_file.gguf_name(s.name, arch)
    if name is None:
        raise NotWritableError(f"{s.name} has no tensor name in llama.cpp's {arch} architecture; "
                               "this model cannot be written as GGUF")
    shape = s.shape
    if s.name == EMBEDDING and shape[0] > n_vocab:
        whole = s
        s = Source(s.name, (n_vocab, *shape[1:]), lambda: whole.values()[:n_vocab])
        shape = s.shape
    if from_gguf and s.gguf_type == type_name and s.raw is not None:  # bytes as stored, in the file's layout already
        return Planned(name, shape, type_name, lambda: np.ascontiguousarray(s.raw()).view(np.uint8).reshape(-1),
                       s.numel, copied=True)
    heads = None
    if gguf_file.permuted(arch) and (".q_proj." in s.name or ".k_proj." in s.name):
        heads = args.num_attention_heads if ".q_proj." in s.name else args.num_key_value_heads
    shift = 1.0 if arch == "gemma3" and s.name.endswith("norm.weight") else 0.0  # llama.cpp stores Gemma's 1 + w

    def data() -> np.ndarray:
        if type_name in _TORCH_FLOATS:
            w = (s.values() + shift).to(_TORCH_FLOATS[type_name])
            rows = w if heads is None else gguf_file.permute_rows(w, heads)
            return rows.contiguous().view(torch.uint8).numpy().reshape(-1)
        q = quantize_source(s, spec, search, portable=False)
        codes = q.state["codes"] if "codes" in q.state else q.state["qweight"]
        blocks = encode_blocks(codes, q.state["scales"], q.state.get("zeros"), type_name)
        if heads is not None:
            blocks = gguf_file.permute_rows(torch.from_numpy(blocks), heads).numpy()
        return np.ascontiguousarray(blocks).reshape(-1)

    return Planned(name, shape, type_name, data, s.numel)


def _rope_tensors(mf: ModelFile, arch: str, args) -> list[Planned]:
    """RoPE tables: a GGUF source's as they are; from a folder, the converter's (llama 3, LongRoPE)."""
    if mf.is_gguf:
        tables = [t for t in mf.reader.tensors if t.name in gguf_file._ROPE_TENSORS]
        return [Planned(t.name, gguf_file.tensor_shape(t), t.tensor_type.name,
                        lambda t=t: np.ascontiguousarray(t.data).view(np.uint8).reshape(-1), int(t.n_elements), True)
                for t in tables]
    return [Planned(name, v.shape, "F32", lambda v=v: v.view(np.uint8).reshape(-1), v.size)
            for name, v in extra_tensors(arch, args).items()]


def _copy_metadata(writer, mf: ModelFile) -> None:
    """Every key of a GGUF source, with its stored type, but those the writer sets itself."""
    from gguf import GGUFValueType

    for key, value in mf.metadata.items():
        if key in _OWN_KEYS or key.startswith("split.") or value == []:  # gguf-py writes no empty array
            continue
        kind, item = mf.reader.value_types[key]
        writer.add_key_value(key, value, GGUFValueType(kind), None if item is None else GGUFValueType(item))


def _folder_metadata(writer, mf: ModelFile, args, arch: str, n_vocab: int, params: int, notes: list[str]) -> None:
    """What convert_hf_to_gguf.py writes: general keys (gguf-py's Metadata, from the folder's name,
    model card and generation_config), the architecture's, the tokenizer's."""
    import gguf

    writer.add_type(gguf.GGUFType.MODEL)
    repo = _snapshot_repo(mf.path)
    try:
        meta = gguf.Metadata.load(None, mf.path, repo, params)
    except Exception:  # a model card's front matter that is not YAML: the name alone, as the converter falls back
        meta = gguf.Metadata(name=repo)
    meta.name = meta.name or mf.path.name
    if meta.size_label is None and params > 0:
        meta.size_label = gguf.size_label(params, params, 0, 0)
    meta.set_gguf_meta_model(writer)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_hparams(writer, args, mf.metadata)
    notes += add_vocab(writer, mf.path, arch, n_vocab)


def _snapshot_repo(path: Path) -> str | None:
    """A Hugging Face cache snapshot (models--org--name/snapshots/<commit>) by its repo's name: the
    folder's own name is a commit hash."""
    for p in (path, *path.parents):
        if p.parent.name == "snapshots" and p.parent.parent.name.startswith("models--"):
            return p.parent.parent.name.split("--")[-1]
    return None
