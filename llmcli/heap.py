"""The process's memory: giving freed memory back to the system while a model loads, and reading
the kernel's figures (/proc) for the memory plan and `bench`.

Loading makes large temporaries (dequantized tensors, int32 copies for packing) one after another.
glibc's malloc keeps much of what is freed as fragmented free heap memory, more or less of it from
run to run, which showed as a peak resident size up to 190 MB higher for SmolLM2 in some runs.
`malloc_trim` hands it back; it costs about a millisecond. Elsewhere (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


def _libc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


_malloc_trim = _libc_trim()


def trim() -> None:
    """Return free heap memory to the system (glibc), so it does not add to the peak."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def proc_bytes(path: str, key: str) -> int | None:
    """A `key: N kB` line of a /proc file (MemAvailable in /proc/meminfo, VmHWM in /proc/self/status)
    in bytes; None where there is no such file or line (not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
