"""The one place a model on disk is opened: a `.gguf` file or a Hugging Face folder -> ModelFile.

Planning (runtime/probe.py), loading (runtime/loader.py), `show` (info.py) and `quantize`
(quant/pipeline.py) all take the ModelFile, so each file's header is parsed once per command. Only
headers are read here: tensors stay in the file (a memory map, or safetensors shards) until
`sources()` hands them out one at a time, and the tokenizer is built on first use.

    .gguf    metadata key/values, the tensor table, the data in a memory map
    folder   config.json (an llmcli checkpoint's carries a `quantization` block), the safetensors
             shards' JSON headers, the tokenizer files and chat template beside them
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..errors import ModelNotFoundError, UnsupportedModelError
from ..models import args_from_hf_config, is_encoder
from . import chat_template as templates
from . import embedding
from . import gguf as gguf_file
from . import hf_folder
from .tensors import Source, folder_sources, gguf_sources
from .tokenizer import Tokenizer, from_gguf_metadata, from_hf_folder

_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def check_model_path(path: str | Path) -> Path:
    """A model folder or a .gguf file, or the error that says what to pass instead."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelNotFoundError(f"{path} does not exist; pass a .gguf file or a model folder")
    if path.is_dir():
        return path
    if not path.is_file():  # a FIFO would block the first read, a device never end
        raise UnsupportedModelError(f"{path} is not a regular file (a FIFO or a device?); "
                                    "pass a .gguf file or a model folder")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except PermissionError:  # not "neither a GGUF file nor a model folder": it may well be one
        raise ModelNotFoundError(f"{path} cannot be read: permission denied; check its permissions "
                                 f"(`ls -l {path}`)") from None
    except OSError as e:
        raise ModelNotFoundError(f"{path} cannot be read ({e.strerror or e})") from None
    if magic == gguf_file.GGUF_MAGIC:
        return path
    if path.suffix == ".safetensors":
        raise UnsupportedModelError(f"{path} is a bare weights file; pass the folder that holds it with config.json")
    raise UnsupportedModelError(f"{path} is neither a GGUF file nor a model folder")


def open_model_file(path: str | Path) -> "ModelFile":
    """The model at `path`, headers read (one clear error for a missing, corrupt or foreign file)."""
    path = check_model_path(path)
    if path.is_dir():
        config = hf_folder.read_config(path)
        return ModelFile(path, "safetensors", config, files=hf_folder.safetensors_files(path))
    reader = gguf_file.open_gguf(path)
    return ModelFile(path, "gguf", gguf_file.read_metadata(reader), reader=reader)


