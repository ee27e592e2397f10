"""The token kernel against numpy on random pairs with a mask."""

from __future__ import annotations

import numpy as np
import pytest

from rlprobe.check.token_kernel import N_POSITIONS, reduce_pair


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_figures_equal_numpy(dtype):
    rng = np.random.default_rng(3)
    a = -rng.random((7, 40)).astype(dtype) * 4
    b = a + rng.normal(0, 0.05, a.shape).astype(dtype)
    b[0, 0] = a[0, 0]  # a zero Δ has a bin of its own
    mask = rng.random(a.shape) > 0.2
    f, seq_sum, seq_n = reduce_pair(a, b, 0.1, mask)
    d = (b.astype(np.float64) - a)
    dm = d[mask]
    assert f.tokens == dm.size and f.nonfinite == 0
    assert f.sum_abs / f.tokens == pytest.approx(np.abs(dm).mean(), rel=1e-12)
    assert f.max_abs == np.abs(dm).max()
    assert f.outside == np.count_nonzero((np.exp(dm) < 0.9) | (np.exp(dm) > 1.1))
    assert seq_sum == pytest.approx(np.where(mask, d, 0).sum(axis=1), rel=1e-12, abs=1e-15)
    assert (seq_n == mask.sum(axis=1)).all()
    assert f.hist.sum() == dm.size and f.hist[: f.hist.size // 2].sum() == np.count_nonzero(dm >= 0)
    for q in (0.5, 0.9, 0.99):
        exact = np.quantile(np.abs(dm), q, method="inverted_cdf")
        assert exact <= f.quantile(q) <= exact * (1 + 1 / 64) + 1e-15
    positions = np.broadcast_to(np.arange(a.shape[1]), a.shape)[mask]
    bucket = np.where(positions == 0, 0, np.minimum(np.floor(np.log2(np.maximum(positions, 1))) + 1, N_POSITIONS - 1))
    assert (f.pos_count[:7] == np.bincount(bucket.astype(int), minlength=7)[:7]).all()
    prob = np.minimum((np.exp(a.astype(np.float64)[mask]) * 10).astype(int), 9)
    assert (f.prob_count == np.bincount(prob, minlength=10)).all()


def test_non_finite_deltas_are_counted_apart_and_shapes_must_match():
    a = np.zeros((2, 3), np.float32)
    b = a.copy()
    b[1, 2] = np.nan
    f, _, _ = reduce_pair(a, b, 0.2)
    assert f.nonfinite == 1 and f.tokens == 5
    with pytest.raises(ValueError, match="shapes differ"):
        reduce_pair(a, np.zeros((3, 2), np.float32), 0.2)
