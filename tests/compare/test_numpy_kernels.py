"""rlprobe.comparison.numpy_kernels against the compiled kernels of pair_kernels: bit for bit on every
field below SEQUENTIAL_BELOW elements (NaN, infinities, -0.0, denormals, overflowing differences,
int64 extremes, empty chunks), and as an oracle for longer chunks. That a comparison of small
tensors never imports numba: tests/cli/test_startup_imports.py."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlprobe.comparison import numpy_kernels as nk
from rlprobe.comparison import pair_kernels as pk
from rlprobe.comparison.pair_metrics import chunk_partial, combine, pair_metrics
from rlprobe.comparison.partials import partial_from

S = nk.SEQUENTIAL_BELOW
F64 = np.finfo(np.float64)
F32 = np.finfo(np.float32)
I64 = np.iinfo(np.int64)
FLOAT_SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 5e-324, -5e-324, 2.2e-308, 1e-310,
                  1e-45, F32.tiny, F32.max, -F32.max, F64.max, -F64.max, 1e154, -1e154, 1e200, 3.0, 1.001,
                  1.0 + 1e-3, 1.0 + 1e-2, 0.999, 1e-3, 123456.789]
INT_SPECIALS = [0, 1, -1, I64.max, I64.min, I64.max - 1, I64.min + 1, 2**53, 2**53 + 1, -(2**53) - 1, 1000, 1001,
                999, 100, 101, 2**62, -(2**62)]


def bits(value) -> tuple:
    """A field as its exact bits: floats by their IEEE bytes (so -0.0 differs from 0.0, NaN equals NaN)."""
    if isinstance(value, (float, np.floating)):
        return ("f", struct.pack("<d", float(value)))
    return ("i", int(value))


def assert_bit_identical(got: tuple, want: tuple, where: str) -> None:
    assert len(got) == len(want) == 11
    for i, (g, w) in enumerate(zip(got, want)):
        assert bits(g) == bits(w), f"{where}: field {i}: numpy {g!r}, kernel {w!r}"


def kernel(a: np.ndarray, b: np.ndarray) -> tuple:
    return pk.kernel_for(a.dtype)(a, b, 0, a.shape[0])


def random_float_pair(rng: np.random.Generator, n: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Values from the specials and random magnitudes; b mixes equal, near, far and special elements."""
    pick = rng.integers(0, 4, n)
    a = np.where(pick == 0, rng.choice(FLOAT_SPECIALS, n), rng.standard_normal(n) * 10.0 ** rng.uniform(-40, 40, n))
    how = rng.integers(0, 5, n)
    with np.errstate(all="ignore"):
        near = a * (1.0 + rng.choice([1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 0.1], n) * rng.choice([-1, 1], n))
    b = np.select([how == 0, how == 1, how == 2], [a, near, rng.choice(FLOAT_SPECIALS, n)],
                  rng.standard_normal(n) * 10.0 ** rng.uniform(-40, 40, n))
    with np.errstate(all="ignore"):
        return a.astype(dtype), b.astype(dtype)


