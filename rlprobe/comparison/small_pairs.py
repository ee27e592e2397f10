"""Many small pairs of ``.npy`` files compared in one job, with no Python per file in the hot loop.

RL dumps hold many small tensors (keys x micro-batches x ranks x steps): at a few KB a pair, opening
files through ``np.load`` and scheduling one job per pair cost ~0.7 ms a pair where the kernel needs
microseconds, and that Python held the GIL, so more workers made it slower (issue 18). Here one job
takes a batch of pairs and one compiled call (numba, ``nogil``) opens, reads and closes every file
with libc's ``open``/``pread``/``close`` into one buffer and parses each header; a second compiled
call runs the element kernel of rlprobe.comparison.pair_kernels over every pair whose two sides have
the kernel's dtype (float32, float64, int64). Pairs of other dtypes (token ids in int32, bool
masks, float16) are compared from the same buffer through ``chunk_partial``.

Only headers written the way numpy writes them (``{'descr': '<f4', 'fortran_order': False,
'shape': (4, 64), }``), little-endian or byte-sized, C order, are taken here. Anything else - a
missing, unreadable, truncated or corrupt file, a Fortran-order array, another header text, a
size or shape mismatch - is marked, and the executor compares that pair the per-pair way, which
names the file and the problem exactly as before. A pair's result is bit-identical to the per-pair
path: a small pair is one chunk, compared by the same kernel code.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Hashable, NamedTuple, Sequence

import numpy as np

from rlprobe.comparison.partials import WIDTH, metric_columns


__all__ = ["SMALL_FILE_BYTES", "Batch", "compare_small_pairs", "plan_jobs", "run_batch", "warm_up"]

#: files up to this size are read whole into a batch; larger ones keep the streaming path
SMALL_FILE_BYTES = 1 << 20
BATCH_MIN = 16  # fewer small pairs than this go one by one (no batch functions to load)
BATCH_PAIRS = 256  # pairs per batch job



def plan_jobs(tasks: list[Any], workers: int = 1) -> list[tuple[int, Any]]:
    """Jobs in task order, each with the position of its first task: lists of up to BATCH_PAIRS pairs
    for compare_small_pairs, at least one a worker (a batch is where its large files are found: the
    large workload's 256 pairs were one batch, and the second worker idled until it ended), or, with
    fewer than BATCH_MIN pairs, the tasks themselves (compared one by one: no batch functions to load)."""
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
    paths, such as the records of one packed file, share their start: batch_kernels.read_files opens
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
    from rlprobe.comparison.compiled import batch_functions
    from rlprobe.comparison.pair_metrics import chunk_partial

    bk = batch_functions()  # ahead-of-time compiled or numba's JIT kernels: the same bits
    from rlprobe.comparison.pair_columns import PairColumns

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
    buf = bk.read_files(paths, path_starts, offsets, lengths, limit, info, sizes)
    a, b = info[:n], info[n:]
    pair_bytes = sizes[:n] + sizes[n:]

    ok = (a[:, 0] == bk.OK) & (b[:, 0] == bk.OK) & (a[:, 2] == b[:, 2])
    fast = ok & (a[:, 1] == b[:, 1]) & np.isin(a[:, 1], (bk.F4, bk.F8, bk.I8))
    large = ((a[:, 0] == bk.BIG) | (b[:, 0] == bk.BIG)) & (sizes[:n] >= 0) & (sizes[n:] >= 0)
    picked = np.flatnonzero(fast)
    slow = np.flatnonzero(ok & ~fast)
    rows = np.empty((picked.size + slow.size, WIDTH), np.float64)
    if picked.size:
        bk.compare_batch(buf, info, picked, picked + n, rows)
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
    try:  # a failure of the batch itself (numba cannot compile, say) leaves every pair to compare_one
        done = compare_small_pairs(batch, min(SMALL_FILE_BYTES, chunk))
    except Exception:  # noqa: BLE001
        done = _nothing_done(len(batch))
    nbytes = done.nbytes
    for i in done.rest:
        metrics, pair_bytes = compare_one(batch[i])
        done.other.append((i, metrics))
        nbytes += pair_bytes
    return done._replace(rest=[], nbytes=nbytes)


def warm_up() -> None:
    """Compile (or load from numba's on-disk cache) the batch functions, on two tiny pairs of files."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rlprobe-warm-") as tmp:
        tasks = []
        for i, dtype in enumerate((np.float32, np.float64, np.int64)):
            path = os.path.join(tmp, f"{i}.npy")
            np.save(path, np.zeros(2, dtype))
            tasks.append(_Task(i, path, path))
        compare_small_pairs(tasks)


class _Task(NamedTuple):
    task_id: Hashable
    path_a: str
    path_b: str
