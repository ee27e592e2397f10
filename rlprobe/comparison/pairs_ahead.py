"""Tensor pairs compared ahead, while this thread still reads both runs' statistics.

With more than one worker, a comparison of two msprobe dumps knows the pairs it will compare, in the
usual case, as soon as run A's folders are listed: each tensor file of run A with the file under the same
path in run B. The statistics files (a JSON file per tensor, read by Python, holding the GIL), run B's
listing and the layout and pairing SQL take longer than the pairs themselves on a dump of many small
tensors, so the pairs start on the workers (compiled, GIL-free: rlprobe.comparison.small_pairs) beside that
reading (docs/performance.md, "Comparison: many small pairs").

The SQL still decides which pairs are compared (tensor_pairs.sql): `take` gives each of its pairs
the result computed ahead where there is one - the same kernel on the same files, so the same bits -
and compares the others (another key name in run B, say) the usual way. A pair compared ahead that
the SQL does not pick (shapes that differ, a file run B lacks) is dropped. Where the comparing ahead failed, every pair
is compared the usual way, which names the problem as it always did.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

from rlprobe.comparison.pair_results import PairResults

__all__ = ["AHEAD_MIN_PAIRS", "PairsAhead"]

Progress = Callable[[int, int], None]
# fewer pairs are compared where the SQL picks them: a one-step comparison (the start-up) starts no thread
AHEAD_MIN_PAIRS = 16


class PairsAhead:
    """`run_pairs(tasks, workers=, progress=)` (rlprobe.comparison.executor's) over `tasks` on a thread
    ("rlprobe-pairs-ahead"), once `ready()` returns (the compiled kernels are loaded)."""

    def __init__(self, tasks: Sequence[Any], workers: int, ready: Callable[[], None],
                 run_pairs: Callable[..., Any]) -> None:
        self._tasks = list(tasks)
        self._results: PairResults | None = None
        self._progress = (0, 0)
        self._thread = threading.Thread(target=self._compare, args=(workers, ready, run_pairs),
                                        name="rlprobe-pairs-ahead", daemon=True)
        self._thread.start()

    def _compare(self, workers: int, ready: Callable[[], None], run_pairs: Callable[..., Any]) -> None:
        def seen(done: int, total: int) -> None:
            self._progress = (done, total)

        try:
            ready()
            results = run_pairs(self._tasks, workers=workers, progress=seen)
        except BaseException:  # noqa: BLE001 - `take` compares every pair the usual way, which reports it
            return
        if isinstance(results, PairResults):
            self._results = results

    def wait(self) -> None:
        """Until the pairs compared ahead are done (a comparison that failed before it took them)."""
        self._thread.join()

    def take(self, tasks: Sequence[Any], run_rest: Callable[[list[Any], Progress | None], Any],
             progress: Progress | None = None) -> PairResults:
        """The results of `tasks` (PairTask) as run_pairs gives them: those compared ahead from there, the
        others from `run_rest(their tasks, progress)` (the executor)."""
        self.wait()
        tasks = list(tasks)  # once: columns (comparison/pair_results.py) make their PairTasks when iterated
        ahead = self._results
        if ahead is None:  # the comparing ahead failed: every pair the usual way
            return run_rest(list(tasks), progress)
        ahead_rows = {tuple(t[1:]): row for row, t in enumerate(self._tasks)}  # by the files, not the id
        here, there, rest = [], [], []
        for row, task in enumerate(tasks):
            found = ahead_rows.get(tuple(task[1:]))
            if found is None:
                rest.append(row)
            else:
                here.append(row)
                there.append(found)
        results = PairResults([t.task_id for t in tasks])
        if here:
            taken = np.asarray(there, np.int64)
            columns = {name: column[taken] for name, column in ahead.columns.items()}
            results.put_rows(np.asarray(here, np.int64), columns)
            if ahead.errors:
                row_of = dict(zip(there, here))
                for found, message in ahead.errors.items():
                    if found in row_of:
                        results.errors[row_of[found]] = message
        done, total = self._progress
        if rest:
            shifted = None if progress is None else lambda d, t: progress(done + d, total + t)
            more = run_rest([tasks[row] for row in rest], shifted)
            for row in rest:
                results.put(row, more[tasks[row].task_id])
        elif progress is not None:
            progress(done, total)
        return results
