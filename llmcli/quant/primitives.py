"""Pure group-wise quantization: weights (N, K) -> integer codes + one scale (and zero) per group.

Groups run along K (a row's input features), G values each; "per row" is G = K. The formulas are
the ones torch's weight-only kernels compute, so a packed weight needs no conversion at run time:

    int4, asymmetric   w = (q - 8) * scale + zero     q in 0..15
    int4, symmetric    w = (q - 8) * scale            q in 0..15 (scale may be negative, as Q4_0)
    int8, symmetric    w = q * scale                  q in -127..127

Scales and zeros are stored in bfloat16 (what the kernels read). Codes are chosen for the rounded
scales, so they are the nearest levels of what is stored. The scale search picks each group's
scale (and zero) to minimise the squared reconstruction error, like llama.cpp's make_qx_quants and
make_qkx2_quants, instead of taking them from the group's min and max alone; by default the error
is weighted towards large values as llama.cpp's K-quants do (measured: benchmarks/quality/presets_vs_unquantized.py).

Packing: int4 codes two per byte along K, the even column in the low nibble.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

SCALE_DTYPE = torch.bfloat16
TASK_VALUES = 1 << 16  # values a task quantizes: its float32 temporaries (a dozen) stay in the cache
SEARCH_MODES = ("weighted", "plain", "minmax")
DEFAULT_SEARCH = "weighted"
_POOL_LOCK = threading.Lock()


@dataclass
class Quantized:
    """Codes (N, K) and per-group scales/zeros (N, K/G); zeros is None when symmetric."""

    codes: torch.Tensor  # int4: uint8 in 0..15; int8: int8 in -127..127
    scales: torch.Tensor  # bfloat16
    zeros: torch.Tensor | None
    bits: int
    group_size: int

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self.codes, self.scales, self.zeros, self.bits, self.group_size, dtype)


def _groups(w: torch.Tensor, group_size: int) -> torch.Tensor:
    N, K = w.shape
    if group_size <= 0 or K % group_size:
        raise ValueError(f"group size {group_size} does not divide the row length {K}")
    return w.reshape(N * (K // group_size), group_size)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int,
               group_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(N, K) weights in `dtype` from codes and per-group scales (and zeros)."""
    N, K = codes.shape
    q = codes.to(dtype).view(N, K // group_size, group_size)
    if bits == 4:
        q = q - 8
    w = q * scales.to(dtype).unsqueeze(-1)
    if zeros is not None:
        w = w + zeros.to(dtype).unsqueeze(-1)
    return w.view(N, K)


def quantize(w: torch.Tensor, bits: int, group_size: int, symmetric: bool = True, search: bool | str = True) -> Quantized:
    """Quantize a float weight (N, K); `group_size` must divide K (use K for one group per row).

    search: True (the default kind), False or "minmax", "plain" (least squared error), "weighted"
    (squared error weighted towards large values, as llama.cpp's quantizers do).

    The groups go in tasks of about TASK_VALUES values over torch's threads, each task on one thread
    (torch's own parallel ops, on pieces this small, waited at every op for a descheduled thread on a
    busy CPU). A task holds its groups as columns, (G, groups): a group's sums are adds of rows."""
    mode = DEFAULT_SEARCH if search is True else "minmax" if search is False else search
    if mode not in SEARCH_MODES:
        raise ValueError(f"search must be one of {SEARCH_MODES}, got {search!r}")
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    if bits == 8 and not symmetric:
        raise ValueError("8-bit quantization is symmetric only")
    N, K = w.shape
    g = _groups(w.detach(), group_size)  # (groups, G), in w's dtype
    n = g.shape[0]
    codes = torch.empty(g.shape, dtype=torch.uint8 if bits == 4 else torch.int8, device=g.device)
    scales = torch.empty(n, dtype=SCALE_DTYPE, device=g.device)
    zeros = None if symmetric else torch.empty(n, dtype=SCALE_DTYPE, device=g.device)
    per_task = max(1, TASK_VALUES // group_size)

    def task(start: int) -> None:
        stop = min(n, start + per_task)
        x = g[start:stop].t().float().contiguous()  # (G, groups)
        s, z, c = _quantize_columns(x, bits, symmetric, mode)
        codes[start:stop], scales[start:stop] = c.t(), s
        if zeros is not None:
            zeros[start:stop] = z

    in_tasks(task, range(0, n, per_task), g.device)
    shape = (N, K // group_size)
    return Quantized(codes.view(N, K), scales.view(shape), None if zeros is None else zeros.view(shape), bits, group_size)


def in_tasks(task, starts, device: torch.device | None = None) -> None:
    """task(start) for each start: on the CPU over torch's threads, one thread a task."""
    starts = list(starts)
    threads = torch.get_num_threads()
    if threads == 1 or len(starts) == 1 or (device is not None and device.type != "cpu"):
        for start in starts:
            task(start)
        return
    torch.set_num_threads(1)  # a task's ops stay on its thread (a new thread takes this setting)
    try:
        list(_pool(threads).map(task, starts))
    finally:
        torch.set_num_threads(threads)


_POOLS: dict[int, ThreadPoolExecutor] = {}  # kept: starting threads for each call took a fifth of a load


def _pool(threads: int) -> ThreadPoolExecutor:
    with _POOL_LOCK:
        if threads not in _POOLS:
            _POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="llmcli-quantize")
        return _POOLS[threads]


def _quantize_columns(x: torch.Tensor, bits: int, symmetric: bool, mode: str):
    """x (G, groups) float32 -> scales and zeros (groups,) in SCALE_DTYPE (zeros None when
    symmetric), and codes (G, groups): the nearest levels for the rounded scales."""
    if bits == 8:
        s, z = _search_symmetric(x, 127, 127, mode)
    elif symmetric:
        s, z = _search_symmetric(x, 8, 7, mode)
    else:
        s, z = _search_asymmetric(x, 15, mode)
    s = s.to(SCALE_DTYPE)
    z = None if symmetric else z.to(SCALE_DTYPE)
    codes = _nearest_codes(x, s.float(), None if z is None else z.float(), bits)
    if mode != "minmax":  # the search's fit, rounded to SCALE_DTYPE, may lose to plain min/max by an ulp
        s, z, codes = _no_worse_than_min_max(x, s, z, codes, bits, symmetric, mode)
    return s, z, codes


def _no_worse_than_min_max(x, s, z, codes, bits: int, symmetric: bool, mode: str):
    """Per group, the searched (scale, zero, codes) or min/max's, whichever reconstructs `x` with
    the smaller weighted error once both are rounded as stored: weights already on a grid come back
    exactly, whatever the search's float sums made of its fit."""
    s0, z0, codes0 = _quantize_columns(x, bits, symmetric, "minmax")
    w = _importance(x, mode)

    def error(s, z, codes):
        back = codes.float()
        if bits == 4:
            back.sub_(8)
        back.mul_(s.float())
        if z is not None:
            back.add_(z.float())
        return back.sub_(x).square_().mul_(w).sum(0)

    plain = error(s0, z0, codes0) < error(s, z, codes)
    s = torch.where(plain, s0, s)
    z = None if z is None else torch.where(plain, z0, z)
    return s, z, torch.where(plain, codes0, codes)


def _nearest_codes(x: torch.Tensor, s: torch.Tensor, z: torch.Tensor | None, bits: int) -> torch.Tensor:
    """The nearest representable level of each value of x (G, groups), given the (rounded) scales
    and zeros (groups,)."""
    inv = torch.where(s == 0, torch.zeros_like(s), 1.0 / s)
    q = x * inv if z is None else (x - z).mul_(inv)
    q.round_()
    if bits == 8:
        return q.clamp_(-127, 127).to(torch.int8)
    return q.add_(8).clamp_(0, 15).to(torch.uint8)


def _importance(x: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-value weights of the squared error: 1 ("plain"), or llama.cpp's emphasis on large values
    ("weighted": rms of the group + |x|, as its K-quants use), so outliers are not clipped away."""
    if mode == "plain":
        return torch.ones_like(x)
    return x.abs().add_((x * x).mean(0).sqrt_())


def _search_symmetric(x: torch.Tensor, neg: int, pos: int, mode: str):
    """Scales for w = l * scale, l in [-neg, pos] (int8: 127/127, int4: 8/7); zero is None.

    Min/max: the value of largest magnitude (the positive one of a tie) maps to -neg (Q4_0's trick:
    with an asymmetric range the sign of the scale follows that value, so it gets the extra level).
    The search rounds with 19 inverse scales around that one and fits each rounding's scale by
    weighted least squares, Σwxl / Σwl²; that fit's error is Σwx² - (Σwxl)² / Σwl², so the best
    maximises (Σwxl)² / Σwl².
    """
    lo, hi = x.amin(0), x.amax(0)  # (aminmax and argmax over the 32 rows: ten times as long)
    peak = torch.where(-lo > hi, lo, hi)  # signed value of largest magnitude, (groups,)
    zero = peak == 0
    scale = torch.where(zero, torch.zeros_like(peak), peak / -neg)  # maps peak to -neg
    if mode == "minmax":
        return scale, None
    fit = _SymmetricFit(x, _importance(x, mode), neg, pos)
    safe = torch.where(zero, torch.ones_like(peak), peak)
    best = fit(-neg / safe)  # (score, scale) of the min/max rounding
    for step in range(-9, 10):  # make_qx_quants: iscale = -(nmax + 0.1 * is) / max
        score, s = fit(-(neg + 0.1 * step) / safe)
        better = score > best[0]
        best = (torch.where(better, score, best[0]), torch.where(better, s, best[1]))
    return torch.where(zero, scale, best[1]), None


class _SymmetricFit:
    """(score, scale) of rounding x (G, groups) with inverse scales (groups,), in scratch tensors
    made once for all candidates."""

    def __init__(self, x, weights, neg: int, pos: int):
        self.x, self.weights, self.neg, self.pos = x, weights, neg, pos
        self.levels, self.wl = torch.empty_like(x), torch.empty_like(x)

    def __call__(self, iscale):
        levels, wl = self.levels, self.wl
        torch.mul(self.x, iscale, out=levels).round_().clamp_(-self.neg, self.pos)
        torch.mul(self.weights, levels, out=wl)
        sum_xl = (wl * self.x).sum(0)
        sum_l2 = wl.mul_(levels).sum(0)
        ok = sum_l2 > 0
        sum_l2 = torch.where(ok, sum_l2, torch.ones_like(sum_l2))
        return torch.where(ok, sum_xl * sum_xl / sum_l2, torch.zeros_like(sum_l2)), sum_xl / sum_l2


def _search_asymmetric(x: torch.Tensor, nmax: int, mode: str):
    """Scale and zero for w = (q - 8) * scale + zero, q in 0..nmax; returns (scale, zero).

    Min/max: scale = (max - min) / nmax, min at q = 0. The search (make_qkx2_quants: 21 inverse
    scales from (nmax - 1) to (nmax + 1) / range) rounds with each candidate, fits scale and min to
    those levels by weighted least squares and keeps the pair with the smallest weighted error.
    """
    lo, hi = x.amin(0), x.amax(0)
    span = hi - lo
    flat = span == 0
    best_s = torch.where(flat, torch.zeros_like(span), span / nmax)
    best_m = lo.clone()
    if mode != "minmax":
        w = _importance(x, mode)
        safe_span = torch.where(flat, torch.ones_like(span), span)
        wx = w * x
        sum_w, sum_x, sum_x2 = w.sum(0), wx.sum(0), (wx * x).sum(0)
        shifted = x - lo
        best_err = torch.full_like(span, float("inf"))
        levels, wl = torch.empty_like(x), torch.empty_like(x)
        for step in range(-1, 21):  # -1: the min/max rounding itself
            iscale = (nmax if step < 0 else nmax - 1 + 0.1 * step) / safe_span
            torch.mul(shifted, iscale, out=levels).round_().clamp_(0, nmax)
            torch.mul(w, levels, out=wl)
            sum_l, sum_xl = wl.sum(0), (wl * x).sum(0)
            sum_l2 = wl.mul_(levels).sum(0)
            det = sum_w * sum_l2 - sum_l * sum_l
            ok = (det > 0) & ~flat
            det = torch.where(ok, det, torch.ones_like(det))
            s = torch.where(ok, (sum_w * sum_xl - sum_x * sum_l) / det, best_s)
            m = torch.where(ok, (sum_l2 * sum_x - sum_l * sum_xl) / det, best_m)
            # Σw(s·l + m - x)² expanded, so the levels are not rounded a second time
            err = (s * s * sum_l2 + 2 * s * m * sum_l + sum_w * m * m - 2 * s * sum_xl - 2 * m * sum_x + sum_x2)
            better = ok & (err < best_err)
            best_s = torch.where(better, s, best_s)
            best_m = torch.where(better, m, best_m)
            best_err = torch.where(better, err, best_err)
    return best_s, best_m + 8 * best_s  # the kernels' zero is the value at q = 8


# ------------------------------------------------------------------------------------- packing


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) codes in 0..15 -> (N, K/2) uint8; column 2i in the low nibble, 2i+1 in the high."""
    c = codes.to(torch.uint8)
    return c[:, 0::2] | (c[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(N, K/2) uint8 -> (N, K) uint8 codes in 0..15 (the inverse of pack_int4)."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).view(packed.shape[0], -1)


def reconstruction_error(w: torch.Tensor, q: Quantized) -> float:
    """Mean squared error of the dequantized weight, relative to the weight's mean square."""
    w = w.float()
    return float(((q.dequantize() - w) ** 2).mean() / (w * w).mean().clamp_min(1e-30))
