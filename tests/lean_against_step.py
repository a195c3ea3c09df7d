"""The torch-free LeanModel (runtime/lean_step.py) against the torch path's NativeStep on the same
GGUF file, bit for bit: one check for every family's test (test_lean.py, test_olmoe_step.py).

    step, cache = NativeStep(rt.loaded.model, threads=2), rt.new_cache()
    lean = LeanModel.open(open_model_file(path), 2, native.module())
    assert_lean_is_the_native_step(lean, step, cache, PROMPT, STEPS)
"""

from __future__ import annotations

import numpy as np
import torch


def assert_lean_is_the_native_step(lean, step, cache, prompt: list[int], steps: list[int], top: int = 0) -> None:
    """The prompt's last logits, then each of `steps` as one token, the same to the bit from both, and
    the keys and values both wrote. `cache`: the step's fresh torch cache (a new lean cache of its
    length beside it); `top` > 0: the lean call's `top` largest checked against its logits too."""
    mine = lean.new_cache(cache.max_len)
    with torch.inference_mode():
        want = step(torch.tensor([prompt]), cache, last_only=True)[0, -1].numpy()
        got, _, _ = lean(prompt, mine)
        np.testing.assert_array_equal(got[0], want)
        for tok in steps:
            want = step(torch.tensor([[tok]]), cache, last_only=True)[0, -1].numpy()
            got, _, found = lean([tok], mine, top=top)
            np.testing.assert_array_equal(got[0], want)
            if top:  # (ties may order either way)
                assert found[1][0].tolist() == np.argsort(-got[0], kind="stable")[:top].tolist() or \
                    np.array_equal(np.sort(got[0])[::-1][:top], found[0][0])
    n = len(prompt) + len(steps)
    assert mine.length == cache.length == n
    for a, b in zip(mine.k + mine.v, cache.k + cache.v):
        np.testing.assert_array_equal(a[:, :, :n], b[:, :, :n].numpy())
