"""Copies between KV rows run on the calling thread alone (llmcli/cache/one_thread.py), and torch's
thread count is what it was after them, also after an error."""

from __future__ import annotations

import pytest
import torch

from llmcli.cache.one_thread import one_thread
from llmcli.cache.prompt_cache import PromptCache
from llmcli.cache.static import StaticKVCache


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_one_thread_inside_and_the_count_as_it_was_after(two_threads):
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError), one_thread():
        raise ValueError
    assert torch.get_num_threads() == 2


def test_row_copies_run_on_one_thread_and_leave_the_count(two_threads, monkeypatch):
    cache = StaticKVCache(2, 3, 8, 16, torch.device("cpu"), torch.float32, batch=2)
    for t in cache.k_layers, cache.v_layers:
        t.copy_(torch.randn_like(t))
    seen = []

    def counted(name):  # each row copy's op notes the thread count it runs with
        real = getattr(torch.Tensor, name)

        def op(self, *args):
            seen.append((name, torch.get_num_threads()))
            return real(self, *args)
        return op

    for name in ("__setitem__", "clone"):
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    cache.move_row(1, 0, 5)
    kept = PromptCache(1 << 20)
    kept.store(list(range(5)), cache, 0)
    assert kept.restore(list(range(5)), cache, 1) == 5
    monkeypatch.undo()
    assert {name for name, _ in seen} == {"__setitem__", "clone"} and {n for _, n in seen} == {1}
    assert torch.get_num_threads() == 2
    assert torch.equal(cache.k_layers[:, 0, :, :5], cache.k_layers[:, 1, :, :5])


def test_overlapping_scopes_of_two_threads_leave_the_count_as_it_was(two_threads):
    """Thread A opens, B opens (seeing one thread), A closes (B still inside: still one), B closes."""
    import threading

    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with one_thread():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with one_thread():
            b_in.set()
            a_out.wait(5)
            seen["b after a left"] = torch.get_num_threads()

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"b after a left": 1}
    assert torch.get_num_threads() == 2
