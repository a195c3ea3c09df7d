"""batched.py's rows on a torch model: the cache (a StaticKVCache of `rows` rows), each sequence's
Picker, a prompt's prefill through a batch-1 view of its row, and a decode step over every running
row, through the native step where it runs (NativeStep: one C++ call, `pieces` for new prompts
beside the running rows) or through the model (rows_lean.py: the same without torch)."""

from __future__ import annotations

import torch

from ..cache import new_cache
from .picker import Picker
from .prefill import prefill, prefill_runner


class TorchRows:
    def __init__(self, model, device: torch.device, dtype: torch.dtype, rows: int, max_len: int,
                 kv_type: str | None = None, step=None):
        if kv_type not in (None, "bf16", "f16"):
            raise ValueError("a batch of rows needs a float KV cache: kv_type None, bf16 or f16")
        self.model, self.device = model, device
        self.step_fn = step or model
        self.finds_top = hasattr(step, "last_top")  # the step finds each row's largest logits (top=k)
        self.prefill_fn = prefill_runner(model, step)
        self.cache = new_cache(model.args, max_len, device, dtype, kv_type, batch=rows)
        self.max_len = max_len
        self.clean = 0  # slots [0, clean) of every row hold finite numbers (see clean_up_to)

    @property
    def joins(self) -> bool:
        """Whether a new prompt can go into a decode step's call (the native step's pieces)."""
        return getattr(self.step_fn, "pieces", None) is not None and self.step_fn.fits(self.cache)

    def mode(self):
        return torch.inference_mode()

    def picker(self, seq) -> Picker:
        return Picker(seq.request.sampling, seq.prompt, self.device, head=getattr(self.model, "lm_head", None),
                      constraint=seq.constraint, logprobs=seq.logprobs)

    def prefill(self, ids: list[int], row: int, start: int, hidden: bool):
        """`ids` into `row` from slot `start` -> (logits (V,), final hidden state (H,) or None) of the last."""
        view = self.cache.row(row)
        view.length = start
        out = prefill(self.prefill_fn, ids, view, self.device, hidden=hidden)
        return out if hidden else (out, None)

    def decode(self, pieces: list[tuple[int, int, list[int]]], joined: bool, top: int):
        """One step: pieces (row, slot, token ids), one a running row (its last token, or a prompt
        that `joined` the step) -> (each row's logits (V,), each row's hidden state (H,), the rows'
        (values, indices) lists of their `top` largest logits or None)."""
        if joined:
            out = self.step_fn.pieces(pieces, self.cache, top=top)
            if out is None:  # (joins checked what pieces takes)
                raise RuntimeError("the native step refused a batch step")
            logits, h = out[0].unsqueeze(1), out[1].unsqueeze(1)
        else:
            slots = torch.tensor([at for _, at, _ in pieces], dtype=torch.long, device=self.device)
            tokens = torch.tensor([ids for _, _, ids in pieces], dtype=torch.long, device=self.device)
            logits, h = self.step_fn(tokens, self.cache, slots=slots, last_only=True, hidden=True,
                                     **({"top": top} if top else {}))
        found = self.step_fn.last_top if top else None
        found = None if found is None else (found[0].tolist(), found[1].tolist())  # one conversion for all rows
        # each row's (V,) and (H,) in one op each: 2 indexing ops a row, each slow right after a step
        return logits[:, -1].unbind(0), h[:, -1].unbind(0), found

    def clean_up_to(self, n: int, lengths: list[int]) -> None:
        """Make slots [0, n) of every row finite (the running rows are `lengths` long). A step reads
        each row up to the longest row's end; the mask gives the slots past a row's own end zero
        weight, but 0 x NaN is NaN, and the cache comes from torch.empty (its pages are touched only
        as contexts fill). Slots below `clean` are finite in every row (zeroed, or written by some
        sequence); live slots are never zeroed. Done 64 slots ahead at a time, so that it costs a
        step now and then, not every step."""
        if n <= self.clean:
            return
        end = min(self.max_len, n + 64)
        live = len(lengths)
        for t in self.cache.k + self.cache.v:
            for b, length in enumerate(lengths):
                if max(self.clean, length) < end:
                    t[b, :, max(self.clean, length):end] = 0
            t[live:, :, self.clean:end] = 0
        self.clean = end
