"""What every cache kind shares (static.py lists the interface), without torch."""

from __future__ import annotations


class CacheSlots:
    """What every cache kind shares: the first `length` of its `max_len` slots hold tokens."""

    length: int

    def reset(self) -> None:
        self.length = 0

    def truncate(self, n: int) -> None:
        self.length = min(self.length, max(0, n))
