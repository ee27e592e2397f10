"""Element-wise pair metrics: the compiled kernels against a plain numpy reference, and the executor."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlprobe.comparison.executor import PairError, PairTask, run_pairs
from rlprobe.comparison.npy_files import NpyFile
from rlprobe.comparison.pair_metrics import (
    METRIC_KEYS,
    ArraySource,
    Partial,
    chunk_partial,
    combine,
    common_dtype,
    pair_metrics,
    range_partials,
    ranges,
)

# --------------------------------------------------------------------------------------
# the reference: straightforward numpy, float64, explicit masks


def reference(a, b) -> dict:
    a = np.asarray(a).reshape(-1)
    b = np.asarray(b).reshape(-1)
    assert a.size == b.size
    n = a.size
    if a.dtype.kind in "biu" and b.dtype.kind in "biu":
        # exact integer equality and exact differences through Python ints
        ia, ib = a.astype(object), b.astype(object)
        x, y = a.astype(np.float64), b.astype(np.float64)
        equal = np.asarray(ia == ib, dtype=bool)
        d = np.abs(ia - ib).astype(np.float64) if n else np.zeros(0)
        nan_mis = np.zeros(n, dtype=bool)
        m = np.maximum(np.abs(x), np.abs(y))
        numeric = ~equal
        inf_case = np.zeros(n, dtype=bool)
        fin_case = numeric
        rel = np.zeros(n)
        rel[fin_case] = d[fin_case] / m[fin_case]
    else:
        x, y = a.astype(np.float64), b.astype(np.float64)
        nan_x, nan_y = np.isnan(x), np.isnan(y)
        equal = (x == y) | (nan_x & nan_y)
        nan_mis = nan_x ^ nan_y
        numeric = ~equal & ~nan_mis
        with np.errstate(over="ignore", invalid="ignore"):
            m = np.maximum(np.abs(x), np.abs(y))
            d = np.abs(x - y)
        inf_case = numeric & np.isinf(m)
        fin_case = numeric & ~np.isinf(m)
        rel = np.zeros(n)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            plain = fin_case & np.isfinite(d)
            rel[plain] = d[plain] / m[plain]
            over = fin_case & ~np.isfinite(d)  # difference of two finite float64s overflowed
            rel[over] = np.abs(x[over] / m[over] - y[over] / m[over])
        rel[inf_case] = np.where(np.isinf(x[inf_case]) & np.isinf(y[inf_case]), 2.0, 1.0)
    mism = ~equal
    max_abs = 0.0
    if fin_case.any():
        max_abs = float(d[fin_case].max())
    if inf_case.any():
        max_abs = math.inf
    within3 = equal | (fin_case & (d <= 1e-3 * m))
    within2 = equal | (fin_case & (d <= 1e-2 * m))
    both_finite = np.isfinite(x) & np.isfinite(y)
    xf, yf = x[both_finite], y[both_finite]

    def total(v):
        if not np.isfinite(v).all():
            with np.errstate(invalid="ignore"):
                return float(np.sum(v))
        try:
            return math.fsum(v)
        except OverflowError:
            return math.fsum(v * 2.0**-64) * 2.0**64

    with np.errstate(over="ignore"):
        dot, sa, sb = total(xf * yf), total(xf * xf), total(yf * yf)
    if n == 0:
        cos = None
    elif sa == 0 and sb == 0:
        cos = 1.0
    elif sa == 0 or sb == 0:
        cos = 0.0
    else:
        cos = dot / (math.sqrt(sa) * math.sqrt(sb))
        cos = None if not math.isfinite(cos) or not math.isfinite(sa) or not math.isfinite(sb) else cos
    return {
        "numel": n,
        "equal_count": int(equal.sum()),
        "first_mismatch_index": int(np.argmax(mism)) if mism.any() else None,
        "max_abs_err": max_abs,
        "max_rel_err": float(rel.max()) if n else 0.0,
        "within_1e3_count": int(within3.sum()),
        "within_1e2_count": int(within2.sum()),
        "cosine": cos,
        "nan_mismatch_count": int(nan_mis.sum()),
    }


def assert_same(got: dict, want: dict, cos_rel=1e-9):
    assert set(got) == set(METRIC_KEYS)
    for k in METRIC_KEYS:
        if k == "cosine":
            if want[k] is None:
                assert got[k] is None
            else:
                assert got[k] == pytest.approx(want[k], rel=cos_rel, abs=1e-12), k
        else:
            assert got[k] == want[k], (k, got[k], want[k])
            assert type(got[k]) is type(want[k]), k


def random_pair(rng, n, dtype_a, dtype_b, special=True):
    """Two arrays that agree, nearly agree and disagree, with special values sprinkled in."""
    da, db = np.dtype(dtype_a), np.dtype(dtype_b)
    if da.kind in "biu" and db.kind in "biu":
        lo = max(np.iinfo(da).min if da.kind != "b" else 0, np.iinfo(db).min if db.kind != "b" else 0, -(10**6))
        hi = min(np.iinfo(da).max if da.kind != "b" else 1, np.iinfo(db).max if db.kind != "b" else 1, 10**6)
        a = rng.integers(lo, hi + 1, size=n)
        b = a.copy()
        sel = rng.random(n) < 0.3
        b[sel] = rng.integers(lo, hi + 1, size=int(sel.sum()))
        return a.astype(da), b.astype(db)
    scale = np.exp(rng.uniform(-8, 8, size=n))
    a = rng.standard_normal(n) * scale
    b = a.copy()
    kind = rng.integers(0, 5, size=n)
    b[kind == 1] *= 1 + rng.uniform(-5e-4, 5e-4, size=int((kind == 1).sum()))  # within 1e-3
    b[kind == 2] *= 1 + rng.uniform(-5e-3, 5e-3, size=int((kind == 2).sum()))  # within 1e-2
    b[kind == 3] = rng.standard_normal(int((kind == 3).sum()))  # far off
    if da.kind in "iu" or db.kind in "iu":
        a, b = np.round(a), np.round(b)
    if special:
        specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0])
        for arr in (a, b):
            sel = rng.random(n) < 0.05
            arr[sel] = rng.choice(specials, size=int(sel.sum()))
        both = rng.random(n) < 0.03  # the same special value on both sides
        v = rng.choice(specials, size=int(both.sum()))
        a[both], b[both] = v, v
    if da.kind in "iu":
        a = np.nan_to_num(a, nan=0, posinf=7, neginf=-7)
    if db.kind in "iu":
        b = np.nan_to_num(b, nan=0, posinf=7, neginf=-7)
    with np.errstate(over="ignore", invalid="ignore"):
        return a.astype(da), b.astype(db)


# --------------------------------------------------------------------------------------
# msprobe's formulas and element semantics


def msprobe_compare_arrays(array1, array2):
    """msprobe 8.1.2 SingleComparator.compare_arrays (same-shape case), as in MSPROBE_NOTES.md."""
    abs_error = np.abs(array1 - array2)
    max_abs_error = np.max(abs_error)
    with np.errstate(divide="ignore", invalid="ignore"):
        relative_error = np.abs(array1 - array2) / np.maximum(np.abs(array1), np.abs(array2))
    relative_error = np.nan_to_num(relative_error)
    same = np.sum(array1 == array2)
    total = array1.size
    mismatch = np.nonzero(array1.flatten() != array2.flatten())[0]
    thr3 = 0.001 * np.maximum(np.abs(array1), np.abs(array2))
    thr2 = 0.01 * np.maximum(np.abs(array1), np.abs(array2))
    return {
        "same_pct": same / total * 100,
        "first": int(mismatch[0]) if mismatch.size else None,
        "max_abs": float(max_abs_error),
        "max_rel": float(np.max(relative_error)),
        "w3_pct": np.sum(abs_error <= thr3) / total * 100,
        "w2_pct": np.sum(abs_error <= thr2) / total * 100,
    }


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_msprobe_example_by_hand(dtype):
    a = np.array([0, 1, 2, 100], dtype=dtype)
    b = np.array([0, 1, 2.001, 101], dtype=dtype)
    r = pair_metrics(a, b)
    assert r["numel"] == 4
    assert r["equal_count"] == 2  # same 50 %
    assert r["first_mismatch_index"] == 2
    assert r["max_abs_err"] == 1.0  # |100 - 101|
    assert r["max_rel_err"] == pytest.approx(1 / 101)  # 0.00990099...
    # |2 - 2.001| = 0.001 <= 0.001 * 2.001, |100 - 101| = 1 > 0.101 but <= 1.01
    assert r["within_1e3_count"] == 3  # 75 %
    assert r["within_1e2_count"] == 4  # 100 %
    assert r["nan_mismatch_count"] == 0
    ms = msprobe_compare_arrays(a, b)
    assert ms["same_pct"] == 50 and ms["first"] == 2 and ms["w3_pct"] == 75 and ms["w2_pct"] == 100


def test_msprobe_nan_inf_example_differs_by_design():
    # msprobe: same 50, first 2, max abs NaN, max rel 0.0099, within 50 / 66.67
    a = np.array([0, 1, np.nan, np.inf, 2, 100], dtype=np.float32)
    b = np.array([0, 1, np.nan, np.inf, 2.001, 101], dtype=np.float32)
    r = pair_metrics(a, b)
    assert r["equal_count"] == 4  # both-NaN and inf == inf are equal
    assert r["first_mismatch_index"] == 4
    assert r["max_abs_err"] == 1.0  # never NaN
    assert r["max_rel_err"] == pytest.approx(1 / 101)
    assert (r["within_1e3_count"], r["within_1e2_count"]) == (5, 6)


@pytest.mark.parametrize("seed", range(3))
def test_matches_msprobe_formulas_without_nan_inf(seed):
    rng = np.random.default_rng(seed)
    a, b = random_pair(rng, 5000, np.float64, np.float64, special=False)
    b[:100] = a[:100]
    r = pair_metrics(a, b)
    ms = msprobe_compare_arrays(a, b)
    assert r["equal_count"] / r["numel"] * 100 == ms["same_pct"]
    assert r["first_mismatch_index"] == ms["first"]
    assert r["max_abs_err"] == ms["max_abs"]
    assert r["max_rel_err"] == ms["max_rel"]
    assert r["within_1e3_count"] / r["numel"] * 100 == ms["w3_pct"]
    assert r["within_1e2_count"] / r["numel"] * 100 == ms["w2_pct"]
    # float32 data: msprobe computes in float32, rlprobe in float64
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    r = pair_metrics(a32, b32)
    ms = msprobe_compare_arrays(a32, b32)
    assert r["equal_count"] / r["numel"] * 100 == ms["same_pct"]
    assert r["first_mismatch_index"] == ms["first"]
    assert r["max_abs_err"] == pytest.approx(ms["max_abs"], rel=1e-6)
    assert r["max_rel_err"] == pytest.approx(ms["max_rel"], rel=1e-6)
    assert r["within_1e3_count"] / r["numel"] * 100 == pytest.approx(ms["w3_pct"], abs=0.05)
    assert r["within_1e2_count"] / r["numel"] * 100 == pytest.approx(ms["w2_pct"], abs=0.05)


def _msprobe_expected(fixtures_dir: Path, key: str):
    with open(fixtures_dir / "msprobe" / "keydata" / "expected" / f"{key}.csv", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))
    return rows[1:]


@pytest.mark.parametrize("key", ["log_prob", "responses", "kl_loss"])
def test_agrees_with_msprobe_output_on_fixtures(fixtures_dir, key):
    root = fixtures_dir / "msprobe" / "keydata"
    rows = _msprobe_expected(fixtures_dir, key)
    assert rows
    for step, rank, micro, _id, _s1, _s2, same, first, mabs, mrel, w3, w2 in rows:
        rel = Path("data") / key / f"step{step}" / f"rank{rank}" / f"micro_step{micro}" / f"{key}.npy"
        a, b = np.load(root / "run_a" / rel), np.load(root / "run_b" / rel)
        r = pair_metrics(a, b)
        n = r["numel"]
        assert r["equal_count"] / n * 100 == pytest.approx(float(same))
        assert r["first_mismatch_index"] == (None if first == "" else int(float(first)))
        assert r["max_abs_err"] == pytest.approx(float(mabs), rel=1e-6, abs=1e-12)
        assert r["max_rel_err"] == pytest.approx(float(mrel), rel=1e-6, abs=1e-12)
        assert r["within_1e3_count"] / n * 100 == pytest.approx(float(w3))
        assert r["within_1e2_count"] / n * 100 == pytest.approx(float(w2))


CASES = [
    # (a, b, equal, first, max_abs, max_rel, within_1e3, within_1e2, nan_mismatch)
    ([-0.0], [0.0], 1, None, 0.0, 0.0, 1, 1, 0),
    ([np.nan], [np.nan], 1, None, 0.0, 0.0, 1, 1, 0),
    ([np.nan], [1.0], 0, 0, 0.0, 0.0, 0, 0, 1),
    ([np.inf], [np.nan], 0, 0, 0.0, 0.0, 0, 0, 1),
    ([np.inf], [np.inf], 1, None, 0.0, 0.0, 1, 1, 0),
    ([-np.inf], [-np.inf], 1, None, 0.0, 0.0, 1, 1, 0),
    ([np.inf], [-np.inf], 0, 0, math.inf, 2.0, 0, 0, 0),
    ([5.0], [np.inf], 0, 0, math.inf, 1.0, 0, 0, 0),
    ([-np.inf], [0.0], 0, 0, math.inf, 1.0, 0, 0, 0),
    ([0.0, 1.0], [0.0, -1.0], 1, 1, 2.0, 2.0, 1, 1, 0),
    ([1e308], [-1e308], 0, 0, math.inf, 2.0, 0, 0, 0),  # difference overflows float64
    ([1.0, np.nan, 3.0], [1.0, 2.0, 3.0003], 1, 1, 3e-4, 3e-4 / 3.0003, 2, 2, 1),
]


@pytest.mark.parametrize("dtype,case", [(dt, c) for dt in (np.float32, np.float64) for c in CASES
                                        if dt == np.float64 or 1e308 not in c[0]])
def test_element_semantics(case, dtype):
    a, b, eq, first, mabs, mrel, w3, w2, nanmis = case
    r = pair_metrics(np.array(a, dtype=dtype), np.array(b, dtype=dtype))
    assert r["equal_count"] == eq
    assert r["first_mismatch_index"] == first
    tol = 1e-3 if dtype == np.float32 else 1e-12
    assert r["max_abs_err"] == pytest.approx(mabs, rel=tol)
    assert r["max_rel_err"] == pytest.approx(mrel, rel=tol)
    assert (r["within_1e3_count"], r["within_1e2_count"], r["nan_mismatch_count"]) == (w3, w2, nanmis)
    assert not math.isnan(r["max_abs_err"]) and not math.isnan(r["max_rel_err"])


def test_cosine_rules():
    assert pair_metrics(np.zeros(3), np.zeros(3))["cosine"] == 1.0
    assert pair_metrics(np.zeros(3), np.ones(3))["cosine"] == 0.0
    assert pair_metrics(np.zeros(0), np.zeros(0))["cosine"] is None
    assert pair_metrics(np.array([1.0, 2.0]), np.array([-1.0, -2.0]))["cosine"] == -1.0
    x = np.random.default_rng(1).standard_normal(10001)
    assert pair_metrics(x, x)["cosine"] == 1.0  # exactly, not 0.9999999999999998
    # only the elements where both are finite take part
    r = pair_metrics(np.array([1.0, np.nan, np.inf, 2.0]), np.array([1.0, 3.0, 4.0, 2.0]))
    assert r["cosine"] == 1.0


def test_int_semantics_exact():
    big = 2**62 + 1
    a = np.array([big, 5, -(2**63), 2**63 - 1, 0], dtype=np.int64)
    b = np.array([big + 1, 5, 2**63 - 1, 2**63 - 1, 0], dtype=np.int64)
    r = pair_metrics(a, b)
    assert r["equal_count"] == 3  # big vs big+1 differ although equal as float64
    assert r["first_mismatch_index"] == 0
    assert r["max_abs_err"] == float(2**64 - 1)  # no int64 overflow
    assert r["max_rel_err"] == pytest.approx(2.0)
    assert_same(r, reference(a, b))


def test_uint64_beyond_int64_is_exact():
    a = np.array([2**64 - 1, 2**63, 5, 1], dtype=np.uint64)
    b = np.array([2**64 - 2, 2**63, 5, 2], dtype=np.uint64)
    r = pair_metrics(a, b)
    assert (r["equal_count"], r["first_mismatch_index"], r["max_abs_err"]) == (2, 0, 1.0)
    assert_same(r, reference(a, b))
    r = pair_metrics(np.array([2**64 - 1, 3], dtype=np.uint64), np.array([-1, 3], dtype=np.int64))
    assert r["equal_count"] == 1 and r["first_mismatch_index"] == 0


# --------------------------------------------------------------------------------------
# against the reference on random data

DTYPE_PAIRS = [
    (np.float32, np.float32),
    (np.float64, np.float64),
    (np.int64, np.int64),
    (np.int16, np.int64),
    (np.float32, np.float64),
    (np.float16, np.float32),
    (np.float16, np.float16),
    (np.int32, np.float64),
    (np.uint8, np.int32),
    (np.bool_, np.bool_),
    (np.bool_, np.int8),
    (np.dtype(">f4"), np.float32),
    (np.dtype(">i8"), np.int64),
]


@pytest.mark.parametrize("dtype_a,dtype_b", DTYPE_PAIRS, ids=lambda d: np.dtype(d).str)
@pytest.mark.parametrize("chunk", [1, 7, 1 << 18])
def test_random_against_reference(dtype_a, dtype_b, chunk):
    rng = np.random.default_rng(hash((np.dtype(dtype_a).str, np.dtype(dtype_b).str, chunk)) % 2**32)
    n = 3000 if chunk == 1 else 20011
    a, b = random_pair(rng, n, dtype_a, dtype_b)
    assert_same(pair_metrics(a, b, chunk=chunk), reference(a, b))
    assert_same(pair_metrics(b, a, chunk=chunk), reference(b, a))
    assert_same(pair_metrics(a, a.copy(), chunk=chunk), reference(a, a))


def test_float64_extremes_against_reference():
    rng = np.random.default_rng(7)
    vals = np.array([1e308, -1e308, 1.7e308, 5e-324, -5e-324, 2.2e-308, 0.0, -0.0, np.inf, -np.inf, np.nan, 1.0])
    a = rng.choice(vals, size=5000)
    b = rng.choice(vals, size=5000)
    assert_same(pair_metrics(a, b), reference(a, b))


_BLOCK = 2048  # elements of a block of the float kernel (float_lanes.h)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_finite_and_special_blocks_mixed(dtype):
    """The float kernel takes a vectorized path for blocks of finite values and the exact one
    for a block with NaN/inf (or, in float64, an overflowing difference): every block layout
    gives the reference's metrics, the first mismatch included."""
    n = 5 * _BLOCK + 13
    rng = np.random.default_rng(3)
    a = rng.standard_normal(n).astype(dtype)
    b = a.copy()
    b[2 * _BLOCK + 100:] += dtype(1e-3)  # first mismatch in the third block
    b[3 * _BLOCK + 5] = np.nan  # a NaN mismatch in the fourth
    a[4 * _BLOCK + 1] = b[4 * _BLOCK + 1] = np.inf  # an equal infinity in the fifth
    if dtype == np.float64:
        a[-3], b[-3] = 1.7e308, -1.7e308  # the last block's difference overflows
    r = pair_metrics(a, b)
    assert_same(r, reference(a, b))
    assert r["first_mismatch_index"] == 2 * _BLOCK + 100
    assert r["nan_mismatch_count"] == 1
    same = pair_metrics(a, a.copy())
    assert same["equal_count"] == n and same["first_mismatch_index"] is None


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0, 2), ()])
def test_empty_and_scalar(shape):
    a = np.zeros(shape, dtype=np.float32)
    b = np.zeros(shape, dtype=np.float32)
    r = pair_metrics(a, b)
    assert_same(r, reference(a, b))
    if a.size == 0:
        assert r == {"numel": 0, "equal_count": 0, "first_mismatch_index": None, "max_abs_err": 0.0,
                     "max_rel_err": 0.0, "within_1e3_count": 0, "within_1e2_count": 0, "cosine": None,
                     "nan_mismatch_count": 0}
    assert combine([]) == pair_metrics(np.zeros(0), np.zeros(0))


