"""Compiling the kernels: one shared library per instruction-set variant, plain C++ with a C
interface (api.h) and no torch headers, by the system's compiler in a few seconds a variant.

Each variant compiles with explicit target flags, never -march=native, so one build serves every
CPU of its kind; cpu.py says which of them this CPU runs. Standard library only: build_hook.py
runs this at `pip install` (without torch), and library.py at run time when the installed
libraries are missing or were built from other sources.

    python -m llmcli.native.build [OUT_DIR]     # every variant for this machine, into OUT_DIR
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

FOLDER = Path(__file__).parent


class Variant(NamedTuple):
    """A build of the kernels for one kind of CPU: a row of VARIANTS."""

    machine: str | None  # the CPUs' architecture, as machine() names it; None: any
    flags: tuple[str, ...]  # the compiler's: the instructions it may emit, the macro src/isa.h maps to code
    needs: tuple[str, ...]  # the CPU flags (Linux's names) those need; the first sets it apart (a skip names it)


# The variants, best first: cpu.py runs the first one this CPU has the flags of, the portable one
# where none fits. A new one: a row here, a branch in src/isa.h, its headers under arch/ (README.md).
VARIANTS = {
    # AVX-512 VNNI: Zen 4/5, Ice Lake and later
    "avx512vnni": Variant("x86_64", ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mavx2",
                                     "-mfma", "-mf16c", "-DLLMCLI_AVX512VNNI"),
                          ("avx512_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c")),
    # AVX-VNNI (the VEX-encoded vpdpbusd): Alder Lake and later
    "avxvnni": Variant("x86_64", ("-mavx2", "-mavxvnni", "-mfma", "-mf16c", "-DLLMCLI_AVXVNNI"),
                       ("avx_vnni", "avx2", "fma", "f16c")),
    # AVX2 + FMA: Haswell and later, Zen 1-3
    "avx2": Variant("x86_64", ("-mavx2", "-mfma", "-mf16c", "-DLLMCLI_AVX2"), ("avx2", "fma", "f16c")),
    # NEON with dot products: Apple Silicon, Graviton 2+, Cortex-A76+
    "neon": Variant("aarch64", ("-march=armv8.2-a+dotprod", "-DLLMCLI_NEON"), ("asimddp",)),
    # plain C++, any CPU
    "portable": Variant(None, (), ()),
}

# -ffp-contract=off: no multiply-add fused behind the code's back, so that dequantized weights equal
# gguf-py's bit for bit; the kernels fuse where they mean to, with intrinsics
COMMON = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-ffp-contract=off", "-pthread"]
# The C++: generic code in src/, per instruction set in arch/ (x86/, arm/, portable/), as ggml-cpu lays it
# out; headers include one another by relative paths, so no include flags are needed
SOURCE_FOLDERS = ("src", "arch")
UNITS = tuple(f"src/{u}" for u in ("matmul.cpp", "attention.cpp", "step.cpp", "select.cpp", "variant.cpp",
                                    "quantize_weights.cpp"))
INCLUDE = FOLDER / "src"  # where a program built beside the library (tests/*.cpp) finds api.h and the rest


class BuildError(Exception):
    """No compiler, or the compiler refused the sources (the message ends with its last lines)."""


def machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(m, m)


def variants_for(arch: str | None = None) -> list[str]:
    """The variants that compile for a machine, best first (the portable one last)."""
    arch = arch or machine()
    return [name for name, v in VARIANTS.items() if v.machine in (None, arch)]


def sources() -> list[Path]:
    return sorted(p for d in SOURCE_FOLDERS for p in (FOLDER / d).rglob("*") if p.suffix in (".cpp", ".h"))


def source_hash(variant: str) -> str:
    """What a library must have been built from: the sources (their paths too: a moved file rebuilds)
    and the variant's flags."""
    h = hashlib.sha256()
    for p in sources():
        h.update(p.relative_to(FOLDER).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(" ".join(COMMON + list(VARIANTS[variant].flags)).encode())
    return h.hexdigest()[:16]


def library_name(variant: str) -> str:
    suffix = ".dylib" if sys.platform == "darwin" else ".dll" if os.name == "nt" else ".so"
    return f"libllmcli-{variant}{suffix}"


def compiler() -> str | None:
    """$CXX (a command, perhaps with arguments), or the first C++ compiler on PATH; None without one."""
    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        return cxx if shutil.which(cxx.split()[0]) else None
    return next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


def compile_variant(variant: str, out: Path, cxx: str | None = None) -> Path:
    """Builds one variant's library at `out` (written beside it, then renamed: readers never see half a file)."""
    cxx = cxx or compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found (install g++ or clang++, or set CXX)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    cmd = [*cxx.split(), *COMMON, *VARIANTS[variant].flags, f'-DLLMCLI_SOURCE_HASH="{source_hash(variant)}"',
           *(str(FOLDER / u) for u in UNITS), "-o", tmp]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-5:])
            raise BuildError(f"{Path(cxx.split()[0]).name} could not build the {variant} kernels: {tail}")
        os.chmod(tmp, 0o755)  # mkstemp's 0600 would keep other users of a shared install from loading it
        os.replace(tmp, out)
    except OSError as e:
        raise BuildError(f"{Path(cxx.split()[0]).name} could not build the {variant} kernels: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def compile_all(folder: Path, variants: list[str] | None = None) -> dict[str, Path | BuildError]:
    """Every variant for this machine into `folder`, as many at once as there are CPUs."""
    names = variants or variants_for()

    def one(name):
        try:
            return compile_variant(name, folder / library_name(name))
        except BuildError as e:
            return e

    with ThreadPoolExecutor(max_workers=max(1, min(len(names), os.cpu_count() or 1))) as pool:
        return dict(zip(names, pool.map(one, names)))


if __name__ == "__main__":
    import time

    start = time.perf_counter()
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else FOLDER / "lib"
    for name, result in compile_all(out).items():
        sys.stdout.write(f"{name}: {result}\n")
    sys.stdout.write(f"{time.perf_counter() - start:.1f} s\n")
