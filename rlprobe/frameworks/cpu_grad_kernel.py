"""The gradient probe's CPU kernel: one fused numba pass per gradient (contract: docs/grads.md).

`grad_pass` walks a flat float32 or float64 array once, in chunks that stay in the L1 cache,
and returns max, min (as order-preserving integer keys), the float64 sum of squares, the NaN
and zero counts and one cumulative count (x <= bound) per bound; it writes the packed sign
bits (np.packbits order, 1 = x > 0, padding bits 0) into `signs[off:]`. Imported only when a
CPU gradient monitor runs (numba is loaded lazily); compiled on first use, cached on disk.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from rlprobe.compare.pair_metrics import _default_numba_cache_dir

_default_numba_cache_dir()

import numba  # noqa: E402  (after the cache dir is set)

_CHUNK = 2048  # elements per inner block (a multiple of 8: each chunk fills whole sign bytes)


def _grad_pass(a, u, sh, bounds, cnt, signs, off, do_signs):  # pragma: no cover (compiled)
    """a: the values; u: the same memory as signed ints (int32 for float32, int64 for float64);
    sh: the int width - 1; bounds: the bounds in a's dtype; cnt: int64 [2 + len(bounds)]
    (accumulated: nan, zero, then x <= bound per bound). Returns (key max, key min, sum of
    squares). The key of bits v is v ^ ((v >> sh) & maxpos): integer order = float order
    (-0.0 < +0.0), NaN keys lie outside the keys of numbers."""
    n = a.size
    nb = bounds.size
    maxpos = (np.int64(1) << sh) - 1
    kmax = -maxpos - 1
    kmin = maxpos
    nan = 0
    zero = 0
    ss = 0.0
    for start in range(0, n, _CHUNK):
        # chunk views indexed from 0: numba then knows the index is non-negative (no wraparound
        # select), so LLVM sees contiguous loads and vectorizes
        ac = a[start: start + _CHUNK]
        uc = u[start: start + _CHUNK]
        m = ac.size
        # max/min on the integer keys: integer reductions vectorize, float ones do not
        cmax = -maxpos - 1
        cmin = maxpos
        for i in range(m):
            v = np.int64(uc[i])
            key = v ^ ((v >> sh) & maxpos)
            cmax = max(cmax, key)
            cmin = min(cmin, key)
        kmax = max(kmax, cmax)
        kmin = min(kmin, cmin)
        cn = 0
        cz = 0
        for i in range(m):
            x = ac[i]
            cn += x != x
            cz += x == 0
        nan += cn
        zero += cz
        for j in range(nb):
            b = bounds[j]
            c = 0
            for i in range(m):
                c += ac[i] <= b
            cnt[2 + j] += c
        # sum of squares: eight float64 accumulators (no fastmath, so no reassociation)
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
        full = m // 8
        for q in range(full):
            i = q * 8
            x0 = np.float64(ac[i])
            x1 = np.float64(ac[i + 1])
            x2 = np.float64(ac[i + 2])
            x3 = np.float64(ac[i + 3])
            x4 = np.float64(ac[i + 4])
            x5 = np.float64(ac[i + 5])
            x6 = np.float64(ac[i + 6])
            x7 = np.float64(ac[i + 7])
            s0 += x0 * x0
            s1 += x1 * x1
            s2 += x2 * x2
            s3 += x3 * x3
            s4 += x4 * x4
            s5 += x5 * x5
            s6 += x6 * x6
            s7 += x7 * x7
        for i in range(full * 8, m):
            x = np.float64(ac[i])
            s0 += x * x
        ss += ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
        if do_signs:
            sc = signs[off + start // 8: off + start // 8 + (m + 7) // 8]
            for q in range(full):
                i = q * 8
                sc[q] = (((ac[i] > 0) << 7) | ((ac[i + 1] > 0) << 6) | ((ac[i + 2] > 0) << 5)
                         | ((ac[i + 3] > 0) << 4) | ((ac[i + 4] > 0) << 3) | ((ac[i + 5] > 0) << 2)
                         | ((ac[i + 6] > 0) << 1) | (ac[i + 7] > 0))
            if full * 8 < m:  # the last, partial byte: padding bits 0
                byte = 0
                for i in range(full * 8, m):
                    byte |= np.int64(ac[i] > 0) << (7 - (i - full * 8))
                sc[full] = byte
    cnt[0] += nan
    cnt[1] += zero
    return kmax, kmin, ss


_compiled: Any = None
_lock = threading.Lock()


def _kernel() -> Any:
    global _compiled
    if _compiled is None:
        with _lock:
            if _compiled is None:
                _compiled = numba.njit(nogil=True, cache=True)(_grad_pass)
    return _compiled


def _from_key(key: int, itype: type, ftype: type) -> float:
    sh = np.dtype(itype).itemsize * 8 - 1
    maxpos = (1 << sh) - 1
    bits = key ^ (maxpos if key < 0 else 0)
    return float(np.array([bits], itype).view(ftype)[0])


def stats_into(flat: np.ndarray, bounds: np.ndarray | None, row: np.ndarray, signs: np.ndarray | None,
               off: int) -> None:
    """Fill one stats row (max, min, norm, zero count, then x <= bound per bound) of a non-empty
    1-D C-contiguous float32/float64 array and, given `signs`, its packed sign bits at byte `off`.
    max/min/norm are NaN when a NaN is present (as torch.aminmax and vector_norm); the norm is
    sqrt of the float64 sum of squares, rounded to the array's dtype."""
    itype = np.int32 if flat.dtype == np.float32 else np.int64
    b = (np.zeros(0, flat.dtype) if bounds is None else bounds.astype(flat.dtype))
    cnt = np.zeros(2 + b.size, np.int64)
    sig = signs if signs is not None else np.zeros(0, np.uint8)
    kmax, kmin, ss = _kernel()(flat, flat.view(itype), np.int64(np.dtype(itype).itemsize * 8 - 1), b, cnt,
                               sig, np.int64(off), signs is not None)
    if cnt[0]:
        row[0] = row[1] = row[2] = np.nan
    else:
        row[0] = _from_key(int(kmax), itype, flat.dtype.type)
        row[1] = _from_key(int(kmin), itype, flat.dtype.type)
        with np.errstate(over="ignore"):
            row[2] = float(flat.dtype.type(np.sqrt(ss)))
    row[3] = cnt[1]
    row[4:4 + b.size] = cnt[2:]
