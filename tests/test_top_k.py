"""TopK (the decode step's finder of each row's largest logits) given a row in pieces in any order,
as a step's threads give it the head's chunks: tests/top_k_check.cpp, built with each kernel variant
this CPU runs (vec.h's vectors are the variant's) and run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llmcli.native import build, cpu

HERE = Path(__file__).parent


@pytest.mark.parametrize("variant", [v for v in build.variants_for() if v != "neon"] or ["portable"])
def test_pieces_in_any_order_give_torch_topks_order(variant, tmp_path):
    if (why := cpu.why_not(variant)) is not None:
        pytest.skip(why)
    cxx = build.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path / "top_k_check"
    subprocess.run([cxx, "-O2", "-std=c++17", "-ffp-contract=off", *build.VARIANTS[variant].flags, f"-I{build.INCLUDE}",
                    str(HERE / "top_k_check.cpp"), "-o", str(exe)], check=True, capture_output=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
