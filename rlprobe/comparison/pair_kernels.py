"""The compiled loops of the element-wise comparison (numba): partial aggregates of two flat
arrays over a range of indices, for (float32, float32), (float64, float64) and (int64, int64), returned as
a tuple of float64 in the order of rlprobe.comparison.partials.FIELDS (counts exact: a range holds at most
a chunk of elements).

The element semantics are in rlprobe.comparison.pair_metrics, the public face of these kernels.
numba's on-disk cache is pointed at a writable folder (rlprobe.numba_cache) before numba loads.
A new metric is one more partial aggregate here and its declaration in rlprobe.comparison.partials.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from rlprobe.numba_cache import import_numba, use_user_cache_dir

use_user_cache_dir()
import_numba()  # not at once with the warm-up thread of `rlprobe compare`

import numba  # noqa: E402  (after the cache dir is set)
from numba import types as _nt  # noqa: E402

__all__ = ["compiled_float_kernel", "compiled_int_kernel", "kernel_for", "warm_up"]

# --------------------------------------------------------------------------------------
# kernels (plain Python here; compiled lazily, see kernel_for())


@numba.njit(nogil=True, cache=True)
def _float_exact(a, b, start, stop):  # pragma: no cover - runs compiled
    """Partial aggregates of float arrays ``a``, ``b`` over flat indices [start, stop), one element
    at a time with every special case (NaN, infinities, overflowing differences)."""
    inf = np.inf
    eq = 0
    first = -1
    max_abs = 0.0
    max_rel = 0.0
    w3 = 0
    w2 = 0
    dot = 0.0
    sa = 0.0
    sb = 0.0
    nanmis = 0
    for i in range(start, stop):
        x = np.float64(a[i])
        y = np.float64(b[i])
        if x == y:
            eq += 1
            if x - x == 0.0:  # finite (inf - inf is NaN)
                dot += x * y
                sa += x * x
                sb += y * y
            continue
        if x != x or y != y:  # at least one NaN
            if x != x and y != y:
                eq += 1
            else:
                nanmis += 1
                if first < 0:
                    first = i
            continue
        if first < 0:
            first = i
        ax = abs(x)
        ay = abs(y)
        m = ax if ax > ay else ay
        if m == inf:  # an infinity against a finite value or the opposite infinity
            max_abs = inf
            rel = 2.0 if ax == ay else 1.0
            if rel > max_rel:
                max_rel = rel
            continue
        d = abs(x - y)
        if d == inf:  # two finite float64 values whose difference overflows
            rel = abs(x / m - y / m)
        else:
            rel = d / m
        if d > max_abs:
            max_abs = d
        if rel > max_rel:
            max_rel = rel
        if d <= 1e-3 * m:
            w3 += 1
        if d <= 1e-2 * m:
            w2 += 1
        dot += x * y
        sa += x * x
        sb += y * y
    return (stop - start, eq, first, max_abs, max_rel, eq + w3, eq + w2, dot, sa, sb, nanmis)


_BLOCK = 2048  # elements per block of the float kernel (a few KB: stays in L1 across its passes)
# a block shorter than this is compared element by element (sums in index order, whatever the CPU's
# vector width), as rlprobe.comparison.numpy_kernels does: numpy_kernels.SEQUENTIAL_BELOW, kept equal by
# tests/compare/test_numpy_kernels.py (a literal here: numba's cache of this file sees no other file)
_SEQUENTIAL_BELOW = 8


_INF_BITS = 0x7FF0000000000000  # the bits of +inf: a larger non-negative float64's are a NaN's


@numba.njit(nogil=True, cache=True, fastmath={"reassoc"})
def _finite_block(ac, bc, dbuf, rbuf):  # pragma: no cover - runs compiled (reassociating sums)
    """A block's equal and within counts, the dot and square sums, and each element's |a - b| written
    to dbuf. Branch-free, so it vectorizes; equal elements have d = 0 and count as within, as the exact
    kernel counts them. Only right where every value is finite: an infinity or a NaN in either array,
    or an overflowing difference, leaves a NaN or an infinity in dbuf, and the caller redoes the block.
    With `rbuf` an array, each element's rel err (_rel_errors) goes there in the same pass, for a block
    that likely differs (the one before it did); with None numba compiles that store out, so both are
    one loop vectorized the same way (same sums, bit for bit: tests/compare/test_float_kernel_split.py)."""
    eq = 0
    w3 = 0
    w2 = 0
    dot = 0.0
    sa = 0.0
    sb = 0.0
    for i in range(ac.size):
        x = np.float64(ac[i])
        y = np.float64(bc[i])
        eq += x == y
        d = abs(x - y)
        ax = abs(x)
        ay = abs(y)
        m = ax if ax > ay else ay
        w3 += d <= 1e-3 * m
        w2 += d <= 1e-2 * m
        dot += x * y
        sa += x * x
        sb += y * y
        dbuf[i] = d
        if rbuf is not None:
            rbuf[i] = d / m if m > 0.0 else 0.0
    return eq, w3, w2, dot, sa, sb


@numba.njit(nogil=True, cache=True)
def _rel_errors(ac, bc, dbuf, rbuf):  # pragma: no cover - runs compiled
    """Each element's rel err |a - b| / max(|a|, |b|) (0 where both are 0) into rbuf, from dbuf's |a - b|:
    a second pass, only over blocks that differ somewhere (its division is most of a block's cost)."""
    for i in range(ac.size):
        ax = abs(np.float64(ac[i]))
        ay = abs(np.float64(bc[i]))
        m = ax if ax > ay else ay
        rbuf[i] = dbuf[i] / m if m > 0.0 else 0.0


@numba.njit(nogil=True, cache=True)
def _max_int(v):  # pragma: no cover - runs compiled
    """Max of int64 values: the max of non-negative float64s through their bits (integer
    max vectorizes, float max does not)."""
    m = v[0]
    for i in range(v.size):
        m = max(m, v[i])
    return m


def _float_kernel(a, b, start, stop):  # pragma: no cover - runs compiled
    """Partial aggregates of float arrays ``a``, ``b`` over flat indices [start, stop).

    Block by block: a block with only finite values (the common case) takes the vectorized
    `_finite_block`, and `_rel_errors` only where some element differs (`_finite_block` given rbuf, both in
    one pass, after a block that differed: the division is most of the cost of a block); one holding a NaN or an
    infinity, or whose float64 difference overflows (told from the largest |a - b| `_finite_block`
    wrote), is redone by `_float_exact`, and so is one shorter than _SEQUENTIAL_BELOW. The first
    mismatch is searched for only in the first block that has one."""
    eq = 0
    first = -1
    max_abs = 0.0
    max_rel = 0.0
    w3 = 0
    w2 = 0
    dot = 0.0
    sa = 0.0
    sb = 0.0
    nanmis = 0
    dbuf = np.empty(_BLOCK, np.float64)
    rbuf = np.empty(_BLOCK, np.float64)
    dbits = dbuf.view(np.int64)
    rbits = rbuf.view(np.int64)
    out = np.empty(2, np.int64)
    outf = out.view(np.float64)
    differed = False  # whether the last block had some |a - b| > 0: then the next one likely has too
    for bs in range(start, stop, _BLOCK):
        be = min(bs + _BLOCK, stop)
        n = be - bs
        ac = a[bs:be]
        bc = b[bs:be]
        fast = n >= _SEQUENTIAL_BELOW
        if fast:
            if differed:
                e, c3, c2, d_, s1, s2 = _finite_block(ac, bc, dbuf, rbuf)
            else:
                e, c3, c2, d_, s1, s2 = _finite_block(ac, bc, dbuf, None)
            out[0] = _max_int(dbits[:n])
            fast = out[0] < _INF_BITS  # else a NaN or an infinity, or a difference that overflowed
        if fast:
            eq += e
            w3 += c3
            w2 += c2
            dot += d_
            sa += s1
            sb += s2
            if outf[0] > max_abs:
                max_abs = outf[0]
            if out[0] > 0:  # some |a - b| > 0: the block's largest rel err
                if not differed:
                    _rel_errors(ac, bc, dbuf, rbuf)
                out[1] = _max_int(rbits[:n])
                if outf[1] > max_rel:
                    max_rel = outf[1]
            differed = out[0] > 0
            if first < 0 and e < n:
                for i in range(bs, be):
                    if ac[i - bs] != bc[i - bs]:
                        first = i
                        break
            continue
        t = _float_exact(a, b, bs, be)
        eq += t[1]
        if first < 0 and t[2] >= 0:
            first = t[2]
        if t[3] > max_abs:
            max_abs = t[3]
        if t[4] > max_rel:
            max_rel = t[4]
        w3 += t[5]
        w2 += t[6]
        dot += t[7]
        sa += t[8]
        sb += t[9]
        nanmis += t[10]
    return (np.float64(stop - start), np.float64(eq), np.float64(first), max_abs, max_rel, np.float64(w3),
            np.float64(w2), dot, sa, sb, np.float64(nanmis))


def _int_kernel(a, b, start, stop):  # pragma: no cover - runs compiled
    """Partial aggregates of int64 arrays: exact equality, errors in float64."""
    eq = 0
    first = -1
    max_abs = 0.0
    max_rel = 0.0
    w3 = 0
    w2 = 0
    dot = 0.0
    sa = 0.0
    sb = 0.0
    for i in range(start, stop):
        p = a[i]
        q = b[i]
        x = np.float64(p)
        y = np.float64(q)
        dot += x * y
        sa += x * x
        sb += y * y
        if p == q:
            eq += 1
            continue
        if first < 0:
            first = i
        # the exact difference, in uint64 arithmetic (no int64 overflow), rounded once
        if p > q:
            d = np.float64(np.uint64(p) - np.uint64(q))
        else:
            d = np.float64(np.uint64(q) - np.uint64(p))
        ax = abs(x)
        ay = abs(y)
        m = ax if ax > ay else ay
        rel = d / m
        if d > max_abs:
            max_abs = d
        if rel > max_rel:
            max_rel = rel
        if d <= 1e-3 * m:
            w3 += 1
        if d <= 1e-2 * m:
            w2 += 1
    return (np.float64(stop - start), np.float64(eq), np.float64(first), max_abs, max_rel, np.float64(eq + w3),
            np.float64(eq + w2), dot, sa, sb, 0.0)


#: the kernels as numba functions that other compiled code calls (rlprobe.comparison.small_pairs)
compiled_float_kernel = numba.njit(nogil=True, cache=True)(_float_kernel)
compiled_int_kernel = numba.njit(nogil=True, cache=True)(_int_kernel)


def _array_type(dtype):
    return _nt.Array(dtype, 1, "C", readonly=True)


_SIGNATURES = {
    np.dtype(np.float32): (_float_kernel, _nt.float32),
    np.dtype(np.float64): (_float_kernel, _nt.float64),
    np.dtype(np.int64): (_int_kernel, _nt.int64),
}
_compiled: dict[np.dtype, Any] = {}
_compile_lock = threading.Lock()


def kernel_for(dtype: np.dtype):
    """The compiled kernel for one of the three dtypes (compiled or loaded from cache once)."""
    k = _compiled.get(dtype)
    if k is None:
        with _compile_lock:
            k = _compiled.get(dtype)
            if k is None:
                pyfunc, nbtype = _SIGNATURES[dtype]
                arr = _array_type(nbtype)
                k = numba.njit([(arr, arr, _nt.int64, _nt.int64)], nogil=True, cache=True)(pyfunc)
                _compiled[dtype] = k
    return k


def warm_up() -> None:
    """Compile (or load from the on-disk cache) the three kernels by running them on tiny arrays.

    Thread-safe; a CLI may call it in a background thread while it reads the dumps.
    """
    for dtype in _SIGNATURES:
        x = np.zeros(2, dtype=dtype)
        kernel_for(dtype)(x, x, 0, 2)


# --------------------------------------------------------------------------------------
