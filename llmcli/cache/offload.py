"""The offloaded KV cache: the first N layers on the device, the others in host memory.

A host layer is brought to the device one layer ahead of its use: update() of layer i starts the copy
of layer i+1 into one of two device slots, so it runs while layer i computes. The tokens written by
update() go into the slot and, from there, back to the host rows. What moves the bytes is a Transfer:

    CudaTransfer   pinned host memory; copies on a side stream, ordered by stream waits and events
    Transfer       CPU and MPS: plain copies. On CPU host and "device" are both CPU memory, so the
                   offload path runs (and is tested) there exactly as on a GPU. MPS has one queue:
                   copies are queued without blocking Python and run in order with compute.

Per step the whole valid part of every host layer crosses the bus, so offloading trades speed for
memory: the planner uses it only when the cache fits neither as is nor quantized.
"""

from __future__ import annotations

import torch

from .static import CacheSlots, shift_layers


def _copy_rows(dst: torch.Tensor, src: torch.Tensor, start: int, end: int, non_blocking: bool) -> None:
    """dst[b, h, start:end] <- src[b, h, start:end] for (B, KV, S, D) tensors, one contiguous block per
    (b, h): a strided slice would make torch stage it through pageable memory (and block)."""
    if end <= start:
        return
    for b in range(dst.shape[0]):
        for h in range(dst.shape[1]):
            dst[b, h, start:end].copy_(src[b, h, start:end], non_blocking=non_blocking)


class Transfer:
    """Host <-> device copies for CPU (host and device the same memory) and MPS (one queue)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.non_blocking = device.type == "mps"  # host rows are only rewritten after synchronize()

    def host_empty(self, shape, dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def fetch(self, slot: int, dst: torch.Tensor, src: torch.Tensor, n: int) -> None:
        """Start copying host rows [0, n) into device slot `slot`."""
        _copy_rows(dst, src, 0, n, self.non_blocking)

    def ready(self, slot: int) -> None:
        """Make the compute that follows wait for the slot's copy."""

    def store(self, dst: torch.Tensor, src: torch.Tensor, start: int, end: int) -> None:
        """Device rows [start, end) back to the host (after the compute queued so far)."""
        _copy_rows(dst, src, start, end, False)

    def synchronize(self) -> None:
        """Every queued copy done: the host rows may be changed by the CPU."""
        if self.device.type == "mps":
            torch.mps.synchronize()


