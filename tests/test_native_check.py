"""The NEON variant where the tests run on x86: native_check.cpp (mm per block type against float64
on the same int8 activations, the portable activation bytes, attention) cross-compiled for aarch64
and run under qemu-user, where `aarch64-linux-gnu-g++` and `qemu-aarch64` are installed (Debian:
apt-get install g++-aarch64-linux-gnu qemu-user). On an aarch64 machine it compiles and runs natively;
there the Python tests (test_native_variants.py) cover the library as well."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from llmcli.native import build

HERE = Path(__file__).parent


@pytest.mark.slow
def test_the_neon_variant_multiplies_as_float64_does(tmp_path):
    flags = build.VARIANTS["neon"].flags
    if build.machine() == "aarch64":
        cxx, run = build.compiler(), []
        if cxx is None:
            pytest.skip("no C++ compiler")
    else:
        cxx, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
        if cxx is None or qemu is None:
            pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64 to check neon on " + build.machine())
        run, flags = [qemu], [*flags, "-static"]
    exe = tmp_path / "check"
    units = [str(build.FOLDER / u) for u in build.UNITS]
    subprocess.run([cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-pthread", *flags, f"-I{build.INCLUDE}",
                    str(HERE / "native_check.cpp"), *units, "-o", str(exe)], check=True, capture_output=True)
    r = subprocess.run([*run, str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok neon", r.stdout + r.stderr
