"""lake/statistics.py: a save call's small tensors of one layout are reduced as one stack; every
statistic must be bit for bit what the tensor alone gives (numpy reduces each row of a stack as
it reduces that row alone)."""

from __future__ import annotations

import hashlib
import math

import numpy as np

from rlprobe.lake.encoding import narrow_integers
from rlprobe.lake.statistics import (bitwise_hash, consecutive_chunks, host_statistics, host_statistics_columns, host_statistics_many,
                                     stack_groups)


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for dtype in (np.float32, np.float64, np.float16, np.int64, np.int8, np.uint8, np.bool_):
        for shape in ((), (0,), (3,), (8, 8), (4, 8), (8, 8), (129,), (2, 0), (9000,)):
            for variant in range(3):
                a = rng.standard_normal(shape) * 50
                if a.size > 2 and variant == 1 and np.dtype(dtype).kind == "f":
                    a.flat[0], a.flat[1], a.flat[2] = np.nan, np.inf, 0.0
                out.append(a.astype(dtype))
    return out


def _identical(x, y) -> bool:
    if isinstance(x, float) and math.isnan(x):
        return isinstance(y, float) and math.isnan(y)
    return type(x) is type(y) and x == y


def test_stacked_statistics_are_those_of_each_tensor_alone():
    arrays = _arrays()
    stacked = host_statistics_many(arrays)
    for array, stats in zip(arrays, stacked):
        alone = host_statistics(array)
        assert all(_identical(alone[name], stats[name]) for name in alone), (array.dtype, array.shape, alone, stats)
    empty = host_statistics(np.zeros(0, np.float32))
    assert empty["min"] is None and empty["mean"] is None and empty["norm"] == 0.0 and empty["zero_count"] == 0


def test_statistics_as_columns_are_those_of_each_tensor_alone_to_the_bit():
    """The writer's key-data rows take the columns (capture/key_data_rows.py): each value equal to the
    tensor's own statistic, null exactly where it is None (min, max and mean of an empty tensor)."""
    arrays = _arrays()
    values, null = host_statistics_columns(arrays)
    for k, array in enumerate(arrays):
        alone = host_statistics(array)
        for name, expected in alone.items():
            assert null[name][k] == (expected is None), (name, array.dtype, array.shape)
            if expected is not None:
                got = values[name][k].item()
                assert _identical(expected, got), (name, array.dtype, array.shape, expected, got)
    assert values["nan_count"].dtype == np.int64 and values["mean"].dtype == np.float64


def test_a_contiguous_array_is_hashed_through_its_buffer_as_its_bytes():
    rng = np.random.default_rng(1)
    for array in (rng.standard_normal((4, 8)).astype(np.float32), np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],
                  np.zeros((), np.float64), np.zeros((2, 0), np.int8), np.array([True, False])):
        reference = hashlib.blake2b(np.ascontiguousarray(array).reshape(-1).view(np.uint8), digest_size=16)
        assert bitwise_hash(array) == reference.hexdigest()


def test_integers_are_narrowed_by_their_exact_range_also_past_two_to_the_53():
    """narrow_integers takes the float64 min and max as they are below 2**53 (exact there) and the
    array's own integer min and max beyond: the stored dtype is the narrowest that holds the values."""
    cases = [np.array([0, 255], np.int64), np.array([-1, 127], np.int64), np.array([0, 256], np.int32),
             np.array([-(2 ** 31), 5], np.int64), np.array([0, 2 ** 53 - 1], np.int64),
             np.array([0, 2 ** 53 + 1], np.int64), np.array([-(2 ** 63), 2 ** 62], np.int64),
             np.array([0, 2 ** 64 - 1], np.uint64), np.array([2 ** 63 + 1, 2 ** 63 + 3], np.uint64)]
    for values in cases:
        lo, hi = float(values.min()), float(values.max())
        stored = narrow_integers(values, lo, hi)
        assert np.array_equal(stored.astype(values.dtype), values) and (stored == values).all(), values
        low, high = int(values.min()), int(values.max())
        narrowest = next(np.dtype(t) for t in ("uint8", "int8", "uint16", "int16", "uint32", "int32", "int64",
                                               "uint64") if np.iinfo(t).min <= low and high <= np.iinfo(t).max)
        expected = narrowest if narrowest.itemsize < values.dtype.itemsize else values.dtype
        assert stored.dtype == expected, (values, stored.dtype, expected)


def test_groups_keep_one_layout_and_their_size_limit():
    layouts = ["a", "b", "a", "a", "b", "a"]
    sizes = [40, 10, 40, 40, 10, 200]
    groups = stack_groups(layouts, sizes, 100)
    assert sorted(i for g in groups for i in g) == list(range(6))
    for g in groups:
        assert len({layouts[i] for i in g}) == 1
        assert len(g) == 1 or sum(sizes[i] for i in g) <= 100
    assert [5] in groups  # larger than the limit: alone


def test_chunks_are_consecutive_runs_within_the_limit():
    sizes = [40, 10, 60, 200, 0, 30, 70, 100]
    runs = consecutive_chunks(sizes, 100)
    assert [i for run in runs for i in run] == list(range(len(sizes)))  # every item once, in order
    assert runs == [[0, 1], [2], [3], [4, 5, 6], [7]]  # 0 + 30 + 70: exactly the limit
    assert all(len(run) == 1 or sum(sizes[i] for i in run) <= 100 for run in runs)
    assert consecutive_chunks([], 100) == []