class CudaTransfer(Transfer):
    """Pinned host memory, copies on a side stream.

    fetch: the side stream first waits for the work queued on the compute stream so far (the last
    attention that read the slot, and the stores of the host rows), then copies without blocking and
    records an event; ready: the compute stream waits for that event."""

    def __init__(self, device: torch.device, slots: int):
        super().__init__(device)
        self.stream = torch.cuda.Stream(device=device)
        self.fetched = [torch.cuda.Event() for _ in range(slots)]

    def host_empty(self, shape, dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def adopt_slot(self, t: torch.Tensor) -> None:
        # the side stream writes into the slot: its memory must not be reused before that work ends
        t.record_stream(self.stream)

    def fetch(self, slot, dst, src, n):
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            _copy_rows(dst, src, 0, n, True)
            self.fetched[slot].record(self.stream)

    def ready(self, slot):
        torch.cuda.current_stream(self.device).wait_event(self.fetched[slot])

    def store(self, dst, src, start, end):
        _copy_rows(dst, src, start, end, True)  # on the compute stream: after the rows were written

    def synchronize(self):
        torch.cuda.synchronize(self.device)


def transfer_for(device: torch.device, slots: int) -> Transfer:
    return CudaTransfer(device, slots) if device.type == "cuda" else Transfer(device)


class OffloadedKVCache(CacheSlots):
    """Layers [0, device_layers) on the device like StaticKVCache; the rest on the host, each brought
    into one of two device slots one layer ahead of use."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int, device: torch.device,
                 dtype: torch.dtype, device_layers: int, batch: int = 1, compute_dtype: torch.dtype | None = None):
        if not 0 <= device_layers < n_layers:
            raise ValueError(f"device_layers must be in [0, {n_layers}), got {device_layers}")
        shape = (batch, n_kv_heads, max_len, head_dim)
        host_layers = n_layers - device_layers
        self.n_layers, self.first_host = n_layers, device_layers
        self.transfer = transfer_for(device, min(2, host_layers))
        self.k, self.v = [], []
        for i in range(n_layers):
            for store in (self.k, self.v):
                store.append(torch.empty(shape, device=device, dtype=dtype) if i < device_layers
                             else self.transfer.host_empty(shape, dtype))
        self.slots = [(torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype))
                      for _ in range(min(2, host_layers))]
        for pair in self.slots:
            for t in pair:
                getattr(self.transfer, "adopt_slot", lambda t: None)(t)
        self.pending: dict[int, int] = {}  # host layer -> rows fetched (or being fetched) into its slot
        self.compute_dtype = compute_dtype or dtype
        self.max_len, self.length = max_len, 0

    @classmethod
    def for_model(cls, args, max_len: int, device: torch.device, dtype: torch.dtype, device_layers: int,
                  batch: int = 1, compute_dtype: torch.dtype | None = None):
        return cls(args.num_hidden_layers, args.num_key_value_heads, args.head_dim, max_len, device, dtype,
                   device_layers, batch, compute_dtype)

    def _slot(self, layer: int) -> int:
        return (layer - self.first_host) % len(self.slots)

    def _fetch(self, layer: int, n: int) -> None:
        """Start bringing host rows [0, n) of `layer` into its slot (unless already under way)."""
        if self.pending.get(layer, -1) >= n:
            return
        slot = self._slot(layer)
        for other in [o for o in self.pending if o != layer and self._slot(o) == slot]:
            del self.pending[other]  # that copy's rows are about to be overwritten
        ks, vs = self.slots[slot]
        self.transfer.fetch(slot, ks, self.k[layer], n)
        self.transfer.fetch(slot, vs, self.v[layer], n)
        self.pending[layer] = n

    def update(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        end = start + k.shape[2]
        if layer < self.first_host:
            self.k[layer][:, :, start:end] = k
            self.v[layer][:, :, start:end] = v
            if layer + 1 == self.first_host:
                self._fetch(layer + 1, start)
            return self._out(self.k[layer][:, :, :end], self.v[layer][:, :, :end])
        self._fetch(layer, start)  # no-op when the layer before started it
        slot = self._slot(layer)
        self.transfer.ready(slot)
        del self.pending[layer]
        ks, vs = self.slots[slot]
        ks[:, :, start:end] = k
        vs[:, :, start:end] = v
        self.transfer.store(self.k[layer], ks, start, end)
        self.transfer.store(self.v[layer], vs, start, end)
        if layer + 1 < self.n_layers:
            self._fetch(layer + 1, start)
        elif len(self.slots) == 2 and self._slot(layer) == 1:  # the next step's first host layer: slot 0 is free
            self._fetch(self.first_host, end)
        return self._out(ks[:, :, :end], vs[:, :, :end])

    def _out(self, k: torch.Tensor, v: torch.Tensor):
        if k.dtype == self.compute_dtype:
            return k, v
        return k.to(self.compute_dtype), v.to(self.compute_dtype)

    def shift(self, keep: int, drop: int, rerotate) -> None:
        self.transfer.synchronize()
        self.pending.clear()
        shift_layers(self.k, self.v, keep, drop, self.length, rerotate)
        self.length -= drop

    @property
    def device_nbytes(self) -> int:
        tensors = self.k[:self.first_host] + self.v[:self.first_host] + [t for pair in self.slots for t in pair]
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def host_nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k[self.first_host:] + self.v[self.first_host:])

    @property
    def nbytes(self) -> int:
        return self.device_nbytes + self.host_nbytes
