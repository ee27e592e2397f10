"""The element-wise comparison's results, declared once: the partial aggregates a kernel returns for a
range of flat indices (FIELDS: their order, and how the partials of one pair's ranges merge) and the
metrics of a pair (METRICS: each a column of the results table, made from the merged partials of many
pairs at once). Pure Python and numpy: the executor and the SQL side import it cheaply.

A kernel (kernels.pyx) returns its partials as a tuple of float64 in FIELDS' order (a
count is exact in float64: a range holds at most a chunk of elements), the batch kernels store that
tuple as a row of a float64 matrix, and everything downstream reads them by name from here. A new
metric is the kernel's loop, one Field (or one Metric over fields there are), and its header
(report/headers.py). Last, the codes of the compiled readers' per-file results (CODES)."""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np

__all__ = ["CODES", "FIELDS", "FIRST", "METRICS", "METRIC_KEYS", "NORMAL_MIN", "WIDTH", "Partial", "combine", "merge",
           "metric_columns", "metric_row", "partial_from"]


class Field(NamedTuple):
    """One partial aggregate: its name, whether it is a count (`int`, a flat index included) or a float, and how
    the values of several ranges of one pair merge: `sum`, `max`, `first` (the smallest non-negative, -1 for
    none) or `fsum` (math.fsum: exactly rounded, so the order of the ranges does not matter)."""

    name: str
    kind: type
    merge: str


FIELDS: tuple[Field, ...] = (
    Field("n", int, "sum"),
    Field("equal_count", int, "sum"),
    Field("first_mismatch", int, "first"),  # flat index, -1 when none
    Field("max_abs_err", float, "max"),
    Field("max_rel_err", float, "max"),
    Field("within_1e3", int, "sum"),
    Field("within_1e2", int, "sum"),
    Field("dot", float, "fsum"),  # over elements where both values are finite
    Field("sum_sq_a", float, "fsum"),
    Field("sum_sq_b", float, "fsum"),
    Field("nan_mismatch_count", int, "sum"),
)
WIDTH = len(FIELDS)
_AT = {f.name: i for i, f in enumerate(FIELDS)}
FIRST = _AT["first_mismatch"]  # its column, which file_kernels.compare_mapped moves by a chunk's start

#: aggregates of one range of flat indices, as named tuple (what chunk_partial returns)
Partial = NamedTuple("Partial", [(f.name, f.kind) for f in FIELDS])
Partial.__doc__ = "Aggregates of one range of flat indices (comparison/partials.py's FIELDS)."


def partial_from(t: Iterable[Any], offset: int) -> Partial:
    """A kernel's tuple (FIELDS' order) as a Partial, its first mismatch moved by `offset`."""
    values = [f.kind(v) for f, v in zip(FIELDS, t)]
    first = _AT["first_mismatch"]
    if values[first] >= 0:
        values[first] += offset
    return Partial(*values)


def merge(partials: Iterable[Any]) -> Partial:
    """The partials of disjoint ranges of one pair (in any order) merged into one, by each field's rule."""
    rows = [p if isinstance(p, Partial) else Partial(*(f.kind(v) for f, v in zip(FIELDS, p))) for p in partials]
    out = []
    for i, f in enumerate(FIELDS):
        values = [r[i] for r in rows]
        if f.merge == "sum":
            out.append(sum(values))
        elif f.merge == "max":
            out.append(max(values, default=0.0))
        elif f.merge == "first":
            out.append(min((v for v in values if v >= 0), default=-1))
        else:
            out.append(_fsum(values))
    return Partial(*out)


def _fsum(xs: list[float]) -> float:
    """Exactly rounded sum; inf/NaN propagate (fsum would raise on inf + -inf)."""
    if not all(math.isfinite(x) for x in xs):
        return sum(xs)
    try:
        return math.fsum(xs)
    except OverflowError:  # a partial sum overflowed: add scaled values (inf if the total overflows)
        return math.fsum(x * 2.0**-64 for x in xs) * 2.0**64


NORMAL_MIN = sys.float_info.min  # the smallest normal float64: products below it are subnormal or zero


