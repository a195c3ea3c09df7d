"""The shell examples of README.md and docs/*.md, run as written, with `python -m llmcli` from this
checkout in place of `llmcli`, offline, in a fresh folder per page.

Conventions (docs/architecture.md, "Documentation examples"):
- a ```sh block whose lines start with `$ ` is a transcript: each `$ ` line is a command (continued
  on the next lines while bash finds it incomplete), the lines after it its output as shown. The
  output (stdout and stderr) must contain each shown line, where `...` stands for any text and a
  number with a decimal point for any number. A command must succeed unless the next one is
  `echo $?`, whose shown output is the exit status expected;
- any other ```sh block is a script: every command in it must succeed;
- `<!-- file: NAME -->` on the line before a block writes the block into the page's folder as NAME;
- `<!-- not tested: REASON -->` on the line before a ```sh block leaves it out, for that reason;
- `llmcli serve` in a transcript starts a server that lives until the page's next `serve` or its
  end, on a free port: `127.0.0.1:8080` in the page's commands, output and files means that port.
An unmarked example that fails offline (it needs the network, a GPU, a file no one provides) fails
the test: mark it, with its reason.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import conftest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!--\s*(not tested|file):\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
NUMBER = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")  # a shown number with a decimal point: any number
ANY_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
SHOWN_PORT = "127.0.0.1:8080"
NOTES = "Mercury is the smallest planet. Venus is the hottest. Mars has the tallest volcano.\n"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    not_tested: str | None  # the reason, when marked
    file: str | None  # the name to write it as, when marked

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, each with the marker on the line before it (if any)."""
    found, lines, i = [], page.read_text(encoding="utf-8").splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang, start = len(opening.group(1)), opening.group(2), i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        marker = MARKER.match(lines[start - 1].strip()) if start else None
        kind, value = (marker.group(1), marker.group(2)) if marker else (None, None)
        found.append(Block(page, start + 1, lang, "\n".join(body) + "\n", value if kind == "not tested" else None,
                           value if kind == "file" else None))
        i += 1
    return found


def _incomplete(command: str) -> bool:
    """Whether bash needs more lines: a trailing backslash, an open here-document, an open quote."""
    if command.endswith("\\"):
        return True
    heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", command)
    if heredoc and heredoc.group(1) not in command.splitlines()[1:]:
        return True
    return subprocess.run(["bash", "-n", "-c", command], capture_output=True).returncode != 0


