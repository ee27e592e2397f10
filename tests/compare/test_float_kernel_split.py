"""The float kernel after its vectorized loop was split (issue 18: the rel-err division only in blocks
that differ, no separate pass looking for NaN and infinities) gives the same bits as before on every
field, the reassociated dot and square sums included: float_kernel_before.py is the old kernel, verbatim."""

from __future__ import annotations

import math

import numpy as np
import pytest
from float_kernel_before import float_kernel_before
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlprobe.comparison.pair_kernels import kernel_for

# lengths around the block (2048) and vector (8) boundaries, tails of every remainder, several blocks
LENGTHS = [8, 9, 15, 16, 17, 31, 33, 100, 2047, 2048, 2049, 4095, 4096, 4100, 6144 + 13]


def _bits(result: tuple) -> list:
    """Each field exactly, by its hex form as a float (so -0.0, NaN and the last bit count; the kernel before
    returned its counts as int, which are exact in float64)."""
    return [float(v).hex() for v in result]


def _same(a: np.ndarray, b: np.ndarray, start: int = 0, stop: int | None = None) -> None:
    stop = a.size if stop is None else stop
    a.flags.writeable = False
    b.flags.writeable = False
    new = kernel_for(a.dtype)(a, b, start, stop)
    old = float_kernel_before(a, b, start, stop)
    assert _bits(new) == _bits(old), (a.dtype, a.size, start, stop, new, old)


def _pair(rng: np.random.Generator, n: int, dtype, kind: str) -> tuple[np.ndarray, np.ndarray]:
    a = rng.standard_normal(n).astype(dtype) * dtype(rng.choice([1e-30, 1e-3, 1.0, 1e5]))
    if kind == "equal":
        b = a.copy()
    elif kind == "close":
        b = (a * (1 + rng.standard_normal(n) * 1e-4)).astype(dtype)
    elif kind == "apart":
        b = rng.standard_normal(n).astype(dtype)
    else:  # "few": mostly equal, a few elements differ (in one block only, or several)
        b = a.copy()
        idx = rng.integers(0, n, size=max(1, n // 700))
        b[idx] = b[idx] + dtype(1e-3)
    return a, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["equal", "close", "apart", "few"])
def test_same_bits_as_before_on_finite_values(dtype, kind):
    rng = np.random.default_rng(hash((dtype.__name__, kind)) % 2**32)
    for n in LENGTHS:
        for _ in range(3):
            a, b = _pair(rng, n, dtype, kind)
            _same(a, b)
            if n > 40:
                _same(a, b, 5, n - 3)  # a range that starts and ends inside blocks


SPECIAL = [math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, 1e-310, 1.5e308, -1.5e308, 3.4e38, -3.4e38, 1e-45]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_same_bits_as_before_with_special_values(dtype):
    """NaN, infinities, -0.0, denormals, differences that overflow float64: a block holding one is
    redone element by element before and after, told apart the same way."""
    rng = np.random.default_rng(7)
    with np.errstate(over="ignore"):
        special = np.array(SPECIAL).astype(dtype)
    for n in LENGTHS:
        for trial in range(12):
            a, b = _pair(rng, n, dtype, ["equal", "close", "apart", "few"][trial % 4])
            for arr in (a, b)[: 1 + trial % 2]:
                where = rng.integers(0, n, size=1 + trial % 3)
                arr[where] = rng.choice(special, size=where.size)
            _same(a, b)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.floats(width=32), st.floats(width=32)), min_size=8, max_size=300),
       st.integers(0, 7))
def test_same_bits_as_before_property(values, shift):
    """Any float32 values (hypothesis' floats: NaN, infinities, signed zeros, denormals, extremes)."""
    a = np.array([v[0] for v in values], np.float32)
    b = np.array([v[1] for v in values], np.float32)
    _same(a, b, min(shift, a.size), a.size)
    _same(a, a.copy())
    with np.errstate(over="ignore"):
        big = b.astype(np.float64) * 1e300
    _same(a.astype(np.float64), big)
