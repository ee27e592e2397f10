"""Larger pairs compared several to a job in one compiled call (rlprobe/comparison/small_pairs.py): the per-pair
path's results, bit for bit, whatever the workers and the chunk; every pair the call cannot take compared the
per-pair way, which names the problem; pairs over the split size still split between workers."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rlprobe.comparison.executor import PairTask, run_pairs
from rlprobe.comparison.small_pairs import BATCH_MIN, SMALL_FILE_BYTES, compare_mapped_pairs, job_groups

N = 300_000  # elements of a larger pair: over SMALL_FILE_BYTES in every dtype here


def _bits(metrics: dict) -> dict:
    return {k: (np.float64(v).tobytes() if isinstance(v, float) else v) for k, v in metrics.items()}


def _dump(tmp_path) -> list[PairTask]:
    """Small pairs (so that the executor batches) and larger ones of float32, float64 and int64, equal,
    differing, with NaN/±inf, a mixed-dtype pair, a Fortran-order array, a truncated file, a missing one,
    a shape mismatch."""
    rng = np.random.default_rng(11)
    tasks = []

    def add(a, b, name):
        pa_, pb_ = tmp_path / f"{name}_a.npy", tmp_path / f"{name}_b.npy"
        if a is not None:
            np.save(pa_, a)
        if b is not None:
            np.save(pb_, b)
        tasks.append(PairTask(name, str(pa_), str(pb_)))
        return pa_, pb_

    for i in range(BATCH_MIN):
        x = rng.standard_normal(64).astype(np.float32)
        add(x, x + np.float32(i % 2), f"small{i}")
    for dtype in (np.float32, np.float64):
        x = (rng.standard_normal(N) * 3).astype(dtype)
        add(x, x.copy(), f"equal_{np.dtype(dtype).name}")
        y = (x * (1 + rng.standard_normal(N) * 1e-4)).astype(dtype)
        y[: N // 3] = x[: N // 3]
        add(x, y, f"differ_{np.dtype(dtype).name}")
        z = y.copy()
        z[N // 2], z[N // 4], z[-1] = np.nan, -np.inf, -0.0
        add(x, z, f"special_{np.dtype(dtype).name}")
    ints = rng.integers(-2 ** 40, 2 ** 40, N)
    add(ints, ints + (np.arange(N) % 7 == 0), "int64")
    add(rng.standard_normal(N).astype(np.float32), rng.standard_normal(N), "mixed")
    add(np.asfortranarray(rng.standard_normal((600, 500))), rng.standard_normal((600, 500)), "fortran")
    _, truncated = add(rng.standard_normal(N), rng.standard_normal(N), "truncated")
    os.truncate(truncated, os.path.getsize(truncated) - 1000)
    add(rng.standard_normal(N), None, "missing")
    add(rng.standard_normal(N), rng.standard_normal(N + 1), "shape")
    assert all(os.path.getsize(t.path_a) > SMALL_FILE_BYTES for t in tasks[BATCH_MIN:])
    return tasks


@pytest.mark.parametrize("chunk", [1 << 20, 50_000])
def test_the_mapped_pairs_give_the_per_pair_paths_results(tmp_path, chunk):
    tasks = _dump(tmp_path)
    per_pair = run_pairs(tasks, workers=1, io="pread", chunk=chunk)  # io=pread: every larger pair one by one
    for workers in (1, 2):
        got = run_pairs(tasks, workers=workers, chunk=chunk)
        for t in tasks:
            assert _bits(got[t.task_id]) == _bits(per_pair[t.task_id]), (t.task_id, workers)
    assert "truncated" in got["truncated"]["error"] and "truncated" in per_pair["truncated"]["error"]
    assert "not found" in got["missing"]["error"]
    assert got["shape"]["error"].startswith("shape mismatch")
    assert got["special_float32"]["nan_mismatch_count"] == 1 and got["equal_float64"]["cosine"] == 1.0


def test_the_call_takes_the_plain_pairs_and_leaves_the_rest(tmp_path):
    tasks = _dump(tmp_path)[BATCH_MIN:]
    nbytes = [os.path.getsize(t.path_a) + (os.path.getsize(t.path_b) if os.path.exists(t.path_b) else 0)
              for t in tasks]
    done = compare_mapped_pairs(tasks, nbytes, 1 << 20, 1 << 40)
    names = [t.task_id for t in tasks]
    assert sorted(names[i] for i in done.rows.tolist()) == sorted(
        n for n in names if n.startswith(("equal", "differ", "special", "int64")))
    assert sorted(names[i] for i in done.rest) == ["fortran", "missing", "mixed", "shape", "truncated"]
    assert done.large == [] and done.other == []
    over = compare_mapped_pairs(tasks[:2], nbytes[:2], 1 << 20, N - 1)  # over the limit: handed back to split
    assert over.large == [(0, nbytes[0]), (1, nbytes[1])] and over.rows.size == 0


def test_a_pair_over_the_split_size_is_still_split_between_workers(tmp_path):
    tasks = _dump(tmp_path)
    per_pair = run_pairs(tasks, workers=1, io="pread", chunk=50_000)
    split = run_pairs(tasks, workers=2, chunk=50_000, split_elements=100_000)  # 300,000 elements: split
    assert all(_bits(split[t.task_id]) == _bits(per_pair[t.task_id]) for t in tasks)


def test_jobs_hold_runs_of_pairs_up_to_the_byte_limit():
    assert job_groups([(0, 10), (1, 20), (2, 40), (3, 5)], limit=30) == [[(0, 10), (1, 20)], [(2, 40)], [(3, 5)]]
    assert job_groups([], limit=30) == []
    sizes = [(i, 8 << 20) for i in range(20)]
    assert [len(g) for g in job_groups(sizes)] == [8, 8, 4]
    assert [p for g in job_groups(sizes) for p in g] == sizes
