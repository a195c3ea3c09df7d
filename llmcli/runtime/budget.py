"""How much memory a model may take: what is free on the device (and on the host, for an offloaded
cache), or LLMCLI_MEMORY_LIMIT. No torch until a GPU is asked about."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .. import heap
from ..errors import InvalidParameterError

MEMORY_LIMIT_ENV = "LLMCLI_MEMORY_LIMIT"
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_size(text: str, what: str = MEMORY_LIMIT_ENV) -> int:
    """"24G", "500M", "1.5GiB", "1000000" -> bytes (K/M/G are powers of 1000, KiB/MiB/GiB of 1024)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise InvalidParameterError(f"{what} must be a size such as 24G, 500M or 1.5GiB, got {text!r}")
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class Budget:
    device: str  # "cuda" | "mps" | "cpu"
    free: int  # bytes the model may take on the device
    host_free: int | None = None  # host memory for an offloaded cache; None: the device's own memory (CPU)
    source: str = ""  # where the figures come from, for the table


def host_available() -> int:
    """Memory available to a new allocation without swapping: MemAvailable on Linux."""
    available = heap.proc_bytes("/proc/meminfo", "MemAvailable")
    if available is not None:
        return available
    try:  # macOS and others
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def cuda_free(device) -> tuple[int, str]:
    """Bytes this process may still take on a CUDA device, and where the figure comes from: what the
    driver reports free, but no more than torch's caching allocator may still reserve under
    torch.cuda.set_per_process_memory_fraction (mem_get_info does not see that cap: the allocator
    refuses past fraction x total of its own reserved memory)."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # (not in older torch: no cap seen)
    fraction = get_fraction(device) if get_fraction is not None else 1.0
    if fraction < 1.0:
        capped = max(0, int(fraction * total) - torch.cuda.memory_reserved(device))
        if capped < free:
            return capped, f"set_per_process_memory_fraction({fraction:g}) of {total / 2**30:.2f} GiB"
    return int(free), "torch.cuda.mem_get_info"


def detect_budget(device) -> Budget:
    """What the model may take on `device` (a torch.device, or "cpu" on the torch-free path)."""
    kind = getattr(device, "type", device)
    if kind == "cuda":
        free, source = cuda_free(device)
        budget = Budget("cuda", free, host_available(), source)
    elif kind == "mps":
        import torch

        # unified memory, but Metal caps what one process should keep resident on the GPU
        free = torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory()
        budget = Budget("mps", int(free), host_available(), "Metal recommended working set")
    else:
        budget = Budget("cpu", host_available(), None, "MemAvailable")
    limit = os.environ.get(MEMORY_LIMIT_ENV)
    if limit:
        budget = Budget(budget.device, parse_size(limit), budget.host_free, MEMORY_LIMIT_ENV)
    return budget
