"""The CPU gradient kernel against numpy, element by element: max/min (from the bits' integer
extremes), norm, zero count, x <= bound counts and the packed signs, for any float32/float64
array, special values included, and at every length around the chunk and byte boundaries."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from rlprobe.frameworks.cpu_grad_kernel import _CHUNK, stats_into

BOUNDS = np.array([-1.0, -1e-3, 0.0, 1e-3, 1.0], np.float64)


def _check(x: np.ndarray, bounds: np.ndarray = BOUNDS) -> None:
    nb = bounds.size
    row = np.full(4 + nb, -7.0)
    signs = np.full((x.size + 7) // 8 + 3, 0xAA, np.uint8)  # guard bytes around the range
    stats_into(x, bounds, row, signs, 1)
    assert signs[0] == 0xAA and (signs[1 + (x.size + 7) // 8:] == 0xAA).all()
    np.testing.assert_array_equal(signs[1:1 + (x.size + 7) // 8], np.packbits(x > 0))
    if np.isnan(x).any():
        assert np.isnan(row[:3]).all()
    else:
        assert row[0] == x.max() and row[1] == x.min()
        # -0.0 sorts below +0.0
        if row[0] == 0:
            assert np.signbit(row[0]) == (not (x == 0)[~np.signbit(x)].any())
        if row[1] == 0:
            assert np.signbit(row[1]) == bool(np.signbit(x[x == 0]).any())
        with np.errstate(over="ignore"):
            want = float(x.dtype.type(np.sqrt(np.sum(x.astype(np.float64) ** 2))))
        assert row[2] == pytest.approx(want, rel=1e-6) or (np.isinf(want) and row[2] == want)
    assert row[3] == np.count_nonzero(x == 0)
    for j, b in enumerate(bounds.astype(x.dtype)):
        assert row[4 + j] == np.count_nonzero(x <= b)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(st.sampled_from([np.float32, np.float64]), st.integers(1, 3 * _CHUNK + 9),
                  elements=st.floats(allow_nan=True, allow_infinity=True, width=32)))
def test_matches_numpy(x):
    _check(x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("values", [
    [-3.0, -0.5, -2.0],  # all negative: max is the negative of smallest magnitude
    [0.25, 4.0, 1.0],  # all positive
    [-0.0], [0.0], [0.0, -0.0], [-0.0, -1.0], [0.0, 1.0, -0.0],
    [np.inf, -np.inf, 1.0], [-np.inf], [np.inf],
    [np.nan, 1.0], [-np.nan, -1.0],
    [1e-45, -1e-45], [np.finfo(np.float32).max, -np.finfo(np.float32).max],
])
def test_special_values(dtype, values):
    _check(np.array(values, dtype))


@pytest.mark.parametrize("n", [1, 7, 8, 9, _CHUNK - 1, _CHUNK, _CHUNK + 1, 2 * _CHUNK + 5])
def test_lengths_around_chunk_and_byte_edges(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    x[::5] = 0
    x[1::7] = -0.0
    _check(x)
    _check(-np.abs(x) - 1)  # no non-negative value at all