@dataclass(eq=False)
class ModelFile:
    path: Path
    format: str  # "gguf" | "safetensors"
    metadata: dict  # the GGUF key/values, or the folder's config.json
    reader: object = None  # gguf.GGUFFile (GGUF)
    files: list[Path] = field(default_factory=list)  # the safetensors shards (folders)

    # ------------------------------------------------------------------ what the model is

    def release_pages(self, address: int, nbytes: int) -> bool:
        """Drop the memory-mapped file's pages under a range of it (GGUFFile.release_pages); False
        where the range is not the file's (a folder's tensors are read into memory, not mapped)."""
        return self.reader is not None and self.reader.release_pages(address, nbytes)

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture" if self.is_gguf else "model_type")

    @property
    def is_gguf(self) -> bool:
        return self.format == "gguf"

    @cached_property
    def args(self):
        """The family's ModelArgs (UnsupportedModelError for an architecture llmcli does not run)."""
        if self.is_gguf:
            return gguf_file.model_args(self.metadata, {t.name for t in self.reader.tensors}, self.reader)
        return args_from_hf_config(self.metadata)

    @property
    def is_encoder(self) -> bool:
        """An embedding model (BERT): it makes vectors, never text."""
        return is_encoder(self.args)

    @cached_property
    def pooling(self):
        """models.pooling.Pooling as the files say (formats/embedding.py); None for a causal model
        that declares none."""
        if self.is_gguf:
            return embedding.gguf_pooling(self.metadata, self.architecture, self.is_encoder)
        return embedding.folder_pooling(self.path, self.args)

    @property
    def max_text_tokens(self) -> int | None:
        """The longest text an embedding model takes, in tokens (sentence-transformers' max_seq_length,
        else its positions); None: its context."""
        limit = None if self.is_gguf else embedding.max_text_tokens(self.path)
        if self.is_encoder:
            limit = min(limit or self.args.max_position_embeddings, self.args.max_position_embeddings)
        return limit

    @property
    def quantization(self) -> dict | None:
        """An llmcli checkpoint's `quantization` block (how it is packed), else None."""
        return None if self.is_gguf else self.metadata.get("quantization")

    @property
    def name(self) -> str:
        return (self.metadata.get("general.name") if self.is_gguf else None) or self.path.name

    @property
    def keeps_blocks(self) -> bool:
        """Whether loading as stored keeps quantized blocks packed (quant/gguf_import.as_stored_preset):
        a GGUF file, or a folder with MXFP4 experts (gpt-oss as OpenAI ships it)."""
        return self.is_gguf or (self.quantization is None and
                                any(h.get("dtype") == "MXFP4" for h in self.headers.values()))

    @property
    def license(self) -> str | None:
        return self.metadata.get("general.license") if self.is_gguf else None

    @property
    def context_length(self) -> int | None:
        if self.is_gguf:
            return self.metadata.get(f"{self.architecture}.context_length")
        return self.metadata.get("max_position_embeddings")

    @property
    def file_type(self) -> str | None:
        """GGUF's `general.file_type` by name (Q4_1, Q4_K_M, ...); None when it says nothing known."""
        from gguf import LlamaFileType

        try:
            return LlamaFileType(self.metadata.get("general.file_type", -1)).name.removeprefix("MOSTLY_")
        except ValueError:
            return None

    @property
    def weights_type(self) -> str:
        """How the weights are stored: "Q4_1", "bfloat16", "q4 (llmcli)"."""
        if self.is_gguf:  # a file without general.file_type: the type most of its matrices have
            matrices = Counter(t.tensor_type.name for t in self.reader.tensors if len(t.shape) > 1)
            return self.file_type or (matrices.most_common(1)[0][0] if matrices else "unknown")
        if self.quantization is not None:
            return f"{self.quantization.get('preset')} (llmcli)"
        return str(self.metadata.get("torch_dtype", self.metadata.get("dtype", "?")))

    @property
    def nbytes(self) -> int:
        """The weights' size on disk."""
        return self.path.stat().st_size if self.is_gguf else hf_folder.weights_bytes(self.files)

    # ------------------------------------------------------------------ the tensor table

    @cached_property
    def headers(self) -> dict[str, dict]:
        """Folders: every shard's tensors, {name: {"dtype", "shape", ...}} from the JSON headers
        (gpt-oss's 3-D experts as each expert's matrices and biases, dtype "MXFP4" from blocks)."""
        out = {}
        for f in self.files:
            for k, v in hf_folder.read_header(f).items():
                parts = None if k == "__metadata__" else hf_folder.expert_parts(k, tuple(v["shape"]))
                if parts is None and k != "__metadata__":
                    out[hf_folder.module_name(k)] = v
                for name, shape, *_ in parts or ():
                    out[name] = {"dtype": "MXFP4" if k.endswith("_blocks") else v["dtype"], "shape": list(shape)}
        return out

    def tensor_types(self) -> Counter:
        """How many tensors of each stored type (GGUF names, or safetensors dtypes)."""
        if self.is_gguf:
            return Counter(t.tensor_type.name for t in self.reader.tensors)
        return Counter(t["dtype"] for t in self.headers.values())

    def parameters(self) -> int:
        if self.is_gguf:
            return sum(int(t.n_elements) for t in self.reader.tensors)
        return sum(math.prod(t["shape"]) for t in self.headers.values())

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight's shape under its Hugging Face name."""
        if self.is_gguf:
            return {n: gguf_file.tensor_shape(t) for n, t, _ in
                    gguf_file.iter_tensors(self.reader, self.args, self.architecture)}
        return {k: tuple(v["shape"]) for k, v in self.headers.items()}

    def block_types(self) -> set[str]:
        """GGUF: the stored types of the matrices (Q4_1, Q8_0, ...)."""
        return {t.tensor_type.name for t in self.reader.tensors if len(t.shape) > 1} if self.is_gguf else set()

    def sources(self) -> list[Source]:
        """The tensors under Hugging Face names, read lazily (GGUF Q/K rows un-permuted on read)."""
        return list(self._sources)

    @cached_property
    def _sources(self) -> tuple[Source, ...]:
        # listed once: choosing the step, planning memory and loading each ask (the folder's files opened each time)
        if self.is_gguf:
            return tuple(gguf_sources(self.reader, self.args, self.architecture))
        return tuple(folder_sources(self.files))

    def state_dict(self, dtype, device) -> dict:
        """All weights dequantized to `dtype` on `device`, under Hugging Face names."""
        if self.is_gguf:
            return gguf_file.load_state_dict(self.reader, self.args, self.architecture, dtype, device)
        return hf_folder.load_state_dict(self.files, dtype, device)

    # ------------------------------------------------------------------ tokenizer and template

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return from_gguf_metadata(self.metadata) if self.is_gguf else from_hf_folder(self.path, self.metadata)

    @property
    def stored_chat_template(self) -> str | None:
        """The template the file itself carries (None: none)."""
        return self.metadata.get("tokenizer.chat_template") if self.is_gguf else hf_folder.chat_template(self.path)

    @cached_property
    def chat_template(self) -> str | None:
        """The file's template, or for a GGUF without one the architecture's usual one."""
        template = self.stored_chat_template
        if template is None and self.is_gguf:
            tok = self.tokenizer
            template = templates.fallback_template(self.architecture, {tok.token_text(i) for i in tok.special_ids})
        return template

    def files_on_disk(self) -> list[dict]:
        """[{"name", "size"}] of what the model is made of (a folder: every file in it)."""
        if self.is_gguf:
            return [{"name": self.path.name, "size": self.path.stat().st_size}]
        found = sorted((p for p in self.path.iterdir() if p.is_file()), key=lambda p: p.name)
        return [{"name": p.name, "size": p.stat().st_size} for p in found]
