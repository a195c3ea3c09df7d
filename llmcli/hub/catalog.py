"""What is downloaded (`llmcli list`) and what removing a model deletes (`llmcli rm`).

Downloaded models live in two places: files llmcli extracted into its home (each pull recorded in a
manifest), and the shared Hugging Face cache (registry models found there count even if another tool
downloaded them). Removal deletes only under the llmcli home's models folder, and in the Hugging
Face cache only through huggingface_hub's cache API.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidModelNameError, ModelNotFoundError
from . import sources
from .registry import ModelEntry, Registry, Source, looks_like_path, parse_name
from .store import Store


@dataclass
class Downloaded:
    name: str
    source: str
    path: Path
    size: int
    entry: ModelEntry | None = None


@dataclass
class Removal:
    name: str
    store_paths: list[Path] = field(default_factory=list)  # under the llmcli home
    hf_revisions: list[tuple[str, str, Path, int]] = field(default_factory=list)  # (repo, commit, snapshot, size)
    size: int = 0

    def describe(self) -> list[str]:
        return ([str(p) for p in self.store_paths]
                + [f"{repo}@{commit[:12]} in the Hugging Face cache ({path})"
                   for repo, commit, path, _ in self.hf_revisions])


def size_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())  # follows the cache's symlinks


def downloaded(store: Store, registry: Registry) -> list[Downloaded]:
    """Every model on disk: each registry entry with a cached source, then other pulls from the manifests."""
    found: dict[tuple[str, str], Downloaded] = {}
    for entry in registry.entries.values():
        for source in entry.sources:
            path = sources.cached(source, store)
            if path is not None:
                found.setdefault((entry.name, str(path)), Downloaded(entry.name, _where(source, path), path,
                                                                      size_on_disk(path), entry))
                break
    for m in store.manifests():
        path = Path(m["path"])
        if path.exists() and (m["name"], str(path)) not in found:
            found[(m["name"], str(path))] = Downloaded(m["name"], m["source"], path, size_on_disk(path),
                                                       registry.entries.get(m["name"]))
    return sorted(found.values(), key=lambda d: d.name)


def _where(source: Source, path: Path) -> str:
    if source.kind == "hf":
        commit = next((p.name for p in [path, *path.parents] if p.parent.name == "snapshots"), source.revision)
        return f"hf:{source.repo}@{commit[:12]}"
    return str(source)


def plan_removal(model: str, store: Store, registry: Registry) -> Removal:
    """What `llmcli rm MODEL` would delete; a path is accepted only inside llmcli's own store."""
    text = model.strip()
    if not text.startswith(("hf:", "pypi:")) and looks_like_path(text):
        path = Path(text).expanduser()
        if not store.contains(path) or path.resolve() == store.models_dir.resolve():
            raise InvalidModelNameError(
                f"{text} is not in llmcli's model store ({store.models_dir}); llmcli rm never deletes anything outside "
                "its own folders and the Hugging Face cache — remove it yourself, or pass a name from `llmcli list`")
        names = [m["name"] for m in store.manifests() if Path(m["path"]).resolve() == path.resolve()]
        return Removal(names[0] if names else text, [path], size=size_on_disk(path) if path.exists() else 0)
    entry = parse_name(text, registry)
    plan = Removal(entry.name)
    for source in entry.sources:
        if source.kind == "pypi":
            path = sources.pypi.cached(source, store)
            if path is not None:
                plan.store_paths.append(path)
                plan.size += size_on_disk(path)
        else:
            for revision in _hf_revisions(source):
                plan.hf_revisions.append(revision)
                plan.size += revision[3]
    for m in store.manifests():  # pulls recorded under this name whose files are in the store
        path = Path(m["path"])
        if m["name"] == entry.name and store.contains(path) and path.exists() and path not in plan.store_paths:
            plan.store_paths.append(path)
            plan.size += size_on_disk(path)
    if not plan.store_paths and not plan.hf_revisions:
        raise ModelNotFoundError(f"{entry.name} is not downloaded; `llmcli list` shows what is")
    return plan


def _hf_revisions(source: Source) -> list[tuple[str, str, Path, int]]:
    """The cached revisions `source` refers to: its pinned commit, or what its branch or tag points at."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        return []
    for repo in cache.repos:
        if repo.repo_type != "model" or repo.repo_id != source.repo:
            continue
        if re.fullmatch(r"[0-9a-f]{40}", source.revision):
            chosen = [r for r in repo.revisions if r.commit_hash == source.revision]
        else:
            chosen = [r for r in repo.revisions if source.revision in r.refs]
        return [(source.repo, r.commit_hash, r.snapshot_path, r.size_on_disk) for r in chosen]
    return []


def remove(plan: Removal, store: Store) -> None:
    for path in plan.store_paths:
        store.remove(path)  # refuses anything outside the store's models folder
    if plan.hf_revisions:
        from huggingface_hub import scan_cache_dir

        scan_cache_dir().delete_revisions(*(commit for _, commit, _, _ in plan.hf_revisions)).execute()
    removed = set(map(str, plan.store_paths)) | {str(path) for _, _, path, _ in plan.hf_revisions}
    for m in store.manifests():
        path = m["path"]
        if m["name"] == plan.name or any(path == r or path.startswith(r + "/") for r in removed):
            store.forget(m["name"])
