"""The layout's rules, read from the source: imports point down the layers, never in a circle, and
only the layers that may touch a concern do (the CLI prints, formats/ reads model files).

    cli -> chat, serve, bench -> runtime -> decode, quant -> formats -> models -> cache, native, hub -> leaves
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "llmcli"
# rank of each top-level part of llmcli: an import may only go to a lower rank (or within its own part)
RANKS = {"cli": 7, "chat": 6, "serve": 6, "bench": 6, "runtime": 5, "decode": 4, "quant": 4, "formats": 3,
         "models": 2, "cache": 1, "native": 1, "hub": 1,
         "heap": 0, "text_input": 0, "json_input": 0, "errors": -1, "notices": -1, "__init__": -1, "__main__": 8}
# third-party modules that read model files: only formats/ opens them
READERS = {"safetensors": "safe_open", "gguf": "GGUFReader"}


def modules() -> dict[str, Path]:
    """Dotted module name under llmcli -> its file."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = modules()


def imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported llmcli module, line) for every import in the file, in functions too."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
            target = ".".join(base + (node.module.split(".") if node.module else []))
            for alias in node.names:  # `from . import x` may name a submodule
                sub = f"{target}.{alias.name}" if target else alias.name
                found.append((sub if sub in MODULES else target, node.lineno))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llmcli."):
            found.append((node.module.removeprefix("llmcli."), node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name.removeprefix("llmcli."), node.lineno) for a in node.names if a.name.startswith("llmcli.")]
    return [(t, line) for t, line in found if t]


def part(module: str) -> str:
    return module.split(".")[0]


def test_every_part_has_a_rank():
    assert {part(m) for m in MODULES} <= set(RANKS)


def test_imports_point_down_the_layers():
    upward = []
    for name, path in MODULES.items():
        for target, line in imports(name, path):
            if part(target) != part(name) and RANKS[part(target)] >= RANKS[part(name)]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports llmcli.{target}")
    assert not upward, "upward or sideways imports:\n" + "\n".join(upward)


def test_no_import_circles():
    graph = {name: {t for t, _ in imports(name, path) if t in MODULES and t != name} for name, path in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("library", ["typer", "rich", "prompt_toolkit"])
def test_only_the_cli_talks_to_the_terminal(library):
    offenders = []
    for name, path in MODULES.items():
        if part(name) in ("cli", "__main__"):
            continue
        tree = ast.parse(path.read_text())
        script = _main_block_lines(tree)  # `python -m llmcli.x` entry points may print
        for node in ast.walk(tree):
            if getattr(node, "lineno", 0) in script:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n == library or n.startswith(library + ".") for n in names):
                offenders.append(f"{name}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                offenders.append(f"{name}:{node.lineno} print()")
    assert not offenders, f"{library} or print() outside llmcli/cli: {offenders}"


def _main_block_lines(tree: ast.Module) -> set[int]:
    """The lines of a module's `if __name__ == "__main__":` blocks."""
    lines = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


@pytest.mark.parametrize("library", sorted(READERS))
def test_only_formats_reads_model_files(library):
    offenders = []
    for name, path in MODULES.items():
        if part(name) == "formats":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == library:
                if any(a.name == READERS[library] for a in node.names):
                    offenders.append(f"{name}:{node.lineno}")
            if isinstance(node, ast.Attribute) and node.attr in ("safe_open", "GGUFReader", "open_gguf"):
                offenders.append(f"{name}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Name) and node.id in ("open_gguf", "GGUFFile"):
                offenders.append(f"{name}:{node.lineno} {node.id}")
    assert not offenders, f"model files read outside llmcli/formats: {offenders}"


def test_the_rules_catch_a_violation(tmp_path, monkeypatch):
    """The checks above can fail: a planted upward import and a planted circle are both found."""
    bad = tmp_path / "llmcli"
    (bad / "cache").mkdir(parents=True)
    (bad / "decode").mkdir()
    (bad / "__init__.py").write_text("")
    (bad / "cache" / "__init__.py").write_text("from ..decode import x\n")  # cache (1) -> decode (4): upward
    (bad / "decode" / "__init__.py").write_text("")
    (bad / "decode" / "x.py").write_text("from . import y\n")
    (bad / "decode" / "y.py").write_text("from .x import z\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", bad)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", modules())
    with pytest.raises(AssertionError, match="llmcli.decode"):
        test_imports_point_down_the_layers()
    with pytest.raises(AssertionError, match="decode.x -> decode.y -> decode.x"):
        test_no_import_circles()
