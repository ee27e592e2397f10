"""The token kernel against numpy on random pairs with a mask."""

from __future__ import annotations

import numpy as np
import pytest

from rlprobe.checks.compiled import reduce_pair
from rlprobe.checks.token_figures import N_POSITIONS, PairFigures


def delta_bins(d: np.ndarray) -> np.ndarray:
    """The histogram bin of each float64 Δ: the sign, exponent and top 6 mantissa bits of Δ rounded toward
    zero to float32, i.e. the bin whose range holds Δ itself."""
    near = d.astype(np.float32)
    bits = near.view(np.uint32) - (np.abs(near.astype(np.float64)) > np.abs(d))
    return bits >> 17


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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_wide_rows_every_position_bucket_and_nonfinite_tokens_equal_numpy(dtype):
    """Rows wider than the last position bucket's start, non-finite Δ inside and outside the mask,
    a row with no counted token: every figure the two passes of the kernel produce, against numpy."""
    rng = np.random.default_rng(11)
    a = (-rng.random((5, 9000)) * 6).astype(dtype)
    b = (a + rng.normal(0, 0.02, a.shape)).astype(dtype)
    b[1, ::7] = a[1, ::7]  # runs of Δ = 0
    b[0, 3], b[2, 8191], b[3, 0] = np.nan, np.inf, -np.inf
    mask = rng.random(a.shape) > 0.25
    mask[4] = False
    mask[0, 3] = mask[2, 8191] = True
    mask[3, 0] = False  # a non-finite Δ outside the mask is not counted at all
    f, seq_sum, seq_n = reduce_pair(a, b, 0.05, mask)
    d = b.astype(np.float64) - a.astype(np.float64)
    counted = mask & np.isfinite(d)
    dm = d[counted]
    assert f.tokens == dm.size and f.nonfinite == 2
    assert f.sum_delta == pytest.approx(dm.sum(), rel=1e-12)
    assert f.sum_sq == pytest.approx((dm * dm).sum(), rel=1e-12)
    assert f.sum_abs == pytest.approx(np.abs(dm).sum(), rel=1e-12)
    assert f.max_abs == np.abs(dm).max()
    assert f.outside == np.count_nonzero((dm < np.log(0.95)) | (dm > np.log(1.05)))
    assert seq_sum == pytest.approx(np.where(counted, d, 0).sum(axis=1), rel=1e-12, abs=1e-15)
    assert (seq_n == counted.sum(axis=1)).all() and seq_n[4] == 0
    bins = delta_bins(d)[counted]
    assert (f.hist == np.bincount(bins, minlength=f.hist.size)).all()
    positions = np.broadcast_to(np.arange(a.shape[1]), a.shape)[counted]
    bucket = np.minimum(np.where(positions == 0, 0, np.floor(np.log2(np.maximum(positions, 1))) + 1),
                        N_POSITIONS - 1).astype(int)
    assert (f.pos_count == np.bincount(bucket, minlength=N_POSITIONS)).all()
    assert f.pos_sum == pytest.approx(np.bincount(bucket, np.abs(dm), minlength=N_POSITIONS), rel=1e-12)
    assert (f.pos_max == [np.abs(dm)[bucket == k].max(initial=0.0) for k in range(N_POSITIONS)]).all()
    prob = (a.astype(np.float64)[counted][:, None] >= np.log(np.arange(1, 10) / 10)).sum(axis=1)
    assert (f.prob_count == np.bincount(prob, minlength=10)).all()
    assert f.prob_sum == pytest.approx(np.bincount(prob, np.abs(dm), minlength=10), rel=1e-12)


def test_figures_added_into_one_set_equal_each_pair_alone_and_clear_resets_them():
    rng = np.random.default_rng(4)
    pairs = [(-rng.random((3, 300), dtype=np.float32), rng.random((3, 300)) > 0.5) for _ in range(3)]
    together = PairFigures()
    alone = []
    for a, mask in pairs:
        b = a + rng.normal(0, 0.01, a.shape).astype(np.float32)
        reduce_pair(a, b, 0.2, mask, into=together)
        alone.append(reduce_pair(a, b, 0.2, mask)[0])
    assert together.tokens == sum(f.tokens for f in alone)
    assert (together.hist == sum(f.hist for f in alone)).all()
    assert (together.prob_count == sum(f.prob_count for f in alone)).all()
    assert together.sum_abs == pytest.approx(sum(f.sum_abs for f in alone), rel=1e-12)
    together.clear(np.flatnonzero(together.hist))
    fresh = PairFigures()
    for name in ("tokens", "sum_delta", "sum_sq", "sum_abs", "max_abs", "outside", "nonfinite"):
        assert getattr(together, name) == getattr(fresh, name), name
    for name in ("hist", "pos_count", "pos_sum", "pos_max", "prob_count", "prob_sum"):
        assert not getattr(together, name).any(), name


def test_quantiles_bin_the_difference_itself_not_float32_operands():
    """A float64 pair whose Δ lies below float32's resolution of the log-probs (1e-10 on -1.0: the
    operands rounded to float32 are equal), and a float32 pair whose Δ rounds up to a power of two in
    float32 (2 - 2**-30): each token lands in the bin that holds its Δ, so every quantile is the upper
    edge of that bin, within 1/64 above the exact value (it read 1.8e-40 for the first, 1/64 + 5e-10
    above for the second when Δ was taken in float32)."""
    rng = np.random.default_rng(19)
    a = -rng.random((4, 500)) * 3
    tiny = rng.random(a.shape) * 1e-9 * np.where(rng.random(a.shape) < 0.5, -1, 1)
    cases = [(a, a + tiny),
             (np.array([[2.0 ** -30] * 3 + [0.0]], np.float32), np.array([[2.0] * 3 + [10.0]], np.float32))]
    for a, b in cases:
        f, _, _ = reduce_pair(a, b, 0.2)
        d = b.astype(np.float64) - a.astype(np.float64)
        assert (f.hist == np.bincount(delta_bins(d.ravel()), minlength=f.hist.size)).all()
        for q in (0.5, 0.9, 0.99):
            exact = np.quantile(np.abs(d), q, method="inverted_cdf")
            assert exact <= f.quantile(q) <= exact * (1 + 1 / 64), (q, exact, f.quantile(q))
