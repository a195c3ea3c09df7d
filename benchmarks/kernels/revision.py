"""A git revision's C++ kernels, built with the working tree's build.py (its flags), for benchmarks
that set them against the tree's in one process (blocks_vs_revision.py, step_vs_revision.py).
Revisions from the src/ and arch/ layout and the llmcli_step_* names on."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from llmcli.native import build
from llmcli.native.library import Kernels


def kernels_at(rev: str, variant: str) -> Kernels:
    """`variant`'s library compiled from llmcli/native at `rev`, in a temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="kernels-at-"))
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "llmcli/native/"], capture_output=True,
                           text=True, check=True).stdout.split()
    for name in names:
        if name.endswith((".cpp", ".h")):
            to = folder / Path(name).relative_to("llmcli/native")  # src/..., arch/x86/...: build.py's layout
            to.parent.mkdir(parents=True, exist_ok=True)
            to.write_bytes(subprocess.run(["git", "show", f"{rev}:{name}"], capture_output=True, check=True).stdout)
    tree = build.FOLDER
    build.FOLDER = folder  # the revision's sources, the tree's flags
    try:
        return Kernels(build.compile_variant(variant, folder / build.library_name(variant)))
    finally:
        build.FOLDER = tree
