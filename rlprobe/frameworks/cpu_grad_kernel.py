"""The CPU kernels of the gradient probe and of the parameter fingerprints (numba).

The gradient probe's: one fused numba pass per gradient (contract: docs/grads.md).

`grad_pass` reads a flat float32 or float64 array from memory once, in chunks that stay in the
L1 cache while a few vectorized passes run over each: max and min (as order-preserving integer
keys), the float64 sum of squares (NaN when a NaN is present), the zero count and one
cumulative count (x <= bound) per bound, and the packed sign bits (np.packbits order,
1 = x > 0, padding bits 0) written into `signs[off:]`. Imported only when a
CPU gradient monitor runs (numba is loaded lazily); compiled on first use, cached on disk.

The parameter fingerprint's: one numba pass per parameter (docs/dump-format.md, "param"). `fingerprint`
reads a flat array once, in chunks that stay in the L1 cache while two passes run over each: the `mix64`
digest of its 32-bit words (lake/grad_stats.mix64_numpy, bit for bit; 64-bit multiplies vectorize where the
CPU has them) and the float64 sum and sum of squares of its values. Imported only when a CPU parameter
monitor runs.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from rlprobe.lake.grad_stats import MIX_K1, MIX_K2
from rlprobe.numba_cache import use_user_cache_dir

use_user_cache_dir()

import numba  # noqa: E402  (after the cache dir is set)

_CHUNK = 4096  # elements per inner block (a multiple of 8: each chunk fills whole sign bytes)

# Each reduction over a chunk is its own compiled function so that it carries exactly the
# floating-point flags it may: reassociation (and so SIMD) for the float sums and the 0/1
# counts, none of which lets LLVM assume there are no NaNs. LLVM inlines them into the pass.
_SUM_FLAGS = {"reassoc", "contract"}


@numba.njit(nogil=True, cache=True)
def _bits_minmax(s, u):  # pragma: no cover (compiled)
    """Signed max, signed min and unsigned max of a chunk's bits (s and u: the same memory as
    signed and unsigned ints). Pure integer selects, so they vectorize (float max/min do not);
    `_minmax_of_bits` turns the three into the float max and min."""
    smax = s[0]
    smin = s[0]
    umax = u[0]
    for i in range(s.size):
        smax = max(smax, s[i])
        smin = min(smin, s[i])
        umax = max(umax, u[i])
    return smax, smin, umax


@numba.njit(nogil=True, cache=True, fastmath=_SUM_FLAGS)
def _sum_squares(ac):  # pragma: no cover (compiled)
    """Float64 sum of squares; NaN exactly when the chunk holds a NaN (every term is >= 0, so
    infinities never cancel into one)."""
    s = 0.0
    for i in range(ac.size):
        x = np.float64(ac[i])
        s += x * x
    return s


@numba.njit(nogil=True, cache=True, fastmath=_SUM_FLAGS)
def _count_le(ac, b):  # pragma: no cover (compiled)
    """Count of x <= b (NaN never counts), as a float32 sum of 0/1: exact below 2**24."""
    c = np.float32(0)
    for i in range(ac.size):
        c += np.float32(1) if ac[i] <= b else np.float32(0)
    return c


@numba.njit(nogil=True, cache=True, fastmath=_SUM_FLAGS)
def _count_zero(ac):  # pragma: no cover (compiled)
    c = np.float32(0)
    for i in range(ac.size):
        c += np.float32(1) if ac[i] == 0 else np.float32(0)
    return c


@numba.njit(nogil=True, cache=True)
def _pack_signs(ac, sc):  # pragma: no cover (compiled)
    """Packed sign bits (np.packbits order, 1 = x > 0, padding bits 0) of a chunk into sc."""
    full = ac.size // 8
    for q in range(full):
        i = q * 8
        sc[q] = (((ac[i] > 0) << 7) | ((ac[i + 1] > 0) << 6) | ((ac[i + 2] > 0) << 5)
                 | ((ac[i + 3] > 0) << 4) | ((ac[i + 4] > 0) << 3) | ((ac[i + 5] > 0) << 2)
                 | ((ac[i + 6] > 0) << 1) | (ac[i + 7] > 0))
    if full * 8 < ac.size:  # the last, partial byte: padding bits 0
        byte = 0
        for i in range(full * 8, ac.size):
            byte |= np.int64(ac[i] > 0) << (7 - (i - full * 8))
        sc[full] = byte


def _grad_pass(a, s, u, bounds, cnt, signs, off, do_signs):  # pragma: no cover (compiled)
    """a: the values; s, u: the same memory as signed and unsigned ints of a's width; bounds:
    the bounds in a's dtype; cnt: int64 [1 + len(bounds)] (accumulated: zeros, then x <= bound
    per bound). Returns (signed max, signed min, unsigned max of the bits, sum of squares); the
    sum is NaN when a NaN is present."""
    n = a.size
    nb = bounds.size
    smax = s[0]
    smin = s[0]
    umax = u[0]
    ss = 0.0
    zero = 0
    for start in range(0, n, _CHUNK):
        # chunk views indexed from 0: numba then knows the index is non-negative (no wraparound
        # select), so LLVM sees contiguous loads and vectorizes; the chunk stays in L1 across passes
        ac = a[start: start + _CHUNK]
        cmax, cmin, cumax = _bits_minmax(s[start: start + _CHUNK], u[start: start + _CHUNK])
        smax = max(smax, cmax)
        smin = min(smin, cmin)
        umax = max(umax, cumax)
        ss += _sum_squares(ac)
        zero += np.int64(_count_zero(ac))
        for j in range(nb):
            cnt[1 + j] += np.int64(_count_le(ac, bounds[j]))
        if do_signs:
            _pack_signs(ac, signs[off + start // 8: off + start // 8 + (ac.size + 7) // 8])
    cnt[0] += zero
    return smax, smin, umax, ss


_compiled: Any = None
_lock = threading.Lock()


def _kernel() -> Any:
    global _compiled
    if _compiled is None:
        with _lock:
            if _compiled is None:
                _compiled = numba.njit(nogil=True, cache=True)(_grad_pass)
    return _compiled


def _minmax_of_bits(smax: int, smin: int, umax: int, itype: type, ftype: type) -> tuple[float, float]:
    """Float max and min from the bits' signed max/min and unsigned max (no NaN present).

    Non-negative floats (sign bit 0) order like their bits as signed ints; negative ones order
    by magnitude, which their bits follow as signed and as unsigned ints alike. So the max is
    the signed max when any value is non-negative (smax >= 0), else the negative of smallest
    magnitude (the signed min); the min is the negative of largest magnitude (the unsigned
    max: sign-bit values dominate it) when any value is negative (smin < 0), else the signed
    min. -0.0 (the signed int minimum) sorts below +0.0."""
    mask = (1 << (8 * np.dtype(itype).itemsize)) - 1

    def value(bits: int) -> float:
        return float(np.array([bits & mask], _UNSIGNED[itype]).view(ftype)[0])

    mx = value(smax if smax >= 0 else smin)
    mn = value(umax if smin < 0 else smin)
    return mx, mn


_UNSIGNED = {np.int32: np.uint32, np.int64: np.uint64}


def stats_into(flat: np.ndarray, bounds: np.ndarray | None, row: np.ndarray, signs: np.ndarray | None,
               off: int) -> None:
    """Fill one stats row (max, min, norm, zero count, then x <= bound per bound) of a non-empty
    1-D C-contiguous float32/float64 array and, given `signs`, its packed sign bits at byte `off`.
    max/min/norm are NaN when a NaN is present (as torch.aminmax and vector_norm); the norm is
    sqrt of the float64 sum of squares, rounded to the array's dtype."""
    itype = np.int32 if flat.dtype == np.float32 else np.int64
    b = (np.zeros(0, flat.dtype) if bounds is None else bounds.astype(flat.dtype))
    cnt = np.zeros(1 + b.size, np.int64)
    sig = signs if signs is not None else np.zeros(0, np.uint8)
    smax, smin, umax, ss = _kernel()(flat, flat.view(itype), flat.view(_UNSIGNED[itype]), b, cnt, sig,
                                     np.int64(off), signs is not None)
    if np.isnan(ss):
        row[0] = row[1] = row[2] = np.nan
    else:
        row[0], row[1] = _minmax_of_bits(int(smax), int(smin), int(umax), itype, flat.dtype.type)
        with np.errstate(over="ignore"):
            row[2] = float(flat.dtype.type(np.sqrt(ss)))
    row[3] = cnt[0]
    row[4:4 + b.size] = cnt[1:]


