"""The quantized KV cache: int8 (or int4) codes with scales, dequantized for attention.

Per layer, with B batch, KV heads, S = max_len slots, D = head_dim, G = GROUP tokens:

    keys    a scale (and for int4 a zero) per head, channel and group of G tokens: (B, KV, S/G, D).
            Keys have outlier channels; a scale that follows each channel keeps them from drowning the
            others (KIVI); it stays closer to the float cache than a scale per token (docs/memory.md).
    values  a scale (and zero) per head, token and group of CG channels: (B, KV, S, D/CG).
    codes   int8 (B, KV, S, D), or int4 two per byte (B, KV, S, D/2): channel d in the low nibble and
            channel d + D/2 in the high one, so unpacking is two whole-tensor ops.
    tail    the group still filling, in the compute dtype (B, KV, G, D): a group is quantized once, when
            its G tokens are all there, and never touched again.

update() dequantizes the valid part only (slots below `done`) into one buffer per K and V shared by
all layers (attention of one layer ends before the next layer's update), so the dequantized copy costs
1/n_layers of a float cache. The tokens written by this call go into that buffer exactly as computed.
"""

from __future__ import annotations

import torch

from .kinds import GROUP, channel_group  # noqa: F401 (GROUP: quantized.GROUP for callers)
from .static import CacheSlots

_EPS = 1e-8


def _pack4(codes: torch.Tensor) -> torch.Tensor:
    """(..., D) uint8 in 0..15 -> (..., D/2): low nibble channel d, high nibble d + D/2."""
    half = codes.shape[-1] // 2
    return codes[..., :half] | (codes[..., half:] << 4)


