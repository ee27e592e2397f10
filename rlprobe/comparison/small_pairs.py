"""Many small pairs of ``.npy`` files compared in one job, with no Python per file in the hot loop.

RL dumps hold many small tensors (keys x micro-batches x ranks x steps): at a few KB a pair, opening
files through ``np.load`` and scheduling one job per pair cost ~0.7 ms a pair where the kernel needs
microseconds, and that Python held the GIL, so more workers made it slower (issue 18). Here one job
takes a batch of pairs and one compiled call (rlprobe/comparison/file_kernels.pyx, without the GIL) opens,
reads and closes every file with POSIX ``open``/``pread``/``close`` into one buffer and parses each header; a
second compiled call runs the element kernel (kernels.pyx) over every pair whose two sides have
the kernel's dtype (float32, float64, int64). Pairs of other dtypes (token ids in int32, bool
masks, float16) are compared from the same buffer through ``chunk_partial``.

Only headers written the way numpy writes them (``{'descr': '<f4', 'fortran_order': False,
'shape': (4, 64), }``), little-endian or byte-sized, C order, are taken here. Anything else - a
missing, unreadable, truncated or corrupt file, a Fortran-order array, another header text, a
size or shape mismatch - is marked, and the executor compares that pair the per-pair way, which
names the file and the problem exactly as before. A pair's result is bit-identical to the per-pair
path: a small pair is one chunk, compared by the same kernel code.

Larger pairs (over SMALL_FILE_BYTES) go many to a job too (compare_mapped_pairs), with no Python and no GIL per
pair: one compiled call (file_kernels.compare_mapped) maps each pair's files and runs the element kernel
over them chunk by chunk. Compared one job a pair, each pair took the GIL several times, and a thread holding
the GIL for long (the later imports and the single-run rules run beside the pairs) kept a worker waiting up to
the interpreter's switch interval (5 ms) each time, where a pair of 1M float32 takes ~1-2 ms in the kernel; so
they go in jobs of MAPPED_JOB_BYTES, which take the GIL once to start and once to hand back their columns. Their
results are bit-identical to the per-pair path's too: the same kernel on the same chunks (multiples of `chunk`
in the flat index space), their partials combined as combine() combines them. A pair the compiled call does not
take (another dtype or a mixed pair, a header numpy did not write the plain way, a file that cannot be opened or
mapped, a size or shape mismatch) goes to the per-pair path, which names the problem; a pair over `limit`
elements is handed back for the executor to split between workers.
"""

from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from rlprobe.comparison import file_kernels
from rlprobe.comparison.partials import BIG, F4, F8, I8, OK, WIDTH, combine, metric_columns

__all__ = ["MAPPED_JOB_BYTES", "SMALL_FILE_BYTES", "Batch", "compare_mapped_pairs", "compare_small_pairs", "job_groups",
           "plan_jobs", "run_batch", "run_mapped"]

#: files up to this size are read whole into a batch; larger ones keep the streaming path
SMALL_FILE_BYTES = 1 << 20
BATCH_MIN = 16  # fewer small pairs than this go one by one
BATCH_PAIRS = 256  # pairs per batch job


