"""What machine a benchmark's figures come from: every figure names its CPU."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """/proc/cpuinfo's model name (Linux), else the platform's word for it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
