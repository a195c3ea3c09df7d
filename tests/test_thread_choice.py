"""How many threads a decode step uses (thread_choice.h) on made-up step times: a free machine keeps
them all and tries fewer rarely, a busy core makes it use one fewer within tens of steps, and it goes
back when that ends; and the team (team.h) running a job on some of its threads only.
tests/thread_choice_check.cpp, built with the portable flags (the policy and the team have no
vector code) and run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llmcli.native import build

HERE = Path(__file__).parent


def test_the_step_uses_as_many_threads_as_run_it_fastest(tmp_path):
    cxx = build.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path / "thread_choice_check"
    subprocess.run([cxx, "-O2", "-std=c++17", "-pthread", *build.VARIANTS["portable"].flags, f"-I{build.INCLUDE}",
                    str(HERE / "thread_choice_check.cpp"), "-o", str(exe)], check=True, capture_output=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
