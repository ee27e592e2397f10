"""comparison/partials.py, the declaration of the partials and metrics: its layout is what the kernels
return, each field merges by its rule, and the columns of many pairs are combine()'s, pair by pair."""

from __future__ import annotations

import math

import numpy as np

from rlprobe.comparison import partials
from rlprobe.comparison.pair_metrics import pair_kernel as kernel_for
from rlprobe.comparison.partials import FIELDS, WIDTH, combine, merge, metric_columns, metric_row


def test_the_kernels_return_every_declared_field_in_order():
    x = np.array([1.0, 2.0, np.nan, 4.0], np.float32)
    y = np.array([1.0, 2.5, 3.0, 4.0], np.float32)
    got = kernel_for(np.dtype(np.float32))(x, y, 0, 4)
    assert len(got) == WIDTH
    named = dict(zip((f.name for f in FIELDS), got))
    assert named["n"] == 4 and named["equal_count"] == 2 and named["first_mismatch"] == 1
    assert named["nan_mismatch_count"] == 1 and named["max_abs_err"] == 0.5


def test_each_field_merges_by_its_rule():
    a = (4, 3, 2, 0.5, 0.25, 3, 4, 1.0, 2.0, 3.0, 0)
    b = (6, 6, -1, 0.0, 0.0, 6, 6, 1e16, 1.0, 1.0, 2)
    c = (2, 1, 9, 2.0, 0.125, 1, 2, -1e16, 0.0, 0.0, 1)
    m = merge([a, b, c])
    assert m.n == 12 and m.equal_count == 10 and m.first_mismatch == 2  # the smallest index that is one
    assert m.max_abs_err == 2.0 and m.max_rel_err == 0.25 and m.nan_mismatch_count == 3
    assert m.dot == math.fsum([1.0, 1e16, -1e16]) == 1.0  # exactly rounded, whatever the order
    assert merge([c, b, a]) == m
    assert merge([b]).first_mismatch == -1


def test_columns_of_many_pairs_hold_each_pairs_metrics():
    rng = np.random.default_rng(0)
    rows, pairs = np.zeros((64, WIDTH)), []
    for i in range(64):
        n = int(rng.integers(0, 5))
        x = rng.standard_normal(n)
        y = np.where(rng.random(n) < 0.5, x, rng.standard_normal(n) * rng.choice([0.0, 1.0, 1e-3]))
        rows[i] = kernel_for(np.dtype(np.float64))(x, y, 0, n)
        pairs.append((x, y))
    columns = metric_columns(rows)
    assert list(columns) == list(partials.METRICS)
    assert columns["first_mismatch_index"].dtype == np.int64 and columns["cosine"].dtype == np.float64
    for i, (x, y) in enumerate(pairs):
        got = metric_row(columns, i)
        assert got == combine([rows[i].tolist()])
        differ = np.flatnonzero(x != y)
        assert got["numel"] == x.size and got["equal_count"] == x.size - differ.size
        assert got["first_mismatch_index"] == (int(differ[0]) if differ.size else None)
        if x.size == 0:
            assert got["cosine"] is None
        elif not y.any():
            assert got["cosine"] == 0.0
        else:
            assert math.isclose(got["cosine"], float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)), rel_tol=1e-12)
