"""A reference implementation's answers (transformers reading a real model file) that take longer to
compute than the tests that use them, and depend only on the file and the inputs: kept in
tests/data/NAME.json, with the key they were computed for (the file's hash, the prompts, ...). Where
the key differs (new prompts, another file) they are computed once into the test cache instead;
copy that file over tests/data/NAME.json to keep them (`python -m json.tool` makes it readable)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from conftest import test_cache_dir

DATA = Path(__file__).parent / "data"


def kept(name: str, key: dict, compute):
    """The answers for `key` (JSON data: lists, not tuples), from tests/data, the test cache, or
    compute() (then kept in the test cache, with the versions of what computed them)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    cached = test_cache_dir() / f"{name}-{digest}.json"
    for path in (DATA / f"{name}.json", cached):
        if path.exists():
            stored = json.loads(path.read_text())
            if stored["key"] == key:
                return stored["answers"]
    answers = compute()
    by = ", ".join(f"{m} {sys.modules[m].__version__}" for m in ("transformers", "torch") if m in sys.modules)
    tmp = cached.with_suffix(f".part{os.getpid()}")  # xdist workers may compute it at the same time
    tmp.write_text(json.dumps({"key": key, "computed_by": by, "answers": answers}, ensure_ascii=False))
    tmp.replace(cached)
    return answers