def _cosine(n: np.ndarray, dot: np.ndarray, sa: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """dot / (|a| |b|) over the elements where both values are finite, a pair a row: 1.0 when both norms
    are 0, 0.0 when exactly one is, NaN (no value) for an empty pair and where the float64 sums overflowed.
    sqrt(s*s) == s exactly, so identical arrays give exactly 1.0; where the product overflows or underflows
    (gradual underflow included: a subnormal product has lost digits, values of ~1e-80 gave a cosine of
    0.99998 for identical arrays) the norms are taken apart, keeping s where sa == sb."""
    with np.errstate(all="ignore"):
        prod = sa * sb
        fallback = np.where(sa == sb, sa, np.sqrt(sa) * np.sqrt(sb))
        denom = np.where((prod >= NORMAL_MIN) & (prod < np.inf), np.sqrt(prod), fallback)
        raw = dot / denom
    cos = np.clip(raw, -1.0, 1.0)
    cos[~(np.isfinite(sa) & np.isfinite(sb) & np.isfinite(dot) & np.isfinite(raw))] = np.nan
    cos[(sa == 0.0) | (sb == 0.0)] = 0.0
    cos[(sa == 0.0) & (sb == 0.0)] = 1.0
    cos[n == 0] = np.nan
    return cos


class Metric(NamedTuple):
    """A metric of a pair: its column in the results table, its Arrow type, and how its column is made from
    the merged partials (a float64 matrix, a pair a row, FIELDS' columns): `field`, that field's column as
    it is, or `of`, a function of the named fields' columns (+ 0.0 first: an exactly rounded sum of one
    value x is x + 0.0). A metric without a value holds -1 (a flat index) or NaN (a float)."""

    name: str
    arrow: str
    field: str | None = None
    of: Callable[..., np.ndarray] | None = None
    inputs: tuple[str, ...] = ()


_METRICS = (
    Metric("numel", "int64", "n"),
    Metric("equal_count", "int64", "equal_count"),
    Metric("first_mismatch_index", "int64", "first_mismatch"),
    Metric("max_abs_err", "float64", "max_abs_err"),
    Metric("max_rel_err", "float64", "max_rel_err"),
    Metric("within_1e3_count", "int64", "within_1e3"),
    Metric("within_1e2_count", "int64", "within_1e2"),
    Metric("cosine", "float64", of=_cosine, inputs=("n", "dot", "sum_sq_a", "sum_sq_b")),
    Metric("nan_mismatch_count", "int64", "nan_mismatch_count"),
)

#: the metrics of a pair with their Arrow type names (the columns of the kernel's results table that
#: key_data.sql and modules.sql read through pair_macros.sql)
METRICS: dict[str, str] = {m.name: m.arrow for m in _METRICS}
#: keys of the dict returned by rlprobe.comparison.pair_metrics.pair_metrics and combine()
METRIC_KEYS = tuple(METRICS)


def metric_columns(rows: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric of many pairs, a column each, from their merged partials (`rows`: a pair a row, FIELDS'
    columns, float64); -1 (a flat index) and NaN (a float) where a metric has no value."""
    out = {}
    for m in _METRICS:
        if m.field is not None:
            column = rows[:, _AT[m.field]]
        else:
            column = m.of(*(rows[:, _AT[name]] + 0.0 for name in m.inputs))
        out[m.name] = column.astype(np.int64) if m.arrow == "int64" else column
    return out


def metric_row(columns: dict[str, np.ndarray], i: int) -> dict[str, Any]:
    """Row `i` of metric_columns' columns as a dict of Python values, None where a metric has no value."""
    out = {}
    for name, kind in METRICS.items():
        value = columns[name][i].item()
        out[name] = None if (value < 0 if kind == "int64" else value != value) else value
    return out


def combine(partials: Iterable[Any]) -> dict[str, Any]:
    """Merge partial aggregates of disjoint ranges of one pair (in any order) into its metrics: a dict with
    the keys of METRIC_KEYS (numel, equal_count, first_mismatch_index: None when none, max_abs_err,
    max_rel_err, within_1e3_count, within_1e2_count, cosine: None for numel 0, nan_mismatch_count). Sums are
    added with math.fsum, so the result does not depend on the order of `partials`."""
    row = np.array([merge(partials)], np.float64)
    return metric_row(metric_columns(row), 0)


#: the compiled readers' per-file results (file_kernels.read_files: a row of 4 int64, status, dtype code, numel,
#: data offset in the buffer; file_kernels.compare_mapped: status, dtype code, numel, chunks)
OK, SLOW, BIG = 0, 1, 2
KINDS = "biuf"  # dtype code = index of the kind here * 16 + itemsize
F4, F8, I8 = 3 * 16 + 4, 3 * 16 + 8, 1 * 16 + 8
ALIGN = 64  # files start at multiples of this in the buffer
CODES = ("ALIGN", "BIG", "F4", "F8", "I8", "KINDS", "OK", "SLOW")