def test_empty_arrays_of_other_shapes_and_int():
    assert pair_metrics(np.zeros((0, 4), np.int64), np.zeros(0, np.int16))["numel"] == 0


@pytest.mark.parametrize("chunk", [1, 7, 1000, 1 << 18])
def test_first_mismatch_in_a_later_chunk(chunk):
    a = np.arange(5000, dtype=np.float32)
    b = a.copy()
    b[4321] = -1
    b[4999] = np.nan
    r = pair_metrics(a, b, chunk=chunk)
    assert r["first_mismatch_index"] == 4321
    assert r["equal_count"] == 4998 and r["nan_mismatch_count"] == 1
    assert_same(r, reference(a, b))


def test_non_contiguous_inputs():
    rng = np.random.default_rng(3)
    a, b = random_pair(rng, 60 * 70, np.float64, np.float64)
    a, b = a.reshape(60, 70), b.reshape(60, 70)
    want = reference(a, b)
    for chunk in (1, 13, 70, 1 << 18):
        assert_same(pair_metrics(np.asfortranarray(a), b, chunk=chunk), want)
        assert_same(pair_metrics(a, np.asfortranarray(b), chunk=chunk), want)
    t = reference(a.T, b.T)
    assert_same(pair_metrics(a.T, b.T, chunk=11), t)
    assert_same(pair_metrics(a[:, ::3], b[:, ::3], chunk=9), reference(a[:, ::3].copy(), b[:, ::3].copy()))
    a3 = rng.standard_normal((5, 6, 7)).transpose(2, 0, 1)
    b3 = np.ascontiguousarray(a3) + (rng.random(a3.shape) < 0.1)
    assert_same(pair_metrics(a3, b3, chunk=4), reference(np.ascontiguousarray(a3), b3))
    assert_same(pair_metrics([1, 2, 3], [1, 2, 4]), reference(np.array([1, 2, 3]), np.array([1, 2, 4])))


