"""rlprobe/comparison/kernels.pyx and file_kernels.pyx: the compiled kernels against the plain numpy reference
(kernel_reference.py) on random and edge inputs, the same bits at every vector width, and the file kernels'
handling of files they cannot take (left to the per-pair path, which names the file:
test_pair_metrics.py's test_batched_pairs_fall_back_to_the_per_pair_path)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from rlprobe.comparison import file_kernels, kernels
from rlprobe.comparison.partials import F4, OK, SLOW
from rlprobe.comparison.small_pairs import path_bytes

from kernel_reference import partials as reference

KERNELS = {np.dtype(np.float32): kernels.pair_f4, np.dtype(np.float64): kernels.pair_f8,
           np.dtype(np.int64): kernels.pair_i8}
SIZES = (0, 1, 7, 8, 9, 15, 17, 2047, 2048, 2049, 3 * 2048 + 5)  # around the 8 lanes and the 2048-element blocks
I64 = np.iinfo(np.int64)


def _pair(rng, dtype, n: int, special: bool):
    if dtype == np.int64:
        a = rng.integers(-1000, 1000, n)
        b = np.where(rng.random(n) < 0.3, a + rng.integers(-3, 4, n), a)
        if special and n:
            extremes = np.array([I64.min, I64.max, 0, -1, I64.min + 1])
            a[rng.integers(0, n, 4)], b[rng.integers(0, n, 4)] = rng.choice(extremes, 4), rng.choice(extremes, 4)
        return a.astype(np.int64), b.astype(np.int64)
    a = rng.standard_normal(n) * np.exp(rng.uniform(-5, 5, n))
    b = np.where(rng.random(n) < 0.5, a, a * (1 + rng.uniform(-2e-2, 2e-2, n)))
    if special and n:
        for arr in (a, b):
            at = rng.integers(0, n, max(1, n // 50))
            arr[at] = rng.choice([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e308, -1e308], at.size)
    with np.errstate(over="ignore"):  # 1e308 as float32: an infinity
        return a.astype(dtype), b.astype(dtype)


def _assert_like_reference(got: tuple, a: np.ndarray, b: np.ndarray) -> None:
    want, magnitude = reference(a, b)
    assert len(got) == 11
    for k in (0, 1, 2, 3, 4, 5, 6, 10):  # counts, first mismatch, maxima: exact
        assert got[k] == want[k] or (got[k] != got[k] and want[k] != want[k]), (k, got, want)
    for k, size in zip((7, 8, 9), magnitude):  # sums: within the rounding error of any order
        if not np.isfinite(want[k]):
            assert got[k] == want[k] or (np.isnan(got[k]) and np.isnan(want[k])), (k, got[k], want[k])
        else:
            assert abs(got[k] - want[k]) <= a.shape[0] * 2.0**-52 * size, (k, got[k], want[k])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("special", [False, True])
def test_kernels_agree_with_the_reference(dtype, special):
    rng = np.random.default_rng(7)
    for n in SIZES:
        for _ in range(3):
            a, b = _pair(rng, dtype, n, special)
            _assert_like_reference(KERNELS[np.dtype(dtype)](a, b, 0, n), a, b)


def test_edge_values():
    cases = {
        "signed zeros are equal": ([0.0, -0.0, -0.0], [-0.0, 0.0, -0.0]),
        "NaN against NaN is equal, against a number a NaN mismatch": ([np.nan, np.nan, 1.0], [np.nan, 2.0, np.nan]),
        "infinities": ([np.inf, -np.inf, np.inf, 1.0], [np.inf, np.inf, 5.0, -np.inf]),
        "a difference that overflows": ([1.7e308, 1.0], [-1.7e308, 1.0]),
        "subnormals": ([5e-324, 1e-310], [0.0, 1e-310]),
    }
    for name, (x, y) in cases.items():
        for dtype in (np.float32, np.float64):
            for reps in (1, 3, 700):  # the fast blocks and the exact ones, and a 2048-element block's end
                with np.errstate(over="ignore"):
                    a, b = np.tile(np.array(x, dtype), reps), np.tile(np.array(y, dtype), reps)
                _assert_like_reference(KERNELS[np.dtype(dtype)](a, b, 0, a.size), a, b), name
    a = np.array([I64.min, I64.max, I64.max, 0], np.int64)
    b = np.array([I64.max, I64.min, I64.max, I64.min], np.int64)
    got = kernels.pair_i8(a, b, 0, 4)
    _assert_like_reference(got, a, b)
    assert got[3] == float(2**64 - 1)  # the exact difference of the extremes, rounded once


def test_a_range_is_compared_with_its_own_indices():
    rng = np.random.default_rng(3)
    a, b = _pair(rng, np.float64, 5000, True)
    got = list(kernels.pair_f8(a, b, 1000, 4000))
    want = list(kernels.pair_f8(a[1000:4000].copy(), b[1000:4000].copy(), 0, 3000))
    assert want[2] >= 0
    want[2] += 1000  # the first mismatch in the arrays' indices
    assert _bits(got) == _bits(want)


def test_fewer_than_eight_elements_are_added_in_index_order():
    x = np.array([1e16, 1.0, -1e16, 1.0, 3.0, 1e-3, 7.0], np.float64)
    y = np.ones(7)
    for n in range(8):
        expect = 0.0
        for v in x[:n]:
            expect += v
        assert kernels.pair_f8(x[:n].copy(), y[:n].copy(), 0, n)[7] == expect


def _bits(t: tuple) -> bytes:
    return struct.pack("11d", *t)


def test_the_same_bits_at_every_vector_width():
    widths = []
    start = kernels.vector_width()
    rng = np.random.default_rng(11)
    pairs = [_pair(rng, dtype, n, special) for dtype in (np.float32, np.float64, np.int64)
             for n in (5, 64, 2049, 20_000) for special in (False, True)]
    wide = rng.integers(I64.min, I64.max, 20_000, dtype=np.int64)  # int64 to float64 rounds: AVX2's own conversion
    pairs += [(wide, np.roll(wide, 1)), (wide, (wide >> 11) + (1 << 53))]
    results = {}
    try:
        for bits in (128, 256, 512):
            try:
                kernels.use_vector_width(bits)
            except ValueError:
                continue
            widths.append(bits)
            results[bits] = [_bits(KERNELS[a.dtype](a, b, 0, a.size)) for a, b in pairs]
    finally:
        kernels.use_vector_width(start)
    assert 128 in widths and kernels.vector_width() == start
    for bits in widths:
        assert results[bits] == results[128], bits


def test_bad_arguments_are_refused():
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="not within both arrays"):
        kernels.pair_f4(x, x, 0, 5)
    with pytest.raises(ValueError, match="not within both arrays"):
        kernels.pair_f4(x, x[:2].copy(), 0, 3)
    with pytest.raises(ValueError, match="dtype mismatch"):
        kernels.pair_f8(x, x, 0, 4)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.pair_f4(np.zeros(8, np.float32)[::2], x, 0, 4)
    with pytest.raises(ValueError, match="cannot run the kernels at 1024 bits"):
        kernels.use_vector_width(1024)


def _files(tmp_path):
    good = tmp_path / "good.npy"
    np.save(good, np.arange(100, dtype=np.float32))
    raw = good.read_bytes()
    (tmp_path / "truncated.npy").write_bytes(raw[:len(raw) - 8])
    (tmp_path / "header.npy").write_bytes(raw.replace(b"'fortran_order': False", b"'fortran_order': True "))
    (tmp_path / "garbage.npy").write_bytes(b"not a numpy file at all")
    return [str(tmp_path / name) for name in ("good.npy", "missing.npy", "truncated.npy", "header.npy",
                                              "garbage.npy")]


def test_read_files_marks_what_it_cannot_take(tmp_path):
    paths, starts = path_bytes(_files(tmp_path))
    n = starts.size
    info, sizes = np.zeros((n, 4), np.int64), np.empty(n, np.int64)
    buf = file_kernels.read_files(paths, starts, np.zeros(n, np.int64), np.full(n, -1, np.int64), 1 << 20, info,
                                  sizes)
    assert info[:, 0].tolist() == [OK, SLOW, SLOW, SLOW, SLOW]
    assert info[0, 1:3].tolist() == [F4, 100] and sizes[1] == -1
    data = np.frombuffer(buf, np.float32, 100, int(info[0, 3]))
    assert (data == np.arange(100)).all()
    rows = np.empty((1, 11))
    file_kernels.compare_batch(buf, info, np.array([0]), np.array([0]), rows)
    assert rows[0, 1] == 100  # equal_count
    with pytest.raises(ValueError, match="pair 0 .files 0 and 2. is not two arrays"):
        file_kernels.compare_batch(buf, info, np.array([0]), np.array([2]), rows)


def test_compare_mapped_marks_what_it_cannot_take(tmp_path):
    files = _files(tmp_path)
    paths, starts = path_bytes([files[0]] * 5 + files)  # the good file against each
    n = 5
    info, rows = np.zeros((n, 4), np.int64), np.zeros((n, 11))
    file_kernels.compare_mapped(paths, starts, np.zeros(2 * n, np.int64), np.full(2 * n, -1, np.int64), 1 << 20,
                                64, info, np.arange(n + 1, dtype=np.int64) * 2, rows.repeat(2, 0))
    assert info[:, 0].tolist() == [OK, SLOW, SLOW, SLOW, SLOW]
    assert info[0, 3] == 2  # chunks of 64 elements
