"""Ray executor: the pair kernels as Ray tasks, for comparisons spread over a cluster.

Called like :func:`rlprobe.comparison.executor.run_pairs` and returns the same
``{task_id: metrics}``: each Ray task compares a batch of pairs with the local kernels (so the
numbers are bit-identical to the local executor). Every node must see the dump files at the
same paths (a shared filesystem). ``address="auto"`` (or ``ray://host:port``) joins a running
cluster; without an address a local Ray instance is started (``num_cpus=workers``, no
dashboard) unless one is already running in this process.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable

from rlprobe.comparison.executor import PairTask

__all__ = ["run_pairs_ray"]

TASKS_PER_WORKER = 4  # batches per worker: enough to balance, few enough to keep overhead low


def _compare_batch(batch: list[tuple[Hashable, str, str]]) -> list[tuple[Hashable, dict[str, Any]]]:
    from rlprobe.comparison.executor import PairTask, run_pairs

    results = run_pairs([PairTask(*t) for t in batch], workers=1)
    return [(t[0], results[t[0]]) for t in batch]


def _ensure_ray(address: str | None, workers: int):
    try:
        import ray
    except ImportError:
        raise ImportError("executor kind 'ray' needs Ray: pip install '.[ray]' in rlprobe's checkout") from None
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=max(1, workers), include_dashboard=False, log_to_driver=False,
                     ignore_reinit_error=True)
    return ray


def run_pairs_ray(tasks: Iterable[PairTask], workers: int = 2, progress: Callable[[int, int], None] | None = None,
                  *, address: str | None = None) -> dict[Hashable, dict[str, Any]]:
    """Compare every pair on Ray; ``progress(done_pairs, total_pairs)`` after each finished batch."""
    tasks = list(tasks)
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate task_id in the pairs to compare")
    if not tasks:
        if progress is not None:
            progress(0, 0)
        return {}
    ray = _ensure_ray(address, workers)
    remote = ray.remote(num_cpus=1)(_compare_batch)
    n_batches = min(len(tasks), max(1, workers) * TASKS_PER_WORKER)
    batches = [[(t.task_id, str(t.path_a), str(t.path_b), t.record_a, t.record_b) for t in tasks[i::n_batches]]
               for i in range(n_batches)]  # records: where a packed file's tensors lie (lake/tensor_pack.py)
    pending = {remote.remote(b): len(b) for b in batches}
    results: dict[Hashable, dict[str, Any]] = {}
    done = 0
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            for task_id, metrics in ray.get(ref):
                results[task_id] = metrics
            done += pending.pop(ref)
        if progress is not None:
            progress(done, len(tasks))
    return results