def test_bad_inputs():
    with pytest.raises(ValueError, match="differ in size"):
        pair_metrics(np.zeros(3), np.zeros(4))
    with pytest.raises(TypeError, match="complex"):
        pair_metrics(np.zeros(3, np.complex64), np.zeros(3, np.complex64))
    with pytest.raises(TypeError):
        pair_metrics(np.array(["a"]), np.array(["b"]))
    with pytest.raises(ValueError):
        pair_metrics(np.zeros(3), np.zeros(3), chunk=0)
    with pytest.raises(ValueError):
        ranges(10, 0)


def test_common_dtype():
    assert common_dtype(np.int16, np.int64) == np.int64
    assert common_dtype(np.bool_, np.uint8) == np.int64
    assert common_dtype(np.float16, np.float32) == np.float32
    assert common_dtype(np.float32, np.float64) == np.float64
    assert common_dtype(np.int64, np.float32) == np.float64
    assert common_dtype(np.dtype(">f4"), np.float32) == np.float32


# --------------------------------------------------------------------------------------
# ranges, partials, combine


@pytest.mark.parametrize("numel,parts,align", [(0, 3, 1), (1, 5, 1), (10, 3, 1), (10, 3, 4), (100, 7, 8), (17, 17, 1),
                                               (1000, 1, 1), (1 << 20, 6, 1 << 18)])
