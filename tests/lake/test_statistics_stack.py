"""lake/statistics.py: a save call's small tensors of one layout are reduced as one stack; every
statistic must be bit for bit what the tensor alone gives (numpy reduces each row of a stack as
it reduces that row alone)."""

from __future__ import annotations

import math

import numpy as np

from rlprobe.lake.statistics import host_statistics, host_statistics_many, stack_groups


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


def test_groups_keep_one_layout_and_their_size_limit():
    layouts = ["a", "b", "a", "a", "b", "a"]
    sizes = [40, 10, 40, 40, 10, 200]
    groups = stack_groups(layouts, sizes, 100)
    assert sorted(i for g in groups for i in g) == list(range(6))
    for g in groups:
        assert len({layouts[i] for i in g}) == 1
        assert len(g) == 1 or sum(sizes[i] for i in g) <= 100
    assert [5] in groups  # larger than the limit: alone
