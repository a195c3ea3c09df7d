"""The Hugging Face source: the real huggingface_hub client against a stand-in Hub on 127.0.0.1."""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from hub_server import StandInHub
from test_cli_run import assert_one_line_error
from tiny import hf_model, save_hf

from llmcli.errors import DiskFullError, NotCachedError
from llmcli.hub.registry import Source
from llmcli.hub.sources import hf

BIG = 24 << 20  # larger than huggingface_hub's 10 MB download chunk, so a cut lands after a written chunk


def _folder_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """org/tiny: two commits of a tiny llama (tag v1 on the first); org/big: one 24 MB GGUF-named blob and a
    small one; meta/gated: gated."""
    root = tmp_path_factory.mktemp("repos")
    first = _folder_files(save_hf(hf_model("llama", seed=1), root / "one"))
    second = _folder_files(save_hf(hf_model("llama", seed=2, num_hidden_layers=3), root / "two"))
    with StandInHub(page_size=2) as server:  # small pages: the client must follow the Link header
        server.first = server.commit("org/tiny", {**first, "README.md": b"# tiny\n", "pytorch_model.bin": b"pickle"})
        server.second = server.commit("org/tiny", second)
        server.tag("org/tiny", "v1", server.first)
        server.big = os.urandom(BIG)
        server.commit("org/big", {"big-Q4_K_M.gguf": server.big, "big-Q8_0.gguf": b"GGUF" + b"\0" * 100,
                                  "README.md": b"big"})
        server.commit("meta/gated", first, gated=True)
        yield server


@pytest.fixture
def env(tmp_path, hub):
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "LLMCLI_HOME": str(tmp_path / "home"),
            "HF_TOKEN": "", "HF_HUB_OFFLINE": "0", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def snapshot(env: dict, repo: str, commit: str) -> Path:
    return Path(env["HF_HOME"]) / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / commit


def dead_endpoint() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_pull_then_run_from_the_cache(hub, env):
    r = run_cli("pull", "org/tiny", env=env)
    assert r.returncode == 0, r.stderr
    folder = snapshot(env, "org/tiny", hub.second)
    assert r.stdout.strip() == str(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                         "tokenizer.json", "tokenizer_config.json"]
    assert (folder / "config.json").read_bytes() == hub.repos["org/tiny"].commits[hub.second]["config.json"]
    before = len(hub.requests)
    r = run_cli("run", "org/tiny", "Hello", "-n", "3", "--temp", "0", env=env)
    assert r.returncode == 0, r.stderr
    assert len(hub.requests) == before  # a cached model needs no network at all
    assert r.stderr == ""  # no progress bar when stderr is not a terminal