def test_ranges_cover(numel, parts, align):
    rs = ranges(numel, parts, align=align)
    assert 1 <= len(rs) <= parts
    assert rs[0][0] == 0 and rs[-1][1] == numel
    for (s0, e0), (s1, _e1) in zip(rs, rs[1:]):
        assert e0 == s1 and s0 < e0 and s1 % align == 0
    sizes = [e - s for s, e in rs]
    if align == 1 and numel:
        assert max(sizes) - min(sizes) <= 1


def _split_partials(a, b, bounds, chunk):
    sa, sb = ArraySource(a), ArraySource(b)
    out = []
    for s, e in bounds:
        out.extend(range_partials(sa, sb, s, e, chunk))
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_aligned_split_is_bit_identical(dtype):
    rng = np.random.default_rng(11)
    a, b = random_pair(rng, 100_003, dtype, dtype)
    chunk = 4096
    whole = pair_metrics(a, b, chunk=chunk)
    for parts in (2, 3, 7, 25):
        bounds = ranges(a.size, parts, align=chunk)
        partials = _split_partials(a, b, bounds, chunk)
        rng.shuffle(partials)  # any order
        assert combine(partials) == whole
    assert_same(whole, reference(a, b))


def test_unaligned_split_equals_whole():
    rng = np.random.default_rng(12)
    a, b = random_pair(rng, 50_000, np.float64, np.float64)
    whole = pair_metrics(a, b)
    bounds = ranges(a.size, 7)
    assert_same(combine(_split_partials(a, b, bounds, 1 << 18)), whole, cos_rel=1e-12)


