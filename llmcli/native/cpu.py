"""Which kernel variants this CPU runs, from its flags (Linux: /proc/cpuinfo, which lists only what
the OS has enabled; macOS: sysctl) and the flags each variant needs (build.VARIANTS), and why not
where it does not."""

from __future__ import annotations

import fnmatch
import functools
import os
import subprocess
import sys

from .build import VARIANTS, machine

_MACOS_NAMES = {"avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni", "avx1.0": "avx"}  # sysctl's spelling -> Linux's


HIDE_FLAGS = "LLMCLI_HIDE_CPU_FLAGS"  # glob patterns, comma-separated: flags() leaves out those they match


@functools.cache
def flags() -> frozenset[str]:
    """This CPU's feature flags as Linux names them (the one probe: the kernel variant and the CPU's
    default dtype are chosen from it), less those LLMCLI_HIDE_CPU_FLAGS hides, e.g.
    LLMCLI_HIDE_CPU_FLAGS='avx512*,avx_vnni,*bf16,amx*' makes an AVX-512 machine choose as a Zen 3
    does (tests, benchmarks, a bug report's CPU). Hiding only removes: it never adds a feature."""
    hidden = [p.strip() for p in os.environ.get(HIDE_FLAGS, "").split(",") if p.strip()]
    return frozenset(f for f in _probe() if not any(fnmatch.fnmatchcase(f, p) for p in hidden))


def _probe() -> frozenset[str]:
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo") as f:
                line = next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
            return frozenset(line.partition(":")[2].split())
        except OSError:
            return frozenset()
    if sys.platform == "darwin":
        if machine() == "aarch64":  # every Apple Silicon CPU has the dot products; asked all the same
            return frozenset({"asimddp"} if _sysctl("hw.optional.arm.FEAT_DotProd") == "1" else ())
        words = f"{_sysctl('machdep.cpu.features')} {_sysctl('machdep.cpu.leaf7_features')}".lower().split()
        return frozenset(_MACOS_NAMES.get(w, w) for w in words)
    return frozenset()


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def why_not(variant: str) -> str | None:
    """None where this CPU runs `variant`; otherwise the reason, naming the missing flag."""
    if variant not in VARIANTS:
        return f"no kernel variant {variant!r} (there are {', '.join(VARIANTS)})"
    target = VARIANTS[variant].machine
    if target is not None and target != machine():
        return f"{variant} is for {target} CPUs; this one is {machine()}"
    missing = [f for f in VARIANTS[variant].needs if f not in flags()]
    return f"needs {missing[0]}" if missing else None


def runnable() -> list[str]:
    """The variants this CPU runs, best first (the portable one always, last)."""
    return [v for v in VARIANTS if why_not(v) is None]


def available_cpus() -> int:
    """Logical CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def physical_cores() -> int:
    """Physical cores available to this process (hyper-threads slow down GEMV-bound decoding)."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:  # macOS
        return max(1, (os.cpu_count() or 2) // 2 if os.uname().machine == "x86_64" else os.cpu_count() or 1)
    try:
        cores = set()
        with open("/proc/cpuinfo") as f:
            cpu, phys, core = None, None, None
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "processor":
                    cpu = int(value)
                elif key == "physical id":
                    phys = value
                elif key == "core id":
                    core = value
                elif not key and cpu is not None:
                    if cpu in allowed:
                        cores.add((phys, core))
                    cpu, phys, core = None, None, None
            if cpu is not None and cpu in allowed:
                cores.add((phys, core))
        if cores and (None, None) not in cores:
            return len(cores)
    except (OSError, ValueError):
        pass
    return len(allowed)
