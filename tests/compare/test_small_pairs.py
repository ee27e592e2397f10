"""How run_pairs cuts its pairs into batch jobs (rlprobe/comparison/small_pairs.py, plan_jobs): in task order,
at least one batch a worker, at most BATCH_PAIRS pairs a batch, none below BATCH_MIN pairs."""

from __future__ import annotations

from rlprobe.comparison.small_pairs import BATCH_MIN, BATCH_PAIRS, plan_jobs


def _sizes(n: int, workers: int) -> list[int]:
    jobs = plan_jobs(list(range(n)), workers)
    assert [i for i, _ in jobs] == [0, *[sum(len(j) for _, j in jobs[:k]) for k in range(1, len(jobs))]]
    assert [t for _, job in jobs for t in job] == list(range(n))  # every task once, in order
    return [len(job) for _, job in jobs]


def test_each_worker_gets_a_batch_where_there_are_few_pairs():
    # the large workload: 256 pairs, most of them files too large for a batch (the batch finds that out)
    assert _sizes(256, 1) == [256]
    assert _sizes(256, 2) == [128, 128]
    assert _sizes(257, 2) == [129, 128]
    assert _sizes(20, 4) == [5, 5, 5, 5]


def test_many_pairs_keep_full_batches_and_few_go_one_by_one():
    assert _sizes(1000, 2) == [BATCH_PAIRS] * 3 + [1000 - 3 * BATCH_PAIRS]
    assert _sizes(3200, 16) == [200] * 16
    jobs = plan_jobs(list(range(BATCH_MIN - 1)), 2)
    assert jobs == [(i, i) for i in range(BATCH_MIN - 1)]  # tasks themselves: no batch functions to load


def _npy_bytes(array):
    import io

    import numpy as np

    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _open_descriptors() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


def test_records_of_many_packed_files_read_as_from_their_own_files(tmp_path):
    # more packed files than read_files keeps open (FD_CACHE), their records interleaved, one file missing
    # and one record cut short: each pair's result is the one of the same arrays in files of their own
    import numpy as np

    from rlprobe.comparison.file_kernels import FD_CACHE
    from rlprobe.comparison.pair_results import PairColumns, Side
    from rlprobe.comparison.small_pairs import compare_small_pairs, path_bytes

    rng = np.random.default_rng(1)
    files = FD_CACHE + 8
    n = 6 * files
    packs = [b""] * files
    pack_of = [(i * 7) % files for i in range(n)]  # interleaved: a file's records far apart
    offsets, lengths, own_a, own_b = [], [], [], []
    for i in range(n):
        a = rng.standard_normal(4 + i % 5).astype(np.float32)
        b = a.copy()
        b[i % a.size] += 0.5 * (i % 3)
        record = _npy_bytes(b)
        j = pack_of[i]
        offsets.append(len(packs[j]))
        lengths.append(len(record) - (3 if i == 10 else 0))  # pair 10: its record cut short
        packs[j] += record
        own_a.append(str(tmp_path / f"a{i}.npy"))
        np.save(own_a[-1], a)
        own_b.append(str(tmp_path / f"b{i}.npy"))
        np.save(own_b[-1], b)
    for j, data in enumerate(packs):
        if j != 5:  # pack 5 missing
            (tmp_path / f"p{j}.npys").write_bytes(data)
    packed = PairColumns(Side(own_a), Side([str(tmp_path / f"p{j}.npys") for j in pack_of],
                                           np.array(offsets, np.int64), np.array(lengths, np.int64)))
    alone = PairColumns(Side(own_a), Side(own_b))
    before = _open_descriptors()
    got, want = compare_small_pairs(packed), compare_small_pairs(alone)
    assert _open_descriptors() == before  # every descriptor closed
    missing = {i for i in range(n) if pack_of[i] == 5}
    assert sorted(got.rest) == sorted(missing | {10}) and want.rest == []
    kept = [i for i in range(n) if i not in missing and i != 10]
    assert got.rows.tolist() == kept
    for name, column in got.columns.items():
        np.testing.assert_array_equal(column, want.columns[name][kept], err_msg=name)
    # a path given again starts where its first copy does; distinct paths are stored once
    names, starts = path_bytes(["x/a", "x/b", "x/a", "x/a"])
    assert starts.tolist() == [0, 4, 0, 0] and names.tobytes() == b"x/a\0x/b\0"