def test_partial_shapes():
    p = chunk_partial(np.array([1.0, 2.0, np.nan]), np.array([1.0, 3.0, 1.0]), offset=100)
    assert isinstance(p, Partial)
    assert p.n == 3 and p.equal_count == 1 and p.first_mismatch == 101 and p.nan_mismatch_count == 1
    # plain tuples are accepted too
    assert combine([tuple(p)]) == combine([p])


@st.composite
def _pairs_and_cuts(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int64, np.int8]))
    n = draw(st.integers(0, 300))
    if np.dtype(dtype).kind == "f":
        elems = st.floats(width=np.dtype(dtype).itemsize * 8, allow_nan=True, allow_infinity=True)
        small = st.sampled_from([0.0, -0.0, 1.0, -1.0, 1.0005, np.nan, np.inf, -np.inf])
        elems = st.one_of(elems, small)
    else:
        elems = st.integers(int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)) | st.integers(-2, 2)
    a = draw(hnp.arrays(dtype, n, elements=elems))
    mask = draw(hnp.arrays(np.bool_, n))
    other = draw(hnp.arrays(dtype, n, elements=elems))
    b = np.where(mask, a, other)
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
    chunk = draw(st.sampled_from([1, 3, 16, 1 << 18]))
    return a, b, cuts, chunk


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pairs_and_cuts())
def test_property_combine_over_random_splits(data):
    a, b, cuts, chunk = data
    whole = pair_metrics(a, b, chunk=chunk)
    bounds = list(zip([0, *cuts], [*cuts, a.size]))
    partials = _split_partials(a, b, bounds, chunk)
    partials.reverse()
    assert_same(combine(partials), whole, cos_rel=1e-12)
    assert_same(whole, reference(a, b), cos_rel=1e-9)


