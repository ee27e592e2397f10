"""How run_pairs cuts its pairs into batch jobs (rlprobe/compare/small_pairs.py, plan_jobs): in task order,
at least one batch a worker, at most BATCH_PAIRS pairs a batch, none below BATCH_MIN pairs."""

from __future__ import annotations

from rlprobe.compare.small_pairs import BATCH_MIN, BATCH_PAIRS, plan_jobs


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
