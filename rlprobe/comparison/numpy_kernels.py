"""The element-wise comparison of rlprobe.comparison.pair_kernels in plain numpy, bit for bit, for small
chunks: a comparison of a few small tensors then never imports numba (~0.3 s of imports and a
cache load at start-up, issue 18).

Same inputs and outputs as the compiled kernels: two 1-D arrays of one kernel dtype (float32,
float64 or int64) and the partial aggregates of rlprobe.comparison.partials as a tuple of float64. Every metric
is the same float64 operation on the same element (errors, maxima, counts, the first mismatch),
and the dot and square sums are added one element at a time in index order (``np.add.accumulate``,
never numpy's pairwise ``sum``), starting from 0.0 as the kernels do. The compiled float kernel
adds in index order too for a block under ``SEQUENTIAL_BELOW`` elements (its vectorized loop may
reassociate the sums of longer all-finite blocks), so below that size the two agree on every bit;
the integer kernel always adds in index order. Longer chunks go to numba (``pair_metrics.chunk_partial``)
and numpy stays a test oracle for them (every field but the sums of all-finite blocks).
"""

from __future__ import annotations

import numpy as np

__all__ = ["SEQUENTIAL_BELOW", "float_partial", "int_partial", "partial_of"]

#: chunks shorter than this are compared here, and the compiled float kernel adds blocks shorter
#: than this in index order, whatever the CPU. 8: on the AVX-512 VM the kernel's loop reassociated
#: sums from 8 elements on, so below 8 no result changed; a larger value would change the last bits
#: of `cosine` (up to 8 ulps measured) of tensors between 8 and it, and of such chunk tails
SEQUENTIAL_BELOW = 8

_INF = np.inf


def _ordered_sum(values: np.ndarray) -> float:
    """0.0 + values[0] + values[1] + ... in index order, one float64 rounding per addition."""
    if values.size == 0:
        return 0.0
    return float(0.0 + np.add.accumulate(values)[-1])  # 0.0 + s: the kernels' +0.0 for a sum of -0.0s


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask)) if mask.any() else -1


def float_partial(a: np.ndarray, b: np.ndarray) -> tuple:
    """pair_kernels' float kernel over two float32 or float64 arrays of equal length, in numpy."""
    x = a.astype(np.float64)
    y = b.astype(np.float64)
    n = int(x.shape[0])
    with np.errstate(all="ignore"):
        nan_x = np.isnan(x)
        nan_y = np.isnan(y)
        equal = (x == y) | (nan_x & nan_y)
        nan_mismatch = nan_x ^ nan_y
        ax = np.abs(x)
        ay = np.abs(y)
        m = np.maximum(ax, ay)
        erring = ~equal & ~nan_x & ~nan_y  # mismatches with a number on both sides
        infinite = erring & (m == _INF)  # an infinity against a finite value or the opposite infinity
        finite = erring & ~infinite
        d = np.abs(x - y)[finite]
        mf = m[finite]
        rel = np.where(d == _INF, np.abs(x[finite] / mf - y[finite] / mf), d / mf)
        max_abs = float(d.max(initial=0.0))
        max_rel = float(rel.max(initial=0.0))
        if infinite.any():
            max_abs = float(_INF)
            max_rel = max(max_rel, float(np.where(ax[infinite] == ay[infinite], 2.0, 1.0).max()))
        eq = int(np.count_nonzero(equal))
        w3 = int(np.count_nonzero(d <= 1e-3 * mf))
        w2 = int(np.count_nonzero(d <= 1e-2 * mf))
        both = (x - x == 0.0) & (y - y == 0.0)  # both finite: the elements the sums take
        xs = x[both]
        ys = y[both]
        dot = _ordered_sum(xs * ys)
        sa = _ordered_sum(xs * xs)
        sb = _ordered_sum(ys * ys)
    return _floats(n, eq, _first(~equal), max_abs, max_rel, eq + w3, eq + w2, dot, sa, sb,
                   int(np.count_nonzero(nan_mismatch)))


def int_partial(a: np.ndarray, b: np.ndarray) -> tuple:
    """pair_kernels' int64 kernel in numpy: exact equality; the difference exact in uint64, rounded once."""
    x = a.astype(np.float64)
    y = b.astype(np.float64)
    n = int(x.shape[0])
    equal = a == b
    differ = ~equal
    ua = a.view(np.uint64)
    ub = b.view(np.uint64)
    with np.errstate(all="ignore"):
        d = np.where(a > b, ua - ub, ub - ua)[differ].astype(np.float64)  # wraps: the exact |a - b|
        m = np.maximum(np.abs(x), np.abs(y))[differ]
        rel = d / m
        eq = int(np.count_nonzero(equal))
        w3 = int(np.count_nonzero(d <= 1e-3 * m))
        w2 = int(np.count_nonzero(d <= 1e-2 * m))
        dot = _ordered_sum(x * y)
        sa = _ordered_sum(x * x)
        sb = _ordered_sum(y * y)
    return _floats(n, eq, _first(differ), float(d.max(initial=0.0)), float(rel.max(initial=0.0)), eq + w3,
                   eq + w2, dot, sa, sb, 0)


def _floats(*fields: float) -> tuple:
    """The partials as the compiled kernels return them: float64, in partials.FIELDS' order."""
    return tuple(map(float, fields))


def partial_of(a: np.ndarray, b: np.ndarray) -> tuple:
    """The kernel of the arrays' dtype (both float32, float64 or int64, 1-D, equal length)."""
    if a.dtype == np.int64:
        return int_partial(a, b)
    return float_partial(a, b)