@pytest.mark.parametrize("scale", [8.45470208e-81, 1e-120, 1e-150])  # squares still normal (> 2.2e-308)
def test_tiny_values_keep_their_cosine_per_pair_and_in_batches(scale, tmp_path):
    """The product of two sums of squares of values near 1e-80 is subnormal and has lost digits: identical
    arrays had a cosine of 0.99998 (found by the property test above). Both the per-pair path and the
    batches of small files (small_pairs) now give the reference's cosine, and exactly 1.0 for equal arrays."""
    rng = np.random.default_rng(1)
    a = rng.random(64) * scale
    near = a * (1 + 1e-3 * rng.standard_normal(64))
    for x, y in ((a, a.copy()), (a, near), (a, -near)):
        assert pair_metrics(x, y)["cosine"] == pytest.approx(reference(x, y)["cosine"], rel=1e-9, abs=0), (x[0], y[0])
    assert pair_metrics(a, a.copy())["cosine"] == 1.0
    tasks = []
    for i in range(20):  # enough pairs for a batch
        pa, pb = tmp_path / f"a{i}.npy", tmp_path / f"b{i}.npy"
        np.save(pa, a * (i + 1))
        np.save(pb, (a if i % 2 else near) * (i + 1))
        tasks.append(PairTask(i, str(pa), str(pb)))
    batched = run_pairs(tasks, workers=1)
    for i, task in enumerate(tasks):
        alone = pair_metrics(np.load(task.path_a), np.load(task.path_b))["cosine"]
        assert batched[i]["cosine"] == alone, i  # the same bits as the per-pair path
        assert i % 2 == 0 or alone == 1.0


# --------------------------------------------------------------------------------------
# the executor on real .npy files


def _save(path: Path, arr) -> str:
    np.save(path, arr)
    return str(path)


@pytest.fixture
def npy_pairs(tmp_path):
    rng = np.random.default_rng(5)
    files = {}
    big_a, big_b = random_pair(rng, 300_007, np.float32, np.float32)
    files["big"] = (_save(tmp_path / "big_a.npy", big_a), _save(tmp_path / "big_b.npy", big_b))
    ia, ib = random_pair(rng, 5000, np.int64, np.int16)
    files["ints"] = (_save(tmp_path / "ia.npy", ia.reshape(50, 100)), _save(tmp_path / "ib.npy", ib.reshape(50, 100)))
    fa, fb = random_pair(rng, 4000, np.float32, np.float64)
    files["mixed"] = (_save(tmp_path / "fa.npy", fa), _save(tmp_path / "fb.npy", fb))
    ba, bb = random_pair(rng, 1000, np.bool_, np.bool_)
    files["bool"] = (_save(tmp_path / "ba.npy", ba), _save(tmp_path / "bb.npy", bb))
    files["fortran"] = (_save(tmp_path / "fo_a.npy", np.asfortranarray(big_a[:3000].reshape(30, 100))),
                        _save(tmp_path / "fo_b.npy", big_b[:3000].reshape(30, 100)))
    files["bigendian"] = (_save(tmp_path / "be_a.npy", big_a[:999].astype(">f4")), _save(tmp_path / "be_b.npy", big_b[:999]))
    files["empty"] = (_save(tmp_path / "e_a.npy", np.zeros((0, 5), np.float32)), _save(tmp_path / "e_b.npy", np.zeros(0)))
    files["scalar"] = (_save(tmp_path / "s_a.npy", np.float32(1.5)), _save(tmp_path / "s_b.npy", np.float32(1.5)))
    good = dict(files)
    # broken files
    raw = Path(files["big"][0]).read_bytes()
    (tmp_path / "truncated.npy").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "corrupt.npy").write_bytes(b"this is not a numpy file at all" * 10)
    (tmp_path / "empty_file.npy").write_bytes(b"")
    (tmp_path / "header_only.npy").write_bytes(raw[:40])
    np.savez(tmp_path / "archive.npz", x=np.zeros(3))
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    np.save(tmp_path / "complex.npy", np.zeros(3, np.complex64))
    np.save(tmp_path / "three.npy", np.zeros(3))
    files["truncated"] = (str(tmp_path / "truncated.npy"), files["big"][1])
    files["corrupt"] = (files["mixed"][0], str(tmp_path / "corrupt.npy"))
    files["empty_file"] = (str(tmp_path / "empty_file.npy"), files["mixed"][1])
    files["header_only"] = (str(tmp_path / "header_only.npy"), files["mixed"][1])
    files["missing"] = (str(tmp_path / "nope.npy"), files["mixed"][1])
    files["npz"] = (str(tmp_path / "archive.npz"), str(tmp_path / "three.npy"))
    files["objects"] = (str(tmp_path / "objects.npy"), files["mixed"][1])
    files["complex"] = (str(tmp_path / "complex.npy"), str(tmp_path / "three.npy"))
    files["shape"] = (files["mixed"][0], files["ints"][0])
    return files, good