# -- the parameter fingerprint (docs/dump-format.md, "param") ------------------------------------------------

_K1 = np.int64(MIX_K1)
_K2 = np.int64(MIX_K2)


@numba.njit(nogil=True, cache=True)
def _mix(w, start):  # pragma: no cover (compiled)
    """Sum of mix64 terms of 32-bit words `w` at positions start.. (int64, wrapping)."""
    h = np.int64(0)
    for j in range(w.size):
        x = (np.int64(w[j]) ^ ((start + j) * _K1)) * _K2
        h += x ^ (x >> 31)
    return h


@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _sums(a):  # pragma: no cover (compiled)
    s = 0.0
    ss = 0.0
    for i in range(a.size):
        x = np.float64(a[i])
        s += x
        ss += x * x
    return s, ss


@numba.njit(nogil=True, cache=True)
def _fingerprint(values, words, ratio):  # pragma: no cover (compiled)
    """values: the floats; words: their bytes as uint32, `ratio` words per value (1: float32, 2:
    float64; 0: unrelated arrays, each read in a pass of its own)."""
    digest = np.int64(0)
    s = 0.0
    ss = 0.0
    if ratio == 0:
        for start in range(0, words.size, _CHUNK):
            digest += _mix(words[start: start + _CHUNK], np.int64(start))
        for start in range(0, values.size, _CHUNK):
            cs, css = _sums(values[start: start + _CHUNK])
            s += cs
            ss += css
        return digest, s, ss
    for start in range(0, values.size, _CHUNK):
        digest += _mix(words[start * ratio: (start + _CHUNK) * ratio], np.int64(start * ratio))
        cs, css = _sums(values[start: start + _CHUNK])
        s += cs
        ss += css
    return digest, s, ss


def fingerprint(values: np.ndarray, words: np.ndarray | None = None) -> tuple[int, float, float]:
    """(mix64 digest as uint64 int, sum, norm) of a 1-D C-contiguous float32/float64 array; `words`:
    the uint32 words to digest when they are not `values`' own bytes (bf16, odd-sized 16-bit)."""
    if words is None:
        ratio = values.dtype.itemsize // 4
        words = values.view(np.uint32)
    else:
        ratio = 0
    digest, s, ss = _fingerprint(values, words, np.int64(ratio))
    return int(digest) & 0xFFFFFFFFFFFFFFFF, float(s), float(np.sqrt(ss))
