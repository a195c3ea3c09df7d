"""batched.py's rows on the torch-free CPU path: a LeanModel's (runtime/lean_step.py) host KV cache
of `rows` rows, each sequence's PlainPicker, and every step as one C++ call over the running rows'
tokens and any new prompts beside them (LeanModel.pieces): rows_torch.py's job, on numpy."""

from __future__ import annotations

import contextlib

from .picker_plain import PlainPicker


class LeanRows:
    finds_top = True  # the step finds each row's largest logits (top=k)
    joins = True  # a new prompt can go into a decode step's call

    def __init__(self, model, rows: int, max_len: int):
        self.model = self.step_fn = model
        self.cache = model.new_cache(max_len, rows)  # zero pages: every slot finite from the start

    def mode(self):
        return contextlib.nullcontext()

    def picker(self, seq) -> PlainPicker:
        return PlainPicker(seq.request.sampling, seq.prompt, rescore=self.model.rescore, constraint=seq.constraint,
                           logprobs=seq.logprobs)

    def prefill(self, ids: list[int], row: int, start: int, hidden: bool):
        """`ids` into `row` from slot `start` -> (logits (V,), final hidden state (H,)) of the last."""
        logits, h, _ = self.model.prefill_row(ids, self.cache, row, start)
        return logits[0], h[0]

    def decode(self, pieces: list[tuple[int, int, list[int]]], joined: bool, top: int):
        """rows_torch.TorchRows.decode's outputs, from one LeanModel.pieces call."""
        logits, h, found = self.model.pieces(pieces, self.cache, top)
        return list(logits), list(h), None if found is None else (found[0].tolist(), found[1].tolist())

    def clean_up_to(self, n: int, lengths: list[int]) -> None:
        """Nothing to do: the slots past a row's end hold zeros or what an earlier sequence wrote."""
