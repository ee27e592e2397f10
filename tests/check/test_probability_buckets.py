"""The kernel's probability bucket (a table over float32 bit buckets, comparisons where a bucket
straddles a threshold) equals comparing every token with log(k/10), at and around the thresholds."""

from __future__ import annotations

import numpy as np
import pytest

from rlprobe.checks.compiled import reduce_pair
from rlprobe.checks.token_figures import N_PROBABILITY


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_probability_buckets_at_and_around_the_thresholds(dtype):
    thresholds = np.log(np.arange(1, N_PROBABILITY) / N_PROBABILITY)
    near = [np.nextafter(t.astype(dtype), np.array(d, dtype), dtype=dtype) if d else t.astype(dtype)
            for t in thresholds for d in (-np.inf, 0, np.inf)]
    rng = np.random.default_rng(1)
    a = np.concatenate([np.array(near, dtype), -rng.random(500).astype(dtype) * 30, np.array([0, -0.0, 1e-30, 5],
                                                                                            dtype)]).reshape(1, -1)
    f, _, _ = reduce_pair(a, a + dtype(0.001), 0.2)
    expected = (a.astype(np.float64).ravel()[:, None] >= thresholds).sum(axis=1)
    assert (f.prob_count == np.bincount(expected, minlength=N_PROBABILITY)).all()
    assert f.prob_count.sum() == a.size
