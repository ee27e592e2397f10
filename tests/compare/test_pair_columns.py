"""Pairs held as columns (comparison/pair_results.py, PairColumns): the same tasks and results as PairTask lists."""

from __future__ import annotations

import io

import numpy as np
import pytest

from rlprobe.comparison.executor import PairTask, run_pairs
from rlprobe.comparison.pair_results import PairColumns, Side
from rlprobe.lake.tensor_pack import Record


def _npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _pairs(tmp_path, n: int) -> tuple[PairColumns, list[PairTask]]:
    """n pairs: side a whole .npy files (one missing), side b records of one packed file (one off its header)."""
    rng = np.random.default_rng(0)
    packed, offsets, lengths, paths_a = b"", [], [], []
    for i in range(n):
        a = rng.standard_normal(8).astype(np.float32)
        b = a.copy()
        b[i % 8] += 1.0
        path = tmp_path / f"a{i}.npy"
        if i != 3:
            np.save(path, a)
        paths_a.append(str(path))
        record = _npy_bytes(b)
        offsets.append(len(packed) + (1 if i == n - 1 else 0))  # the last one: no .npy header there
        lengths.append(len(record))
        packed += record
    (tmp_path / "b.npys").write_bytes(packed)
    path_b = str(tmp_path / "b.npys")
    columns = PairColumns(Side(paths_a), Side([path_b] * n, np.array(offsets, np.int64),
                                               np.array(lengths, np.int64)))
    tasks = [PairTask(i, paths_a[i], path_b, None, Record(offsets[i], lengths[i])) for i in range(n)]
    return columns, tasks


def test_items_and_slices_are_the_pair_tasks(tmp_path):
    columns, tasks = _pairs(tmp_path, 20)
    assert list(columns) == tasks and [type(t) for t in columns] == [PairTask] * 20
    assert [columns[i] for i in range(20)] == tasks  # one by one as all at once
    assert columns[-1] == tasks[-1]
    part = columns[4:9]
    assert list(part) == tasks[4:9] and list(part.task_ids) == [4, 5, 6, 7, 8]
    assert part[0].task_id == 4 and len(columns[18:40]) == 2
    with pytest.raises(IndexError, match="pair 20 of 20"):
        columns[20]
    with pytest.raises(ValueError, match="contiguous"):
        columns[::2]


@pytest.mark.parametrize("workers", [1, 2])
def test_run_pairs_gives_the_results_of_the_task_list(tmp_path, workers):
    columns, tasks = _pairs(tmp_path, 40)  # enough pairs for batches (small_pairs.BATCH_MIN)
    from_columns = run_pairs(columns, workers=workers)
    from_list = run_pairs(tasks, workers=workers)
    assert from_columns == from_list
    assert "a3.npy" in from_columns[3]["error"]  # the missing file, named by the per-pair path
    assert "error" in from_columns[39]  # the last record, not at a header
    assert from_columns[0]["equal_count"] == 7


def test_sides_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="both sides need as many pairs: 2 and 1"):
        PairColumns(Side(["a", "b"]), Side(["c"]))
    with pytest.raises(ValueError, match="a side of 2 paths needs as many offsets and lengths, got 1 and 1"):
        Side(["a", "b"], np.zeros(1, np.int64), np.zeros(1, np.int64))