def transcript(block: Block) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown after it) for each `$ ` command of a transcript block."""
    steps, lines, i = [], block.text.splitlines(), 0
    while i < len(lines):
        assert lines[i].startswith("$ "), f"{block.where}: a transcript's first line must be a `$ ` command"
        command = lines[i][2:]
        i += 1
        while _incomplete(command) and i < len(lines):
            command += "\n" + lines[i]
            i += 1
        shown = []
        while i < len(lines) and not lines[i].startswith("$ "):
            shown.append(lines[i])
            i += 1
        steps.append((command, shown))
    return steps


def is_transcript(block: Block) -> bool:
    return block.text.startswith("$ ")


def _squeeze(text: str) -> str:
    return " ".join(text.split())


def shown_line_pattern(line: str) -> re.Pattern:
    """`...` is any text, a number with a decimal point any number; whitespace runs are one space."""
    pieces = []
    for piece in _squeeze(line).split("..."):
        at, pattern = 0, ""
        for number in NUMBER.finditer(piece):
            pattern += re.escape(piece[at:number.start()]) + ANY_NUMBER
            at = number.end()
        pieces.append(pattern + re.escape(piece[at:]))
    return re.compile(".*?".join(pieces))


def missing_lines(shown: list[str], output: str) -> list[str]:
    """The shown lines that no line of the output contains."""
    got = [_squeeze(line) for line in output.splitlines()]
    wanted = [line for line in shown if _squeeze(line).replace("...", "").strip()]
    return [line for line in wanted if not any(shown_line_pattern(line).search(g) for g in got)]


# ---- checks that need no model: the pages' shape ----

def test_every_example_is_run_or_marked_with_a_reason():
    for page in PAGES:
        for block in blocks(page):
            if block.not_tested is not None:
                assert block.lang == "sh", f"{block.where}: only sh examples are run, so only they take 'not tested'"
                assert block.not_tested, f"{block.where}: 'not tested' needs its reason"
            if block.file is not None:
                assert block.lang != "sh", f"{block.where}: a file block is not an example; use another language"
                assert "/" not in block.file, f"{block.where}: a file block's name is a plain file name"
            if block.lang == "sh" and block.not_tested is None:
                if is_transcript(block):
                    for command, _ in transcript(block):
                        assert command.strip(), f"{block.where}: an empty command"
                else:
                    assert "llmcli serve" not in block.text, \
                        f"{block.where}: start `llmcli serve` in a transcript ($ lines), where the test runs it in the background"


def test_every_marker_sits_on_the_line_before_a_block():
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            if line.strip().startswith("<!--") and re.search(r"not tested|file:", line):
                assert MARKER.match(line.strip()), f"{page.relative_to(REPO)}:{n + 1}: a marker the test cannot read"
                assert n + 1 < len(lines) and FENCE.match(lines[n + 1]), \
                    f"{page.relative_to(REPO)}:{n + 1}: a marker must be on the line just before its block"


def test_the_readme_is_the_front_door():
    """At most 12,000 bytes, with exactly one set-up line that runs the tests (.ci/run runs it)."""
    readme = REPO / "README.md"
    assert len(readme.read_bytes()) <= 12_000
    test_lines = [line for line in readme.read_text(encoding="utf-8").splitlines()
                  if line.startswith("python3 -m venv") and "pytest" in line]
    assert test_lines == ["python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e '.[dev]' && "
                          ".venv/bin/python -m pytest -q"]


# Written by other parts of issue 34 (native/ by architecture, benchmarks/ with a guide); once those
# branches are in, both exist and this set can go.
def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    inside, anchors = False, set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_links_between_pages_resolve():
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            relative = resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else str(resolved)
            assert resolved.exists(), f"{page.relative_to(REPO)}: a link to {target}, which does not exist"
            if anchor:
                assert anchor in _anchors(resolved), f"{page.relative_to(REPO)}: a link to {target}: no such heading"


# ---- the examples, run ----

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shims(folder: Path) -> Path:
    """`llmcli`, `python` and `python3` on PATH: this interpreter, and llmcli from this checkout
    (`serve` on the page's port)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    py = sys.executable
    (bin_dir / "llmcli").write_text(
        f'#!/bin/sh\nif [ "$1" = serve ]; then exec "{py}" -m llmcli "$@" --port "$DOCS_PORT"; fi\n'
        f'exec "{py}" -m llmcli "$@"\n')
    for name in ("python", "python3"):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{py}" "$@"\n')
    for shim in bin_dir.iterdir():
        shim.chmod(0o755)
    return bin_dir


def _provided_files(folder: Path, smollm2: Path) -> None:
    """The files the pages use without showing them."""
    import tool_templates

    for name in ("model.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"):
        (folder / name).symlink_to(smollm2)
    (folder / "qwen2.5.jinja").write_text(tool_templates.QWEN25)
    for grammar in (REPO / "tests" / "data" / "grammars").glob("*.gbnf"):
        (folder / grammar.name).write_text(grammar.read_text())
    (folder / "notes.txt").write_text(NOTES)


class Server:
    """`llmcli serve ...` as written, in the background, until stop()."""

    def __init__(self, command: str, cwd: Path, env: dict, log: Path):
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def banner(self, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text()
            if "serving " in text or self.proc.poll() is not None:
                return text
            time.sleep(0.2)
        return self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _run_page(page: Path, folder: Path, smollm2: Path) -> list[str]:
    """Every tested example of the page, in order; the failures, described."""
    port = _free_port()
    local = lambda text: text.replace(SHOWN_PORT, f"127.0.0.1:{port}")  # noqa: E731
    _provided_files(folder, smollm2)
    examples = []
    for block in blocks(page):
        if block.file:
            (folder / block.file).write_text(local(block.text))
        elif block.lang == "sh" and block.not_tested is None:
            examples.append(block)
    env = {**os.environ, "PYTHONPATH": str(REPO), "LLMCLI_HOME": str(conftest.test_cache_dir() / "llmcli-home"),
           "PATH": f"{_shims(folder)}{os.pathsep}{os.environ['PATH']}", "DOCS_PORT": str(port),
           "NO_COLOR": "1", "COLUMNS": "200", "PIP_NO_INDEX": "1", "HF_HUB_OFFLINE": "1",
           # torch's OpenMP threads spin while they wait: on a machine other work keeps busy, the
           # eager path's examples (a quantized folder, an int8 cache) ran 10x slower for it
           "OMP_WAIT_POLICY": "PASSIVE"}
    env.pop("LLMCLI_API_KEY", None)
    failures, server = [], None

    def run(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=folder, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=300)

    try:
        for block in examples:
            if not is_transcript(block):
                done = run("set -e\n" + block.text)
                if done.returncode:
                    failures.append(f"{block.where}: exit {done.returncode}\n{done.stdout[-3000:]}")
                continue
            steps = [(local(command), [local(line) for line in shown]) for command, shown in transcript(block)]
            for i, (command, shown) in enumerate(steps):
                if command.strip() == "echo $?":
                    continue  # checked with the command before it
                if re.match(r"^(\w+=\S*\s+)*llmcli serve\b", command):
                    if server:
                        server.stop()
                    server = Server(command, folder, env, folder / f"serve-{block.line}.log")
                    output, status = server.banner(), server.proc.poll() or 0
                else:
                    done = run(command)
                    output, status = done.stdout, done.returncode
                if missing := missing_lines(shown, output):
                    failures.append(f"{block.where}: `{command}` did not print {missing}\n{output[-3000:]}")
                following = steps[i + 1] if i + 1 < len(steps) else None
                if following and following[0].strip() == "echo $?":
                    if _squeeze(" ".join(following[1])) != str(status):
                        failures.append(f"{block.where}: `{command}` exited {status}, the page shows {following[1]}")
                elif status:
                    failures.append(f"{block.where}: `{command}` exited {status}\n{output[-3000:]}")
    finally:
        if server:
            server.stop()
    return failures


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_examples_run_as_written(page, tmp_path, smollm2_gguf, minilm_folder):
    if shutil.which("curl") is None and any("curl " in b.text for b in blocks(page) if b.not_tested is None):
        pytest.skip("the page's examples call curl, which is not installed")
    failures = _run_page(page, tmp_path, smollm2_gguf)
    assert not failures, "\n\n".join(failures)
