"""Larger pairs of ``.npy`` files (over small_pairs.SMALL_FILE_BYTES) compared many to a job, with no Python
and no GIL per pair: one compiled call (rlprobe.comparison.mapped_kernels) maps each pair's files and runs the
element kernel over them chunk by chunk.

Compared one job a pair, each pair took the GIL several times (opening and mapping its files, its partials,
its result), and a thread holding the GIL for long (the later imports and the single-run rules run beside the
pairs: rlprobe/comparison/run.py) kept a worker waiting up to the interpreter's switch interval (5 ms) each time:
a pair of 1M float32 takes ~1-2 ms in the kernel. So the large pairs a batch finds go in jobs of several
pairs (MAPPED_JOB_BYTES each), which take the GIL once to start and once to hand back their columns.

A pair's result is bit-identical to the per-pair path's: the same kernel on the same chunks (multiples of
`chunk` in the flat index space), their partials combined as combine() combines them. A pair the compiled call
does not take - another dtype or a mixed pair (converted), a header numpy did not write the plain way, a
file that cannot be opened or mapped, a size or shape mismatch - goes to the per-pair path, which names the
problem; a pair over `limit` elements is handed back for the executor to split between workers.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from rlprobe.comparison.partials import WIDTH, combine, metric_columns
from rlprobe.comparison.small_pairs import Batch, path_bytes, record_arrays

__all__ = ["MAPPED_JOB_BYTES", "compare_mapped_pairs", "job_groups", "run_mapped"]

MAPPED_JOB_BYTES = 64 << 20  # bytes of both files a job: ~30 ms of the kernel, few enough jobs, even ends


def job_groups(large: Sequence[tuple[int, int]], limit: int = MAPPED_JOB_BYTES) -> list[list[tuple[int, int]]]:
    """(position, bytes) of the large pairs in runs of at most `limit` bytes (a larger pair alone), in order."""
    groups: list[list[tuple[int, int]]] = []
    filled = 0
    for pair in large:
        if not groups or filled + pair[1] > limit:
            groups.append([])
            filled = 0
        groups[-1].append(pair)
        filled += pair[1]
    return groups


def compare_mapped_pairs(tasks: Sequence[Any], nbytes: Sequence[int], chunk: int, limit: int) -> Batch:
    """Compare the pairs (PairTask; `nbytes`: both files' bytes of each, which bound its chunks) that the compiled
    call takes, pairs of at most `limit` elements, in one call: a Batch (small_pairs) whose `large` are the pairs
    over `limit` and `rest` those left to the per-pair path."""
    from rlprobe.comparison.compiled import mapped_function

    n = len(tasks)
    located = path_bytes([t.path_a for t in tasks] + [t.path_b for t in tasks]) if n else None
    if located is None:
        return Batch(np.empty(0, np.int64), {}, [], 0, [], list(range(n)))
    paths, path_starts = located
    # room for each pair's chunks: its elements are at most a file's bytes over 4 (float32, the smallest item)
    room = np.array([-(-max(1, b // 2) // (4 * chunk)) + 1 for b in nbytes], np.int64)
    first_row = np.zeros(n + 1, np.int64)
    np.cumsum(room, out=first_row[1:])
    rows = np.zeros((int(first_row[-1]), WIDTH), np.float64)
    info = np.zeros((n, 4), np.int64)
    mapped = mapped_function()
    offsets, lengths = record_arrays(tasks)
    mapped.compare_mapped(paths, path_starts, offsets, lengths, limit, chunk, info, first_row, rows)
    done = info[:, 0] == mapped.OK
    whole = np.flatnonzero(done & (info[:, 3] == 1))  # one chunk: combine() of one partial, as columns
    columns = metric_columns(rows[first_row[whole]]) if whole.size else {}
    other = [(i, combine(rows[first_row[i]:first_row[i] + info[i, 3]].tolist()))
             for i in np.flatnonzero(done & (info[:, 3] > 1)).tolist()]
    sizes = np.asarray(nbytes, np.int64)
    return Batch(whole, columns, other, int(sizes[done].sum()),
                 [(i, int(sizes[i])) for i in np.flatnonzero(info[:, 0] == mapped.BIG).tolist()],
                 np.flatnonzero(~done & (info[:, 0] != mapped.BIG)).tolist())


def run_mapped(tasks: Sequence[Any], nbytes: Sequence[int], chunk: int, limit: int,
               compare_one: Callable[[Any], tuple[dict[str, Any], int]]) -> Batch:
    """Executor job: compare_mapped_pairs over `tasks`; each pair it could not take goes to `compare_one` (the
    per-pair path: (metrics or error, bytes)), which names the problem."""
    try:  # a failure of the call itself (numba cannot compile, say) leaves every pair to compare_one
        done = compare_mapped_pairs(tasks, nbytes, chunk, limit)
    except Exception:  # noqa: BLE001
        done = Batch(np.empty(0, np.int64), {}, [], 0, [], list(range(len(tasks))))
    extra = 0
    for i in done.rest:
        metrics, pair_bytes = compare_one(tasks[i])
        done.other.append((i, metrics))
        extra += pair_bytes
    return done._replace(rest=[], nbytes=done.nbytes + extra)