def test_run_pulls_on_first_use(hub, env):
    r = run_cli("run", "org/tiny", "Hello", "-n", "2", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert snapshot(env, "org/tiny", hub.second).is_dir()


def test_resume_after_a_cut_in_the_middle(hub, env):
    hub.cut_once.add("big-Q4_K_M.gguf")
    r = run_cli("pull", "org/big:Q4_K_M", env=env)
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path.name == "big-Q4_K_M.gguf" and path.read_bytes() == hub.big
    gets = hub.downloads("big-Q4_K_M.gguf")
    assert len(gets) == 2 and "range" not in gets[0]
    start = int(gets[1]["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < start < BIG  # the second request asked only for the rest
    blobs = Path(env["HF_HOME"]) / "hub" / "models--org--big" / "blobs"
    assert not list(blobs.glob("*.incomplete"))
    assert (blobs / hashlib.sha256(hub.big).hexdigest()).exists()  # named by its sha256, as the Hub's cache does


def test_revision_pinning(hub, env, tmp_path):
    for revision in (hub.first, "v1"):
        r = run_cli("pull", f"org/tiny@{revision}", env=env)
        assert r.returncode == 0, r.stderr
        folder = Path(r.stdout.strip())
        assert folder == snapshot(env, "org/tiny", hub.first)
        weights = hub.repos["org/tiny"].commits[hub.first]["model.safetensors"]
        assert (folder / "model.safetensors").read_bytes() == weights
        assert not (folder / "pytorch_model.bin").exists() and not (folder / "README.md").exists()
    registry = tmp_path / "models.toml"
    registry.write_text(f'[models."tiny:old"]\n[[models."tiny:old".sources]]\n'
                        f'hf = "org/tiny"\nrevision = "{hub.first}"\n')
    r = run_cli("pull", "tiny:old", "--registry", str(registry), env=env)
    assert r.returncode == 0 and Path(r.stdout.strip()) == snapshot(env, "org/tiny", hub.first)
    r = run_cli("pull", "org/tiny@no-such-branch", env=env)
    assert_one_line_error(r, "org/tiny has no revision 'no-such-branch'")


def test_offline_uses_only_the_cache(hub, env):
    assert run_cli("pull", "org/tiny", env=env).returncode == 0
    away = {**env, "HF_ENDPOINT": dead_endpoint()}
    before = len(hub.requests)
    for extra_env, flags in (({}, ["--offline"]), ({"HF_HUB_OFFLINE": "1"}, [])):
        r = run_cli("run", "org/tiny", "Hello", "-n", "2", *flags, env={**away, **extra_env})
        assert r.returncode == 0, r.stderr
    r = run_cli("pull", "org/tiny", "--offline", env=away)
    assert r.returncode == 0, r.stderr  # already there: nothing to do
    r = run_cli("run", "org/big:Q4_K_M", "Hello", "--offline", env=env)
    assert_one_line_error(r, "org/big:Q4_K_M is not downloaded", "--offline uses only the cache", "llmcli pull")
    assert len(hub.requests) == before


def test_no_network_says_what_is_missing(env):
    r = run_cli("run", "org/tiny", "Hello", env={**env, "HF_ENDPOINT": dead_endpoint()})
    assert_one_line_error(r, "cannot reach the Hugging Face Hub", "hf:org/tiny@main is not in the cache",
                          "--offline uses only the cache")


def test_gated_repo_says_how_to_log_in(hub, env):
    r = run_cli("pull", "meta/gated", env=env)
    assert_one_line_error(r, "meta/gated is gated", "hf auth login", "HF_TOKEN")
    r = run_cli("pull", "meta/gated", env={**env, "HF_TOKEN": "hf_valid_token"})
    assert r.returncode == 0, r.stderr
    auth = [h.get("authorization") for m, p, h in hub.requests if p.startswith("/meta/gated/resolve/")]
    assert "Bearer hf_valid_token" in auth


def test_missing_repo_says_there_is_no_such_model(env):
    assert_one_line_error(run_cli("pull", "org/nothing-here", env=env), "there is no model org/nothing-here")
    assert_one_line_error(run_cli("run", "hf:org/nothing-here", "hi", env=env), "there is no model org/nothing-here")


def test_a_quantization_must_pick_one_file(env):
    r = run_cli("pull", "org/big", env=env)  # no safetensors and no quantization named
    assert_one_line_error(r, "has no files matching", "org/name:Q4_K_M")
    assert_one_line_error(run_cli("pull", "org/big:Q9", env=env), "has no files matching")


def test_progress_reports_bytes_written(hub, tmp_path):
    seen = []
    source = Source("hf", repo="org/tiny", revision=hub.first)
    path = hf.fetch(source, progress=lambda *a: seen.append(a), cache_dir=tmp_path, endpoint=hub.url)
    assert path.name == hub.first
    expected = sum(len(hub.repos["org/tiny"].commits[hub.first][f]) for f in (
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"))
    label, done, total = seen[-1]
    assert label == f"hf:org/tiny@{hub.first}" and done == total == expected
    assert hf.cached(source, cache_dir=tmp_path) == path
    with pytest.raises(NotCachedError, match="--offline"):
        hf.fetch(Source("hf", repo="org/big", files=("*.gguf",)), offline=True, cache_dir=tmp_path)


def test_disk_full_removes_the_partial_file(hub, tmp_path, monkeypatch):
    import huggingface_hub.file_download as fd

    real = fd.http_get

    class Full:
        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, data):
            if self.written + len(data) > 200_000:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.written += len(data)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(fd, "http_get", lambda url, temp_file, **kw: real(url, Full(temp_file), **kw))
    monkeypatch.setattr(fd.constants, "DOWNLOAD_CHUNK_SIZE", 64 << 10)
    source = Source("hf", repo="org/big", files=("big-Q4_K_M.gguf",))
    with pytest.raises(DiskFullError, match="the disk is full.*partial file was removed"):
        hf.fetch(source, cache_dir=tmp_path, endpoint=hub.url)
    assert not list(tmp_path.rglob("*.incomplete"))
    blobs = tmp_path / "models--org--big" / "blobs"
    assert not blobs.exists() or not any(blobs.iterdir())
    assert hf.cached(source, cache_dir=tmp_path) is None


def test_two_pulls_at_once_share_the_cache(hub, env):
    cmd = [sys.executable, "-m", "llmcli", "pull", "org/big:Q4_K_M"]
    full_env = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    paths = {Path(out.strip()) for out, _ in outs}
    assert len(paths) == 1 and paths.pop().read_bytes() == hub.big


def test_a_host_that_never_answers_ends_in_seconds(tmp_path):
    """The connection is accepted and nothing comes back: huggingface_hub's first call had no timeout
    and waited 200 s and more. Now a read timeout ends it in one line that says how to work offline."""
    import time

    from hub_server import SilentHost

    with SilentHost() as silent:
        env = {"HF_ENDPOINT": silent.url, "HF_HOME": str(tmp_path / "hf"), "LLMCLI_HOME": str(tmp_path / "home"),
               "HF_TOKEN": "", "HF_HUB_OFFLINE": "0", "HF_HUB_DOWNLOAD_TIMEOUT": "2",
               "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        t0 = time.monotonic()
        r = run_cli("run", "org/never", "hi", env=env, timeout=120)
        took = time.monotonic() - t0
    assert_one_line_error(r, "did not answer in time", "--offline")
    assert took < 30, took
    assert silent.held  # it did connect
