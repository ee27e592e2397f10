"""The partial aggregates of rlprobe.comparison.kernels in plain numpy, element by element as
rlprobe.comparison.pair_metrics states the rules, for tests/compare/test_pair_kernels.py: a tuple in the order of
partials.FIELDS, counts, maxima and first mismatch exact, the three sums exactly rounded (math.fsum) with the
sum of their terms' magnitudes, which bounds any order's rounding error."""

from __future__ import annotations

import math

import numpy as np


def _fsum(terms: np.ndarray) -> float:
    if not np.isfinite(terms).all():
        with np.errstate(all="ignore"):
            return float(np.sum(terms))
    try:
        return math.fsum(terms)
    except OverflowError:
        return math.fsum(terms * 2.0**-64) * 2.0**64


def partials(a: np.ndarray, b: np.ndarray) -> tuple[tuple[float, ...], tuple[float, float, float]]:
    """(the 11 partials of a against b, the magnitudes of the dot, sum_sq_a and sum_sq_b terms)."""
    n = a.shape[0]
    if a.dtype == np.int64:
        ia, ib = a.astype(object), b.astype(object)
        equal = np.asarray(ia == ib, bool)
        d = np.array([float(abs(p - q)) for p, q in zip(ia, ib)])  # exact, rounded once
        nan_mis = np.zeros(n, bool)
        x, y = a.astype(np.float64), b.astype(np.float64)
        m = np.maximum(np.abs(x), np.abs(y))
        finite_err = ~equal
        inf_err = np.zeros(n, bool)
        rel = np.zeros(n)
        rel[finite_err] = d[finite_err] / m[finite_err]
    else:
        x, y = a.astype(np.float64), b.astype(np.float64)
        nan_x, nan_y = np.isnan(x), np.isnan(y)
        equal = (x == y) | (nan_x & nan_y)
        nan_mis = nan_x ^ nan_y
        erring = ~equal & ~nan_mis
        with np.errstate(all="ignore"):
            m = np.maximum(np.abs(x), np.abs(y))
            d = np.abs(x - y)
            inf_err = erring & np.isinf(m)  # an infinity against a finite value or the opposite infinity
            finite_err = erring & ~np.isinf(m)
            rel = np.zeros(n)
            rel[finite_err] = np.where(np.isinf(d[finite_err]),  # finite values whose difference overflows
                                       np.abs(x[finite_err] / m[finite_err] - y[finite_err] / m[finite_err]),
                                       d[finite_err] / m[finite_err])
            rel[inf_err] = np.where(np.abs(x[inf_err]) == np.abs(y[inf_err]), 2.0, 1.0)
    max_abs = math.inf if inf_err.any() else float(d[finite_err].max(initial=0.0))
    with np.errstate(all="ignore"):
        w3 = equal | (finite_err & (d <= 1e-3 * m))
        w2 = equal | (finite_err & (d <= 1e-2 * m))
        both = np.isfinite(x) & np.isfinite(y)
        terms = (x[both] * y[both], x[both] * x[both], y[both] * y[both])
    mism = np.flatnonzero(~equal)
    fields = (n, int(equal.sum()), int(mism[0]) if mism.size else -1, max_abs, float(rel.max(initial=0.0)),
              int(w3.sum()), int(w2.sum()), *(_fsum(t) for t in terms), int(nan_mis.sum()))
    with np.errstate(all="ignore"):
        return tuple(map(float, fields)), tuple(float(np.abs(t).sum()) for t in terms)