def random_int_pair(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    a = np.where(rng.integers(0, 3, n) == 0, rng.choice(INT_SPECIALS, n), rng.integers(I64.min, I64.max, n))
    how = rng.integers(0, 4, n)
    b = np.select([how == 0, how == 1, how == 2], [a, a + rng.integers(-3, 4, n), rng.choice(INT_SPECIALS, n)],
                  rng.integers(-1000, 1000, n))
    return a.astype(np.int64), b.astype(np.int64)


def test_the_kernel_and_numpy_share_one_threshold():
    assert pk._SEQUENTIAL_BELOW == nk.SEQUENTIAL_BELOW  # a literal in pair_kernels: numba's cache sees that file only


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_bit_identical_below_the_threshold(dtype):
    rng = np.random.default_rng(18)
    for trial in range(1500):
        n = int(rng.integers(0, S))
        a, b = random_float_pair(rng, n, dtype)
        assert_bit_identical(nk.float_partial(a, b), kernel(a, b), f"trial {trial}, n {n}, {a!r} vs {b!r}")


def test_int_bit_identical_at_any_length():
    rng = np.random.default_rng(81)
    for trial in range(800):
        n = int(rng.integers(0, 300))  # the int64 kernel adds in index order at any length
        a, b = random_int_pair(rng, n)
        assert_bit_identical(nk.int_partial(a, b), kernel(a, b), f"trial {trial}, n {n}, {a!r} vs {b!r}")


def test_special_cases_by_hand():
    """Each rule once, with the value numpy and the kernel must both give."""
    cases = {  # a, b -> (eq, first, max_abs, max_rel, within_1e3, within_1e2, nan_mismatch)
        "both NaN, same inf, -0.0": ([np.nan, np.inf, -0.0], [np.nan, np.inf, 0.0], (3, -1, 0.0, 0.0, 3, 3, 0)),
        "NaN against a number": ([np.nan, 1.0], [2.0, 1.0], (1, 0, 0.0, 0.0, 1, 1, 1)),
        "inf against finite": ([1.0, np.inf], [1.0, 5.0], (1, 1, np.inf, 1.0, 1, 1, 0)),
        "+inf against -inf": ([np.inf], [-np.inf], (0, 0, np.inf, 2.0, 0, 0, 0)),
        "overflowing difference": ([F64.max], [-F64.max], (0, 0, np.inf, 2.0, 0, 0, 0)),
        "denormals": ([5e-324, 1e-310], [1e-323, 1e-310], (1, 0, 5e-324, 0.5, 1, 1, 0)),
        "within 1e-3, not 1e-3": ([1000.0, 1000.0], [1001.0, 1000.5], (0, 0, 1.0, 1.0 / 1001.0, 2, 2, 0)),
        "empty": ([], [], (0, -1, 0.0, 0.0, 0, 0, 0)),
    }
    for name, (a, b, want) in cases.items():
        a, b = np.array(a, np.float64), np.array(b, np.float64)
        got = nk.float_partial(a, b)
        assert_bit_identical(got, kernel(a, b), name)
        assert (got[1], got[2], got[3], got[4], got[5], got[6], got[10]) == want, name


def test_int64_extremes_by_hand():
    a = np.array([I64.min, I64.max, 0, 2**53 + 1], np.int64)
    b = np.array([I64.max, I64.min, 0, 2**53], np.int64)
    got = nk.int_partial(a, b)
    assert_bit_identical(got, kernel(a, b), "int64 extremes")
    assert got[1] == 1 and got[2] == 0 and got[3] == float(2**64 - 1) and got[4] == 2.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_is_an_oracle_for_longer_chunks(dtype):
    """Above the threshold the kernel may reassociate the sums of all-finite blocks; every other
    field still agrees bit for bit, and the sums agree too where every block of 2048 holds a NaN
    (the kernel adds each block in index order, then the block sums in order)."""
    rng = np.random.default_rng(7)
    for n in (S, S + 1, 2047, 2048, 2049, 5000):
        a, b = random_float_pair(rng, n, dtype)
        got, want = nk.float_partial(a, b), kernel(a, b)
        assert_bit_identical(got[:7] + (0.0, 0.0, 0.0) + got[10:], want[:7] + (0.0, 0.0, 0.0) + want[10:], f"n {n}")
        np.testing.assert_allclose(got[7:10], want[7:10], rtol=1e-12)
        a[::2000] = np.nan  # a NaN in every block of 2048: the kernel's exact, in-order path
        got, want = nk.float_partial(a, b), kernel(a, b)
        sums = [0.0, 0.0, 0.0]
        for start in range(0, n, 2048):
            block = nk.float_partial(a[start:start + 2048], b[start:start + 2048])
            sums = [s + v for s, v in zip(sums, block[7:10])]
        assert_bit_identical(got[:7] + tuple(sums) + got[10:], want, f"n {n} with NaNs")


float_values = st.one_of(st.sampled_from(FLOAT_SPECIALS), st.floats(allow_nan=True, allow_infinity=True))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(float_values, float_values), max_size=S - 1), st.sampled_from([np.float32, np.float64]))
def test_property_float(pairs, dtype):
    with np.errstate(all="ignore"):
        a = np.array([p[0] for p in pairs], np.float64).astype(dtype)
        b = np.array([p[1] for p in pairs], np.float64).astype(dtype)
    assert_bit_identical(nk.float_partial(a, b), kernel(a, b), f"{a!r} vs {b!r}")


int_values = st.one_of(st.sampled_from(INT_SPECIALS), st.integers(I64.min, I64.max))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(int_values, int_values), max_size=100))
def test_property_int(pairs):
    a = np.array([p[0] for p in pairs], np.int64)
    b = np.array([p[1] for p in pairs], np.int64)
    assert_bit_identical(nk.int_partial(a, b), kernel(a, b), f"{a!r} vs {b!r}")


DTYPE_PAIRS = [(np.float16, np.float16), (np.float16, np.float32), (np.float32, np.float64), (np.int32, np.int64),
               (np.bool_, np.bool_), (np.uint8, np.int16), (np.int64, np.float32), (np.uint64, np.int64)]


@pytest.mark.parametrize("dtype_a,dtype_b", DTYPE_PAIRS)
def test_every_dtype_pair_through_chunk_partial(dtype_a, dtype_b):
    """chunk_partial converts, then numpy (short chunk) or the kernel (long one): the short chunk's
    result is the kernel's on the same converted arrays."""
    rng = np.random.default_rng(3)
    for n in (0, 1, 5, S - 1):
        a = np.abs(rng.standard_normal(n) * 50).astype(dtype_a)  # uint64 above 2**63 has its own exact path
        b = np.where(rng.random(n) < 0.5, a, np.abs(rng.standard_normal(n) * 50)).astype(dtype_b)
        got = chunk_partial(a, b)
        target = np.result_type(np.float32 if a.dtype.kind == b.dtype.kind == "f" and max(a.itemsize, b.itemsize) <= 4
                                else np.float64 if "f" in (a.dtype.kind, b.dtype.kind) else np.int64)
        want = partial_from(kernel(a.astype(target), b.astype(target)), 0)  # the fields' own types
        assert_bit_identical(tuple(got), tuple(want), f"{dtype_a.__name__} vs {dtype_b.__name__}, n {n}")


def test_pair_metrics_of_a_small_pair_equals_the_kernel_split_on_short_chunks():
    """A tensor compared in chunks shorter than the threshold (numpy each) equals the kernel's chunks."""
    rng = np.random.default_rng(5)
    a, b = random_float_pair(rng, 300, np.float32)
    c = S - 1
    kernel_partials = [tuple(pk.kernel_for(a.dtype)(a[s:s + c], b[s:s + c], 0, len(a[s:s + c])))
                       for s in range(0, 300, c)]
    kernel_partials = [(p[0], p[1], p[2] + s if p[2] >= 0 else -1) + p[3:]
                       for p, s in zip(kernel_partials, range(0, 300, c))]
    got, want = pair_metrics(a, b, chunk=c), combine(kernel_partials)
    assert [bits(got[k]) if got[k] is not None else None for k in got] == \
        [bits(want[k]) if want[k] is not None else None for k in want]