def quantize_keys(x: torch.Tensor, bits: int, dtype: torch.dtype):
    """x (B, KV, n*G, D) -> codes, scale (B, KV, n, D), zero (int4) or None; scale per channel and group."""
    B, H, T, D = x.shape
    g = x.float().view(B, H, T // GROUP, GROUP, D)
    return _quantize(g, 3, bits, dtype, (B, H, T, D))


def quantize_values(x: torch.Tensor, bits: int, dtype: torch.dtype):
    """x (B, KV, T, D) -> codes, scale (B, KV, T, D/CG), zero (int4) or None; scale per token and group."""
    B, H, T, D = x.shape
    cg = channel_group(D)
    g = x.float().view(B, H, T, D // cg, cg)
    return _quantize(g, 4, bits, dtype, (B, H, T, D))


def _quantize(g: torch.Tensor, dim: int, bits: int, dtype: torch.dtype, shape):
    if bits == 8:  # symmetric: w = q * s, q in -127..127
        scale = (g.abs().amax(dim) / 127).clamp_min(_EPS).to(dtype)
        q = torch.round(g / scale.float().unsqueeze(dim)).clamp_(-127, 127)
        return q.to(torch.int8).view(shape), scale, None
    lo, hi = g.amin(dim), g.amax(dim)  # int4 with a zero point: w = q * s + lo, q in 0..15
    scale = ((hi - lo) / 15).clamp_min(_EPS).to(dtype)
    zero = lo.to(dtype)
    q = torch.round((g - zero.float().unsqueeze(dim)) / scale.float().unsqueeze(dim)).clamp_(0, 15)
    return _pack4(q.to(torch.uint8).view(shape)), scale, zero


def _unpack_into(out: torch.Tensor, codes: torch.Tensor, bits: int) -> None:
    """Codes (B, KV, n, D or D/2) -> out (B, KV, n, D) in out's dtype (unscaled)."""
    if bits == 8:
        out.copy_(codes)
        return
    half = out.shape[-1] // 2
    out[..., :half].copy_(codes & 15)
    out[..., half:].copy_(codes >> 4)


def dequantize_keys_into(out, codes, scale, zero, bits: int) -> None:
    """out (B, KV, n*G, D) <- keys of n whole groups."""
    B, H, T, D = out.shape
    _unpack_into(out, codes, bits)
    g = out.view(B, H, T // GROUP, GROUP, D)
    g.mul_(scale.unsqueeze(3))
    if zero is not None:
        g.add_(zero.unsqueeze(3))


def dequantize_values_into(out, codes, scale, zero, bits: int) -> None:
    """out (B, KV, T, D) <- values of T tokens."""
    B, H, T, D = out.shape
    cg = channel_group(D)
    _unpack_into(out, codes, bits)
    g = out.view(B, H, T, D // cg, cg)
    g.mul_(scale.unsqueeze(4))
    if zero is not None:
        g.add_(zero.unsqueeze(4))


class QuantizedKVCache(CacheSlots):
    """int8 or int4 codes for whole groups of GROUP tokens, the last group in the compute dtype."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int, device: torch.device,
                 dtype: torch.dtype, bits: int = 8, batch: int = 1):
        if bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {bits}")
        if bits == 4 and head_dim % 2:
            raise ValueError(f"int4 needs an even head_dim, got {head_dim}")
        B, H, D, S = batch, n_kv_heads, head_dim, max_len
        groups = S // GROUP  # slots past the last whole group stay in the tail
        cd = D // 2 if bits == 4 else D
        code_dtype = torch.uint8 if bits == 4 else torch.int8
        cg = channel_group(D)

        def empty(*shape, dt=dtype):
            return torch.empty(shape, device=device, dtype=dt)

        self.bits, self.dtype, self.max_len, self.length = bits, dtype, max_len, 0
        self.k_codes = [empty(B, H, groups * GROUP, cd, dt=code_dtype) for _ in range(n_layers)]
        self.v_codes = [empty(B, H, groups * GROUP, cd, dt=code_dtype) for _ in range(n_layers)]
        self.k_scale = [empty(B, H, groups, D) for _ in range(n_layers)]
        self.v_scale = [empty(B, H, groups * GROUP, D // cg) for _ in range(n_layers)]
        zeros = bits == 4
        self.k_zero = [empty(B, H, groups, D) if zeros else None for _ in range(n_layers)]
        self.v_zero = [empty(B, H, groups * GROUP, D // cg) if zeros else None for _ in range(n_layers)]
        self.k_tail = [empty(B, H, GROUP, D) for _ in range(n_layers)]
        self.v_tail = [empty(B, H, GROUP, D) for _ in range(n_layers)]
        self.done = [0] * n_layers  # slots [0, done) of each layer are quantized; [done, length) in the tail
        # what attention reads: one (B, KV, S, D) buffer each for K and V, shared by the layers
        self.k_out, self.v_out = empty(B, H, S, D), empty(B, H, S, D)

    @classmethod
    def for_model(cls, args, max_len: int, device: torch.device, dtype: torch.dtype, bits: int = 8, batch: int = 1):
        return cls(args.num_hidden_layers, args.num_key_value_heads, args.head_dim, max_len, device, dtype, bits, batch)

    def _restore_tail(self, layer: int, start: int) -> None:
        """After a truncate into quantized slots: the group holding `start` goes back to the tail."""
        g = start // GROUP * GROUP
        if start > g:
            self._dequantize(layer, g, g + GROUP)
            self.k_tail[layer][:, :, :start - g] = self.k_out[:, :, g:start]
            self.v_tail[layer][:, :, :start - g] = self.v_out[:, :, g:start]
        self.done[layer] = g

    def _store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Put k, v (B, KV, T, D) at slots [start, start+T): whole groups quantized, the rest in the tail."""
        if start < self.done[layer]:
            self._restore_tail(layer, start)
        done, end = self.done[layer], start + k.shape[2]
        kt, vt = self.k_tail[layer], self.v_tail[layer]
        n = min((end - done) // GROUP * GROUP, self.k_codes[layer].shape[2] - done)  # slots to quantize
        if n <= 0:  # the tail group is still filling
            kt[:, :, start - done:end - done] = k
            vt[:, :, start - done:end - done] = v
            return
        held = start - done
        k_all = torch.cat((kt[:, :, :held], k), 2) if held else k  # (B, KV, end - done, D)
        v_all = torch.cat((vt[:, :, :held], v), 2) if held else v
        g0, g1 = done // GROUP, (done + n) // GROUP
        codes, scale, zero = quantize_keys(k_all[:, :, :n], self.bits, self.dtype)
        self.k_codes[layer][:, :, done:done + n] = codes
        self.k_scale[layer][:, :, g0:g1] = scale
        if zero is not None:
            self.k_zero[layer][:, :, g0:g1] = zero
        codes, scale, zero = quantize_values(v_all[:, :, :n], self.bits, self.dtype)
        self.v_codes[layer][:, :, done:done + n] = codes
        self.v_scale[layer][:, :, done:done + n] = scale
        if zero is not None:
            self.v_zero[layer][:, :, done:done + n] = zero
        kt[:, :, :end - done - n] = k_all[:, :, n:]
        vt[:, :, :end - done - n] = v_all[:, :, n:]
        self.done[layer] = done + n

    def _dequantize(self, layer: int, a: int, b: int) -> None:
        """k_out, v_out slots [a, b) <- the quantized slots (a, b multiples of GROUP)."""
        if b <= a:
            return
        ga, gb = a // GROUP, b // GROUP
        kz, vz = self.k_zero[layer], self.v_zero[layer]
        dequantize_keys_into(self.k_out[:, :, a:b], self.k_codes[layer][:, :, a:b], self.k_scale[layer][:, :, ga:gb],
                             None if kz is None else kz[:, :, ga:gb], self.bits)
        dequantize_values_into(self.v_out[:, :, a:b], self.v_codes[layer][:, :, a:b], self.v_scale[layer][:, :, a:b],
                               None if vz is None else vz[:, :, a:b], self.bits)

    def update(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        end = start + k.shape[2]
        self._store(layer, start, k, v)
        done = self.done[layer]
        self._dequantize(layer, 0, done)
        if start > done:  # the part of the tail group written before this call
            self.k_out[:, :, done:start] = self.k_tail[layer][:, :, :start - done]
            self.v_out[:, :, done:start] = self.v_tail[layer][:, :, :start - done]
        self.k_out[:, :, start:end] = k  # the new tokens as computed
        self.v_out[:, :, start:end] = v
        return self.k_out[:, :, :end], self.v_out[:, :, :end]

    def _full_precision(self, layer: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots [0, n) of one layer in the compute dtype (views of the shared buffers)."""
        done = self.done[layer]
        self._dequantize(layer, 0, min(done, -(-n // GROUP) * GROUP))
        if n > done:
            self.k_out[:, :, done:n] = self.k_tail[layer][:, :, :n - done]
            self.v_out[:, :, done:n] = self.v_tail[layer][:, :, :n - done]
        return self.k_out[:, :, :n], self.v_out[:, :, :n]

    def shift(self, keep: int, drop: int, rerotate) -> None:
        """Drop slots [keep, keep+drop) and move the rest down; `rerotate(k, drop)` re-positions moved keys.
        The moved groups are quantized again from their dequantized values (group boundaries move)."""
        n = self.length
        for layer in range(len(self.k_codes)):
            k, v = self._full_precision(layer, n)
            k = torch.cat((k[:, :, :keep], rerotate(k[:, :, keep + drop:n], drop)), 2)
            v = torch.cat((v[:, :, :keep], v[:, :, keep + drop:n]), 2)
            self.done[layer] = 0
            self._store(layer, 0, k, v)
        self.length = n - drop

    # truncate() (CacheSlots) only moves `length`: update() restores a cut group into the tail

    @property
    def nbytes(self) -> int:
        tensors = (self.k_codes + self.v_codes + self.k_scale + self.v_scale + self.k_tail + self.v_tail
                   + [t for t in self.k_zero + self.v_zero if t is not None] + [self.k_out, self.v_out])
        return sum(t.numel() * t.element_size() for t in tensors)