EXPECTED_ERRORS = {
    "truncated": ("truncated.npy", "truncated"),
    "corrupt": ("corrupt.npy", "not a .npy file"),
    "empty_file": ("empty_file.npy", "empty file"),
    "header_only": ("header_only.npy", "header"),
    "missing": ("nope.npy", "not found"),
    "npz": ("archive.npz", "npz"),
    "objects": ("objects.npy", "Python objects"),
    "complex": ("complex.npy", "complex64"),
    "shape": ("shape mismatch", "5000 elements"),
}


@pytest.mark.parametrize("io", ["pread", "mmap"])
@pytest.mark.parametrize("workers", [1, 3])
def test_run_pairs_results_and_errors(npy_pairs, io, workers):
    files, good = npy_pairs
    tasks = [PairTask(name, a, b) for name, (a, b) in files.items()]
    seen = []
    results = run_pairs(tasks, workers=workers, io=io, split_elements=50_000, chunk=8192,
                        progress=lambda done, total: seen.append((done, total)))
    assert set(results) == set(files)
    for name, (a, b) in good.items():
        want = pair_metrics(np.load(a), np.load(b), chunk=8192)
        assert results[name] == want, name
        assert_same(results[name], reference(np.load(a), np.load(b)))
    for name, (needle1, needle2) in EXPECTED_ERRORS.items():
        err = results[name].get("error")
        assert err and set(results[name]) == {"error"}, (name, results[name])
        assert needle1 in err and needle2 in err, (name, err)
    total = sum(os.path.getsize(p) for pair in files.values() for p in pair if os.path.exists(p))
    assert seen and seen[-1] == (total, total)
    assert all(d1 <= d2 for (d1, _), (d2, _) in zip(seen, seen[1:]))


def test_run_pairs_split_matches_one_shot(npy_pairs):
    files, _ = npy_pairs
    a, b = files["big"]
    one = run_pairs([PairTask("x", a, b)], workers=1)["x"]
    for workers, split in ((2, 10_000), (4, 65_536), (3, 1)):
        assert run_pairs([PairTask("x", a, b)], workers=workers, split_elements=split)["x"] == one
    assert one == pair_metrics(np.load(a), np.load(b))


def test_run_pairs_arguments(npy_pairs):
    files, _ = npy_pairs
    a, b = files["mixed"]
    assert run_pairs([]) == {}
    with pytest.raises(ValueError, match="duplicate"):
        run_pairs([PairTask(1, a, b), PairTask(1, a, b)])
    with pytest.raises(ValueError):
        run_pairs([PairTask(1, a, b)], workers=0)
    with pytest.raises(ValueError):
        run_pairs([PairTask(1, a, b)], io="magic")
    r = run_pairs([PairTask(1, Path(a), Path(b))])  # path-like objects work too
    assert r[1]["numel"] == 4000


def test_run_pairs_many_small_pairs(tmp_path):
    rng = np.random.default_rng(9)
    tasks, want = [], {}
    for i in range(200):
        a, b = random_pair(rng, int(rng.integers(0, 300)), np.float32, np.float32)
        tasks.append(PairTask(i, _save(tmp_path / f"{i}a.npy", a), _save(tmp_path / f"{i}b.npy", b)))
        want[i] = pair_metrics(a, b)
    assert run_pairs(tasks, workers=4) == want


def test_file_truncated_while_being_read(tmp_path):
    path = _save(tmp_path / "x.npy", np.arange(100_000, dtype=np.float64))
    f = NpyFile(path, 0, "pread")
    try:
        assert f.read(0, 10).tolist() == list(range(10))
        os.truncate(path, 4096)
        with pytest.raises(PairError, match="truncated while being compared"):
            f.read(50_000, 60_000)
    finally:
        f.close()


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def _reset_peak_rss() -> bool:
    try:  # Linux >= 4.0: writing 5 resets VmHWM to the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
