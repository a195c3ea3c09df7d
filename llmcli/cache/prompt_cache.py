"""The KV of prompts earlier requests ran, kept for later requests that start the same way: the same
system prompt, or the growing history of one conversation (llama-server's cache_prompt, ollama).

Entries are whole token sequences (a finished request's prompt and reply) with their keys and
values copied out of the row they were computed in; a new request takes the entry that shares the
longest prefix with its prompt, has those slots copied into its own row, and prefills only the
rest. Bounded: at most `max_bytes` of tensors, the least recently used entries leave first. An
entry whose tokens start another's is dropped when the longer one is stored: the longer one serves
every prompt the shorter did.

    cache = PromptCache(256 << 20)
    n = cache.restore(prompt, kv, row)     # copy the longest held prefix of `prompt` into row `row`; its length
    cache.store(ids, kv, row)              # keep row `row`'s first len(ids) slots (they hold `ids`)

`kv` is batched.py's rows: a StaticKVCache (torch tensors) or a HostKVCache (numpy arrays); entries
are in its storage dtype, on its device, every layer's slots in one array (its k_layers'), copied in
and out in one op each.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Entry:
    ids: np.ndarray  # (n,) int64: the tokens whose keys and values are held
    k: object  # (layers, KV, n, D): a torch tensor or a numpy array, as the rows' cache holds them
    v: object
    nbytes: int = field(init=False)

    def __post_init__(self):
        self.nbytes = self.k.nbytes + self.v.nbytes


class PromptCache:
    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self.nbytes = self.tokens = 0  # held now
        self.hits = self.misses = self.reused_tokens = self.evicted = 0
        self._next = 0

    def longest_prefix(self, prompt: list[int]) -> tuple[int, int | None]:
        """(n, key): the entry sharing the longest prefix with `prompt`, and that prefix's length."""
        p = np.asarray(prompt, dtype=np.int64)
        best, found = 0, None
        for key, entry in self.entries.items():
            n = _common_prefix(entry.ids, p)
            if n > best:
                best, found = n, key
        return best, found

    def restore(self, prompt: list[int], kv, row: int, limit: int | None = None) -> int:
        """Copy the longest prefix of `prompt` held here (at most `limit` tokens) into slots
        [0, n) of row `row` of `kv`; returns n (0: nothing held)."""
        n, key = self.longest_prefix(prompt)
        n = min(n, limit if limit is not None else n)
        if n <= 0 or key is None:
            self.misses += 1
            return 0
        self.entries.move_to_end(key)  # the most recently used
        entry = self.entries[key]
        with _copying(kv):
            for t, held in ((kv.k_layers, entry.k), (kv.v_layers, entry.v)):
                t[:, row, :, :n] = held[:, :, :n]
        self.hits += 1
        self.reused_tokens += n
        return n

    def store(self, ids: list[int], kv, row: int) -> None:
        """Keep the first len(ids) slots of row `row` of `kv`, which hold `ids`."""
        n = len(ids)
        a = np.asarray(ids, dtype=np.int64)
        per_token = sum(t[:, row, :, :1].nbytes for t in (kv.k_layers, kv.v_layers))
        if n == 0 or n * per_token > self.max_bytes:
            return
        for key, entry in list(self.entries.items()):
            shared = _common_prefix(entry.ids, a)
            if shared == n:  # already held, as this or as the start of a longer entry
                self.entries.move_to_end(key)
                return
            if shared == len(entry.ids):  # this one starts the new one: the new one serves its prompts
                self._drop(key)
        with _copying(kv):
            entry = Entry(a, _copy(kv.k_layers[:, row, :, :n]), _copy(kv.v_layers[:, row, :, :n]))
        self.entries[self._next] = entry
        self._next += 1
        self.nbytes += entry.nbytes
        self.tokens += n
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self.entries)))
            self.evicted += 1

    def _drop(self, key: int) -> None:
        entry = self.entries.pop(key)
        self.nbytes -= entry.nbytes
        self.tokens -= len(entry.ids)

    @property
    def stats(self) -> dict:
        """Counters only (another thread may read them while the engine stores)."""
        return {"entries": len(self.entries), "tokens": self.tokens,
                "bytes": self.nbytes, "max_bytes": self.max_bytes, "hits": self.hits, "misses": self.misses,
                "reused_tokens": self.reused_tokens, "evicted": self.evicted}


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def _copying(kv):
    """torch's copies on the calling thread alone (one_thread.py); numpy's are that already."""
    if isinstance(kv.k_layers, np.ndarray):
        return contextlib.nullcontext()
    from .one_thread import one_thread

    return one_thread()


def _copy(t):
    return t.copy() if isinstance(t, np.ndarray) else t.clone()