def plan_jobs(tasks: list[Any], workers: int = 1) -> list[tuple[int, Any]]:
    """Jobs in task order, each with the position of its first task: lists of up to BATCH_PAIRS pairs
    for compare_small_pairs, at least one a worker (a batch is where its large files are found: the
    large workload's 256 pairs were one batch, and the second worker idled until it ended), or, with
    fewer than BATCH_MIN pairs, the tasks themselves (compared one by one)."""
    if len(tasks) < BATCH_MIN:
        return list(enumerate(tasks))
    size = min(BATCH_PAIRS, -(-len(tasks) // max(1, workers)))
    return [(i, tasks[i:i + size]) for i in range(0, len(tasks), size)]


def _dtype_of(code: int) -> np.dtype:
    from rlprobe.comparison.partials import KINDS

    kind, item = KINDS[code // 16], code % 16
    return np.dtype(f"{'|' if item == 1 else '<'}{kind}{item}")


def _aligned(nbytes: int, align: int) -> np.ndarray:
    raw = np.empty(nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + nbytes]


def path_bytes(paths: Sequence[Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """Every distinct path NUL-terminated in one array, and where each pair side's path starts (equal
    paths, such as the records of one packed file, share their start: file_kernels.read_files opens
    such a file once); None where a path holds a NUL."""
    first: dict[Any, int] = {}  # path -> its position among the distinct paths
    codes = [first.setdefault(p, len(first)) for p in paths]
    distinct = list(first)
    encoded = "\0".join(map(os.fspath, distinct)).encode() if distinct and isinstance(os.fspath(distinct[0]), str) \
        else None
    if encoded is None:  # bytes paths or a mix: encode one by one
        encoded = b"\0".join(os.fsencode(p) for p in distinct)
    arr = np.frombuffer(encoded + b"\0", np.uint8)
    nul = np.flatnonzero(arr == 0)
    if nul.size != len(distinct):
        return None
    starts = np.empty(len(distinct), np.int64)
    starts[0:1] = 0
    starts[1:] = nul[:-1] + 1
    return arr, starts[np.array(codes, np.int64)]


def record_arrays(tasks: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The byte offsets and lengths of sides a then b of each pair (PairTask's record_a, record_b: a record of
    a packed file, lake/tensor_pack.py), as the compiled reads take them: offset 0, length -1 for a whole file."""
    records = [getattr(t, "record_a", None) for t in tasks] + [getattr(t, "record_b", None) for t in tasks]
    offsets = np.array([0 if r is None else r.offset for r in records], np.int64)
    lengths = np.array([-1 if r is None or r.length is None else r.length for r in records], np.int64)
    return offsets, lengths


class Batch(NamedTuple):
    """What compare_small_pairs did with a batch (positions are indices into its task list):
    `rows` and `columns`, the pairs compared in the batch (a column per metric, see
    PairResults.put_rows); `other`, (position, metrics dict) of pairs compared otherwise;
    `nbytes`, the bytes of both files of all those; and the positions left to the per-pair path,
    `large` (a file over the limit: streamed, maybe split; with both files' bytes) and `rest`
    (a file it could not take: the per-pair path names the problem)."""

    rows: np.ndarray
    columns: dict[str, np.ndarray]
    other: list[tuple[int, dict[str, Any]]]
    nbytes: int
    large: list[tuple[int, int]]
    rest: list[int]


def _nothing_done(n: int) -> Batch:
    return Batch(np.empty(0, np.int64), {}, [], 0, [], list(range(n)))


def compare_small_pairs(tasks: Sequence[Any], limit: int = SMALL_FILE_BYTES) -> Batch:
    """Compare the pairs (PairTask) whose files have at most ``limit`` bytes (at most the chunk size,
    so that a pair is one chunk and its result is the per-pair path's, bit for bit) in one batch."""
    from rlprobe.comparison.pair_metrics import chunk_partial
    from rlprobe.comparison.pair_results import PairColumns

    n = len(tasks)
    columns = isinstance(tasks, PairColumns)  # paths and records read from the columns, no PairTask made
    located = path_bytes(tasks.paths() if columns else [t.path_a for t in tasks] + [t.path_b for t in tasks]) \
        if n else None
    if located is None:
        return _nothing_done(n)
    paths, path_starts = located
    offsets, lengths = tasks.record_arrays() if columns else record_arrays(tasks)
    info = np.zeros((2 * n, 4), np.int64)
    sizes = np.empty(2 * n, np.int64)
    buf = file_kernels.read_files(paths, path_starts, offsets, lengths, limit, info, sizes)
    a, b = info[:n], info[n:]
    pair_bytes = sizes[:n] + sizes[n:]

    ok = (a[:, 0] == OK) & (b[:, 0] == OK) & (a[:, 2] == b[:, 2])
    fast = ok & (a[:, 1] == b[:, 1]) & np.isin(a[:, 1], (F4, F8, I8))
    large = ((a[:, 0] == BIG) | (b[:, 0] == BIG)) & (sizes[:n] >= 0) & (sizes[n:] >= 0)
    picked = np.flatnonzero(fast)
    slow = np.flatnonzero(ok & ~fast)
    rows = np.empty((picked.size + slow.size, WIDTH), np.float64)
    if picked.size:
        file_kernels.compare_batch(buf, info, picked, picked + n, rows)
    for k, i in enumerate(slow.tolist(), picked.size):  # other dtypes: converted by chunk_partial, from the buffer
        ca = np.frombuffer(buf, _dtype_of(int(a[i, 1])), int(a[i, 2]), int(a[i, 3]))
        cb = np.frombuffer(buf, _dtype_of(int(b[i, 1])), int(b[i, 2]), int(b[i, 3]))
        rows[k] = chunk_partial(ca, cb, 0)
    picked = np.concatenate([picked, slow])
    columns = metric_columns(rows) if picked.size else {}
    other: list[tuple[int, dict[str, Any]]] = []
    return Batch(picked, columns, other, int(pair_bytes[ok].sum()),
                 [(i, int(pair_bytes[i])) for i in np.flatnonzero(large).tolist()],
                 np.flatnonzero(~ok & ~large).tolist())


def run_batch(batch: list[Any], chunk: int, compare_one: Callable[[Any], tuple[dict[str, Any], int]]) -> Batch:
    """Executor job: compare_small_pairs over `batch`; each pair it could not take goes to
    `compare_one` (the per-pair path: (metrics or error, bytes)), which names the problem."""
    try:  # a failure of the batch itself (say, no memory for its buffer) leaves every pair to compare_one
        done = compare_small_pairs(batch, min(SMALL_FILE_BYTES, chunk))
    except Exception:  # noqa: BLE001
        done = _nothing_done(len(batch))
    nbytes = done.nbytes
    for i in done.rest:
        metrics, pair_bytes = compare_one(batch[i])
        done.other.append((i, metrics))
        nbytes += pair_bytes
    return done._replace(rest=[], nbytes=nbytes)


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
    offsets, lengths = record_arrays(tasks)
    file_kernels.compare_mapped(paths, path_starts, offsets, lengths, limit, chunk, info, first_row, rows)
    done = info[:, 0] == OK
    whole = np.flatnonzero(done & (info[:, 3] == 1))  # one chunk: combine() of one partial, as columns
    columns = metric_columns(rows[first_row[whole]]) if whole.size else {}
    other = [(i, combine(rows[first_row[i]:first_row[i] + info[i, 3]].tolist()))
             for i in np.flatnonzero(done & (info[:, 3] > 1)).tolist()]
    sizes = np.asarray(nbytes, np.int64)
    return Batch(whole, columns, other, int(sizes[done].sum()),
                 [(i, int(sizes[i])) for i in np.flatnonzero(info[:, 0] == BIG).tolist()],
                 np.flatnonzero(~done & (info[:, 0] != BIG)).tolist())


def run_mapped(tasks: Sequence[Any], nbytes: Sequence[int], chunk: int, limit: int,
               compare_one: Callable[[Any], tuple[dict[str, Any], int]]) -> Batch:
    """Executor job: compare_mapped_pairs over `tasks`; each pair it could not take goes to `compare_one` (the
    per-pair path: (metrics or error, bytes)), which names the problem."""
    try:  # a failure of the call itself leaves every pair to compare_one
        done = compare_mapped_pairs(tasks, nbytes, chunk, limit)
    except Exception:  # noqa: BLE001
        done = Batch(np.empty(0, np.int64), {}, [], 0, [], list(range(len(tasks))))
    extra = 0
    for i in done.rest:
        metrics, pair_bytes = compare_one(tasks[i])
        done.other.append((i, metrics))
        extra += pair_bytes
    return done._replace(rest=[], nbytes=done.nbytes + extra)