@pytest.mark.parametrize("how", ["pair_metrics", "pread", "mmap", "no-drop"])
def test_memmap_pages_do_not_stay_resident(tmp_path, how):
    n = 24 * 1024 * 1024  # 96 MiB per file
    pa, pb = tmp_path / "a.npy", tmp_path / "b.npy"
    for p in (pa, pb):
        m = np.lib.format.open_memmap(p, mode="w+", dtype=np.float32, shape=(n,))
        m[:] = 1.0
        m.flush()
        del m
    ma, mb = np.load(pa, mmap_mode="r"), np.load(pb, mmap_mode="r")
    if not _reset_peak_rss():
        pytest.skip("cannot reset the peak RSS (/proc/self/clear_refs)")
    before = _vm("VmRSS")
    if how == "pair_metrics":
        r = pair_metrics(ma, mb)
    elif how == "no-drop":  # plain ndarray views: nothing drops the pages (the control)
        r = pair_metrics(ma.view(np.ndarray), mb.view(np.ndarray))
    else:
        r = run_pairs([PairTask(0, str(pa), str(pb))], workers=2, io=how)[0]
    peak = _vm("VmHWM") - before
    assert r["equal_count"] == n
    if how == "no-drop":
        assert peak > 150 * 1024 * 1024, f"control: peak grew by only {peak / 2**20:.0f} MiB"
    else:
        assert peak < 40 * 1024 * 1024, f"peak RSS grew by {peak / 2**20:.0f} MiB"


def _edge_pairs(rng, count):
    """Pairs of many dtypes and shapes, with NaN, infinities, -0.0, huge values, empty and 0-d arrays."""
    pairs = []
    for i in range(count):
        kind = i % 9
        n = int(rng.integers(0, 700))
        if kind == 0:
            a, b = random_pair(rng, n, np.float32, np.float32)
        elif kind == 1:
            a, b = random_pair(rng, n, np.float64, np.float64)
        elif kind == 2:
            a, b = random_pair(rng, n, np.int64, np.int64)
        elif kind == 3:
            a, b = random_pair(rng, n, np.int32, np.int16)
        elif kind == 4:
            a, b = random_pair(rng, n, np.bool_, np.bool_)
        elif kind == 5:
            a, b = random_pair(rng, n, np.float16, np.float32)
        elif kind == 6:
            a = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 3e38, -3e38, 1.0] * (n // 8 + 1), np.float32)
            b = a.copy()
            b[::3] = np.float32(np.inf)
            b[1::5] = -0.0
        elif kind == 7:
            a = np.zeros(n, np.float64)
            b = np.full(n, 1e300 if i % 2 else 0.0)
        else:
            a = np.float32(rng.standard_normal())
            b = np.float32(a if i % 2 else -a)
        if kind != 8 and n % 4 == 0 and n:
            a, b = a.reshape(4, -1), b.reshape(4, -1)
        pairs.append((a, b))
    return pairs


@pytest.mark.parametrize("workers", [1, 2])
def test_batched_small_pairs_equal_pair_metrics(tmp_path, workers):
    """Pairs compared in batches (rlprobe.comparison.small_pairs) give pair_metrics' result, bit for bit."""
    rng = np.random.default_rng(18)
    tasks, want = [], {}
    for i, (a, b) in enumerate(_edge_pairs(rng, 300)):
        tasks.append(PairTask(i, _save(tmp_path / f"{i}a.npy", a), _save(tmp_path / f"{i}b.npy", b)))
        want[i] = pair_metrics(a, b)
    seen = []
    got = run_pairs(tasks, workers=workers, progress=lambda done, total: seen.append((done, total)))
    for i in want:
        assert_same(got[i], want[i])
        assert {k: v for k, v in got[i].items() if v == v} == {k: v for k, v in want[i].items() if v == v}, i
    total = sum(os.path.getsize(p) for t in tasks for p in (t.path_a, t.path_b))
    assert seen[-1] == (total, total)
    assert all(d1 <= d2 for (d1, _), (d2, _) in zip(seen, seen[1:]))


def test_batched_pairs_fall_back_to_the_per_pair_path(npy_pairs, tmp_path):
    """In a batch, bad files still get the per-pair path's message, and a big pair is still compared."""
    files, good = npy_pairs
    tasks = [PairTask(name, a, b) for name, (a, b) in files.items()]
    filler = np.arange(10, dtype=np.float32)
    path = _save(tmp_path / "filler.npy", filler)
    tasks += [PairTask(f"filler{i}", path, path) for i in range(40)]  # enough pairs for batches
    extra = Path(path).read_bytes().replace(b"'shape': (10,), }", b"'shape': (10,), 'x': 1}")
    assert b"'x': 1" in extra
    (tmp_path / "extra_key.npy").write_bytes(extra)
    tasks.append(PairTask("extra_key", str(tmp_path / "extra_key.npy"), path))
    results = run_pairs(tasks, workers=2, split_elements=50_000, chunk=8192)
    for name, (a, b) in good.items():
        assert results[name] == pair_metrics(np.load(a), np.load(b), chunk=8192), name
    for name, (needle1, needle2) in EXPECTED_ERRORS.items():
        err = results[name].get("error")
        assert err and needle1 in err and needle2 in err, (name, results[name])
    assert results["filler3"]["equal_count"] == 10
    assert "extra_key.npy" in results["extra_key"]["error"]
