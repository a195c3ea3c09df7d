"""The CPU kinds the suite chooses for on any machine (kernel variant, default dtype, decode step):
named feature sets in Linux's flag names. conftest.py's `cpu_kind` fixture makes llmcli's one probe
(llmcli.native.cpu) see a kind in-process; `hide_env` makes an `llmcli` subprocess see one, where
this CPU has all its features (hiding only removes).

A kind's variant that this CPU cannot run is chosen all the same: it stands in as `Unrunnable`, and
a test that calls its kernels skips, naming what this CPU lacks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

X86 = frozenset({"fpu", "sse", "sse2", "ssse3", "sse4_1", "sse4_2", "popcnt", "avx"})
AVX2 = frozenset({"avx2", "fma", "f16c", "bmi2"})
AVX512 = frozenset({"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                    "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq"})


@dataclass(frozen=True)
class CpuKind:
    name: str
    machine: str  # as llmcli.native.build.machine() names it
    flags: frozenset[str]


KINDS = {kind.name: kind for kind in (
    CpuKind("zen3", "x86_64", X86 | AVX2),  # AMD Zen 1-3, Intel Haswell..Comet Lake: AVX2 + FMA + F16C only
    CpuKind("zen4", "x86_64", X86 | AVX2 | AVX512),  # AVX-512 VNNI and BF16, no AVX-VNNI
    CpuKind("intel", "x86_64", X86 | AVX2 | AVX512 | {"avx_vnni", "avx512_fp16"}),  # Sapphire Rapids
    CpuKind("alderlake", "x86_64", X86 | AVX2 | {"avx_vnni"}),  # Intel's client cores since 2021: no AVX-512
    CpuKind("arm", "aarch64", frozenset({"fp", "asimd", "asimdhp", "asimddp", "bf16", "i8mm"})),  # Graviton 3
    CpuKind("old", "x86_64", X86),  # Sandy Bridge: AVX without AVX2
)}


class Unrunnable:
    """The kernels a kind chooses where this CPU cannot run them: `variant` as chosen; anything else
    skips the test."""

    def __init__(self, variant: str, why: str):
        self.variant, self.why = variant, why

    def __getattr__(self, name):
        pytest.skip(f"the {self.variant} kernels cannot run on this CPU: {self.why}")


def hide_env(kind: CpuKind) -> dict[str, str]:
    """The environment under which an `llmcli` subprocess sees `kind`: every flag of this CPU that the
    kind lacks, hidden. Skips where this CPU lacks some of the kind's (or is another machine)."""
    from llmcli.native import cpu

    real = cpu._probe()
    if cpu.machine() != kind.machine or not kind.flags <= real:
        pytest.skip(f"this CPU ({cpu.machine()}) cannot pass for a {kind.name}: hiding flags only removes")
    return {cpu.HIDE_FLAGS: ",".join(sorted(real - kind.flags))}
