"""Partial aggregates of the element-wise comparison and how they combine into the final
metrics of a pair (pure Python, no numba: the executor and the SQL side import it cheaply)."""

from __future__ import annotations

import math
import sys
from typing import Any, Iterable, NamedTuple

__all__ = ["METRICS", "METRIC_KEYS", "NORMAL_MIN", "Partial", "combine", "partial_from"]

#: the metrics of a pair, as :func:`combine` returns them, with their Arrow type names (the columns
#: of the kernel's results table that key_data.sql and modules.sql read through pair_macros.sql)
METRICS: dict[str, str] = {
    "numel": "int64",
    "equal_count": "int64",
    "first_mismatch_index": "int64",
    "max_abs_err": "float64",
    "max_rel_err": "float64",
    "within_1e3_count": "int64",
    "within_1e2_count": "int64",
    "cosine": "float64",
    "nan_mismatch_count": "int64",
}

#: keys of the dict returned by :func:`rlprobe.comparison.pair_metrics.pair_metrics` and :func:`combine`
METRIC_KEYS = tuple(METRICS)


class Partial(NamedTuple):
    """Aggregates of one range of flat indices (what a kernel returns)."""

    n: int
    equal_count: int
    first_mismatch: int  # flat index, -1 when none
    max_abs_err: float
    max_rel_err: float
    within_1e3: int
    within_1e2: int
    dot: float  # over elements where both values are finite
    sum_sq_a: float
    sum_sq_b: float
    nan_mismatch_count: int


def partial_from(t: tuple, offset: int) -> Partial:
    n, eq, first, mabs, mrel, w3, w2, dot, sa, sb, nanmis = t
    return Partial(int(n), int(eq), int(first) + offset if first >= 0 else -1, float(mabs), float(mrel),
                   int(w3), int(w2), float(dot), float(sa), float(sb), int(nanmis))


NORMAL_MIN = sys.float_info.min  # the smallest normal float64: products below it are subnormal or zero


def _cosine(n: int, dot: float, sa: float, sb: float) -> float | None:
    if n == 0:
        return None
    if sa == 0.0 and sb == 0.0:
        return 1.0
    if sa == 0.0 or sb == 0.0:
        return 0.0
    if not (math.isfinite(sa) and math.isfinite(sb) and math.isfinite(dot)):
        return None  # the float64 sums overflowed (|values| beyond ~1e154)
    prod = sa * sb
    # sqrt(s*s) == s exactly, so identical arrays give exactly 1.0; fall back when the product
    # overflows or underflows, gradual underflow included (a subnormal product has lost digits:
    # values of ~1e-80 gave a cosine of 0.99998 for identical arrays), keeping s where sa == sb
    if NORMAL_MIN <= prod < math.inf:
        denom = math.sqrt(prod)
    else:
        denom = sa if sa == sb else math.sqrt(sa) * math.sqrt(sb)
    cos = dot / denom
    if not math.isfinite(cos):
        return None
    return max(-1.0, min(1.0, cos))


def _fsum(xs: list[float]) -> float:
    """Exactly rounded sum; inf/NaN propagate (fsum would raise on inf + -inf)."""
    if not all(math.isfinite(x) for x in xs):
        return sum(xs)
    try:
        return math.fsum(xs)
    except OverflowError:  # a partial sum overflowed: add scaled values (inf if the total overflows)
        return math.fsum(x * 2.0**-64 for x in xs) * 2.0**64


def combine(partials: Iterable[Partial | tuple]) -> dict[str, Any]:
    """Merge partial aggregates of disjoint ranges (in any order) into the final metrics.

    Returns a dict with the keys of :data:`METRIC_KEYS`: ``numel``, ``equal_count``,
    ``first_mismatch_index`` (int, None when none), ``max_abs_err``, ``max_rel_err``,
    ``within_1e3_count``, ``within_1e2_count``, ``cosine`` (None for numel 0) and
    ``nan_mismatch_count``. Sums are added with ``math.fsum``, so the result does not
    depend on the order of ``partials``.
    """
    n = eq = w3 = w2 = nanmis = 0
    first = -1
    mabs = mrel = 0.0
    dots: list[float] = []
    sas: list[float] = []
    sbs: list[float] = []
    for p in partials:
        p = p if isinstance(p, Partial) else Partial(*p)
        n += p.n
        eq += p.equal_count
        if p.first_mismatch >= 0 and (first < 0 or p.first_mismatch < first):
            first = p.first_mismatch
        if p.max_abs_err > mabs:
            mabs = p.max_abs_err
        if p.max_rel_err > mrel:
            mrel = p.max_rel_err
        w3 += p.within_1e3
        w2 += p.within_1e2
        dots.append(p.dot)
        sas.append(p.sum_sq_a)
        sbs.append(p.sum_sq_b)
        nanmis += p.nan_mismatch_count
    dot, sa, sb = _fsum(dots), _fsum(sas), _fsum(sbs)
    return {
        "numel": n,
        "equal_count": eq,
        "first_mismatch_index": first if first >= 0 else None,
        "max_abs_err": mabs,
        "max_rel_err": mrel,
        "within_1e3_count": w3,
        "within_1e2_count": w2,
        "cosine": _cosine(n, dot, sa, sb),
        "nan_mismatch_count": nanmis,
    }


# --------------------------------------------------------------------------------------
# dtypes and chunks
