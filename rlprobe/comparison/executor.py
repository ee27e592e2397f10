"""Local executor: compare many pairs of ``.npy`` files in parallel threads.

The pair kernels release the GIL (``nogil=True``), and so does reading with ``os.preadv``
(reading a memory map is plain memory access inside the kernel), so a
:class:`concurrent.futures.ThreadPoolExecutor` gives real parallelism with no process
start-up and no pickling. Pairs larger than ``split_elements`` are cut into ranges (at
multiples of the chunk size, so the result is bit-identical to a one-shot pass) that run on
all workers, so one big tensor does not serialise the run. Many small pairs go in batches
(rlprobe.comparison.small_pairs: no Python and no GIL per file), and the larger pairs such a batch finds in
jobs of several pairs each, mapped and compared in one compiled call (rlprobe.comparison.small_pairs).

Memory stays bounded whatever the tensor sizes: files are opened with
``np.load(mmap_mode='r')`` (which validates the header and the file length) and compared
chunk by chunk (``chunk`` elements) straight from the memory map (``io="mmap"``, the
default), dropping the pages of each chunk from the process with ``madvise(MADV_DONTNEED)``
once compared, because mapped file pages otherwise stay in the resident set until the map is
closed. ``io="pread"`` copies each chunk into a reusable per-thread buffer (``os.preadv``):
slower (2 GB pair, 2 threads: 7.2 GB/s, mmap 11.1 GB/s; ``benchmarks/pair_memory.py``), but a
file truncated *while* it is compared becomes an error row where the map gives SIGBUS.

The Ray executor (run_pairs_ray): the pair kernels as Ray tasks, for comparisons spread over a cluster.
Called like run_pairs and returns the same ``{task_id: metrics}``: each Ray task compares a batch of pairs with
the local kernels (so the numbers are bit-identical to the local executor). Every node must see the dump files
at the same paths (a shared filesystem). ``address="auto"`` (or ``ray://host:port``) joins a running cluster;
without an address a local Ray instance is started (``num_cpus=workers``, no dashboard) unless one is already
running in this process. Ray is imported only there.
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Any, Callable, Hashable, Iterable

import numpy as np

from rlprobe.comparison.flat_sources import chunk_bounds
from rlprobe.comparison.npy_files import NpyFile, PairError
from rlprobe.comparison.pair_metrics import DEFAULT_CHUNK, Partial, chunk_partial, combine, common_dtype, ranges
from rlprobe.comparison.pair_results import PairColumns, PairResults, PairTask
from rlprobe.comparison.small_pairs import job_groups, plan_jobs, run_batch, run_mapped
from rlprobe.lake.tensor_pack import Record

__all__ = ["DEFAULT_SPLIT_ELEMENTS", "PairTask", "run_pairs", "run_pairs_ray"]

DEFAULT_SPLIT_ELEMENTS = 8 * 1024 * 1024


_READ_BYTES = 1 << 20  # read at least this much per call, in whole chunks (larger gave no gain)


def _compare_range(fa: NpyFile, fb: NpyFile, start: int, stop: int, chunk: int) -> list[Partial]:
    """Partials of [start, stop), one per chunk; files are read in blocks of whole chunks."""
    item = max(fa.dtype.itemsize, fb.dtype.itemsize)
    block = chunk * max(1, _READ_BYTES // (chunk * item))
    out: list[Partial] = []
    for bs, be in chunk_bounds(start, stop, block):
        ca = fa.read(bs, be)
        cb = fb.read(bs, be)
        for s, e in chunk_bounds(bs, be, chunk):
            out.append(chunk_partial(ca[s - bs:e - bs], cb[s - bs:e - bs], s))
        fa.release(bs, be)
        fb.release(bs, be)
    return out


class _Split:
    """A pair cut into ranges that run as separate jobs."""

    def __init__(self, task: PairTask, fa: NpyFile, fb: NpyFile, parts: list[tuple[int, int]]):
        self.task = task
        self.fa = fa
        self.fb = fb
        self.parts = parts
        self.remaining = len(parts)
        self.partials: list[Partial] = []
        self.error: str | None = None
        self.reported_bytes = 0
        self.row = -1  # the pair's row in run_pairs' results

    def close(self) -> None:
        self.fa.close()
        self.fb.close()


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, PairError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _shape_text(f: NpyFile) -> str:
    return f"{f.path} has shape {list(f.shape)} ({f.size} elements)"


def _open_pair(task: PairTask, io: str, chunk: int, split_elements: int, workers: int):
    """Job: open a pair; compare it whole, or hand back a split plan for a big one."""
    fa = fb = None
    try:
        fa = NpyFile(os.fspath(task.path_a), 0, io, task.record_a)
        fb = NpyFile(os.fspath(task.path_b), 1, io, task.record_b)
        if fa.size != fb.size:
            raise PairError(f"shape mismatch: {_shape_text(fa)}, {_shape_text(fb)}")
        try:
            common_dtype(fa.dtype, fb.dtype)
        except TypeError as exc:
            raise PairError(f"cannot compare {fa.path} ({fa.dtype}) with {fb.path} ({fb.dtype}): {exc}") from None
        n = fa.size
        if workers > 1 and n > split_elements:
            parts = ranges(n, -(-n // split_elements), align=chunk)
            if len(parts) > 1:
                split = _Split(task, fa, fb, parts)
                fa = fb = None  # owned by the split now
                return "split", split
        return "done", (task, combine(_compare_range(fa, fb, 0, n, chunk)))
    except Exception as exc:  # noqa: BLE001 - one bad pair must not stop the others
        return "done", (task, {"error": _error_text(exc)})
    finally:
        if fa is not None:
            fa.close()
        if fb is not None:
            fb.close()


def _run_part(split: _Split, start: int, stop: int, chunk: int):
    """Job: one range of a split pair."""
    if split.error is not None:
        return "part", (split, start, stop, None, None)
    try:
        return "part", (split, start, stop, _compare_range(split.fa, split.fb, start, stop, chunk), None)
    except Exception as exc:  # noqa: BLE001
        return "part", (split, start, stop, None, _error_text(exc))


def _open_one(task: PairTask, io: str, chunk: int, split_elements: int) -> tuple[dict[str, Any], int]:
    """A pair a batch could not take, compared the per-pair way (one worker: never split), and its bytes."""
    _, (_, metrics) = _open_pair(task, io, chunk, split_elements, 1)
    return metrics, _pair_bytes(task)


def _pair_bytes(task: PairTask) -> int:
    return _file_size(task.path_a, task.record_a) + _file_size(task.path_b, task.record_b)


def _file_size(path: Any, record: Record | None = None) -> int:
    if record is not None and record.length is not None:
        return record.length
    try:
        return os.stat(path).st_size
    except (OSError, TypeError, ValueError):
        return 0


def _run_batch(batch: list[PairTask], io: str, chunk: int, split_elements: int):
    """Job: a batch of small pairs (rlprobe.comparison.small_pairs); a pair it cannot take is compared
    the per-pair way."""
    return "batch", run_batch(batch, chunk, partial(_open_one, io=io, chunk=chunk, split_elements=split_elements))


def _run_mapped(tasks: list[PairTask], nbytes: list[int], io: str, chunk: int, limit: int, split_elements: int):
    """Job: larger pairs a batch found, several at once (rlprobe.comparison.small_pairs); a pair it cannot take is
    compared the per-pair way, one over `limit` elements handed back to be split."""
    return "mapped", run_mapped(tasks, nbytes, chunk, limit,
                                partial(_open_one, io=io, chunk=chunk, split_elements=split_elements))


def run_pairs(
    tasks: Iterable[PairTask] | PairColumns,
    workers: int = 2,
    progress: Callable[[int, int], None] | None = None,
    split_elements: int = DEFAULT_SPLIT_ELEMENTS,
    *,
    chunk: int = DEFAULT_CHUNK,
    io: str = "mmap",
) -> PairResults:
    """Compare every pair of ``.npy`` files; returns ``{task_id: metrics}`` (a PairResults: the same
    mapping, held column by column, rlprobe.comparison.pair_results): the dict of
    :func:`rlprobe.comparison.pair_metrics.combine`, or ``{"error": message}`` (a missing, truncated or
    corrupt file, named; ``"shape mismatch: ..."``; a dtype that cannot be compared). Flat, C order.

    ``workers`` threads run the jobs: pairs one by one, pairs over ``split_elements`` elements cut
    into ranges, and, from ``small_pairs.BATCH_MIN`` pairs on, batches of small pairs
    (rlprobe.comparison.small_pairs). ``progress(done_bytes, total_bytes)`` is called from this thread
    after each job, in bytes of both files (in batches a file joins the total once read). ``chunk``:
    elements read and compared at a time; ``io``: ``"mmap"`` (memory map, pages dropped per chunk)
    or ``"pread"`` (a reused buffer).
    """
    tasks = tasks if isinstance(tasks, PairColumns) else list(tasks)  # columns: no PairTask a pair made here
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if split_elements < 1 or chunk < 1:
        raise ValueError(f"split_elements and chunk must be >= 1, got {split_elements}, {chunk}")
    if io not in ("pread", "mmap"):
        raise ValueError(f"io must be 'pread' or 'mmap', got {io!r}")
    ids = list(tasks.task_ids) if isinstance(tasks, PairColumns) else [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate task_id {next(i for i in ids if ids.count(i) > 1)!r}")

    results = PairResults(ids)
    if not tasks:
        if progress is not None:
            progress(0, 0)
        return results

    jobs = plan_jobs(tasks, workers)
    # bytes of each pair's files (by row): up front for pairs compared one by one; a batch sizes its
    # own files (GIL-free), so with batches the total grows as they report
    pair_bytes = {row: _pair_bytes(t) for row, t in jobs if isinstance(t, PairTask)}
    total = sum(pair_bytes.values())
    done_bytes = 0
    max_inflight = max(2, 2 * workers)  # bounds open files and queued work

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlprobe-compare")
    pending: set[Future] = set()
    job_of: dict[Future, tuple[int, Any]] = {}  # a pair's or a batch's first row, and the batch
    open_splits: set[_Split] = set()
    todo = iter(jobs)
    exhausted = False

    def submit_pair(row: int, task: PairTask) -> None:
        fut = pool.submit(_open_pair, task, io, chunk, split_elements, workers)
        job_of[fut] = (row, None)
        pending.add(fut)

    # with more than one worker a pair over split_elements is split between them (the per-pair path)
    mapped_limit = split_elements if workers > 1 else 1 << 62

    def submit_large(row: int, batch: list[PairTask], large: list[tuple[int, int]]) -> None:
        """The larger pairs a batch found: jobs of several (small_pairs.compare_mapped_pairs), or one by one where io is pread."""
        for i, nbytes in large:
            pair_bytes[row + i] = nbytes
        if io != "mmap":
            for i, _ in large:
                submit_pair(row + i, batch[i])
            return
        for group in job_groups(large):
            rows = [row + i for i, _ in group]
            fut = pool.submit(_run_mapped, [batch[i] for i, _ in group], [b for _, b in group], io, chunk,
                              mapped_limit, split_elements)
            job_of[fut] = (rows, [batch[i] for i, _ in group])
            pending.add(fut)

    try:
        while True:
            while not exhausted and len(pending) < max_inflight:
                row, job = next(todo, (None, None))
                if job is None:
                    exhausted = True
                    break
                if isinstance(job, PairTask):
                    submit_pair(row, job)
                else:
                    fut = pool.submit(_run_batch, job, io, chunk, split_elements)
                    job_of[fut] = (row, job)
                    pending.add(fut)
            if not pending:
                break
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                kind, payload = fut.result()
                row, batch = job_of.pop(fut, (None, None))
                if kind == "done":
                    _, metrics = payload
                    results.put(row, metrics)
                    done_bytes += pair_bytes[row]
                elif kind == "batch":
                    results.put_rows(row + payload.rows, payload.columns)
                    for i, metrics in payload.other:
                        results.put(row + i, metrics)
                    done_bytes += payload.nbytes
                    total += payload.nbytes
                    total += sum(nbytes for _, nbytes in payload.large)
                    submit_large(row, batch, payload.large)
                elif kind == "mapped":  # `row`: the rows of the job's pairs
                    rows = np.asarray(row, np.int64)
                    results.put_rows(rows[payload.rows], payload.columns)
                    for i, metrics in payload.other:
                        results.put(row[i], metrics)
                    done_bytes += payload.nbytes
                    for i, nbytes in payload.large:  # over the limit: split between the workers
                        submit_pair(row[i], batch[i])
                elif kind == "split":
                    split = payload
                    split.row = row
                    open_splits.add(split)
                    for s, e in split.parts:
                        pending.add(pool.submit(_run_part, split, s, e, chunk))
                    continue
                else:  # a range of a split pair
                    split, s, e, partials, error = payload
                    split.remaining -= 1
                    if error is not None and split.error is None:
                        split.error = error
                    if partials is not None:
                        split.partials.extend(partials)
                    pb = pair_bytes[split.row]
                    step = pb * (e - s) // max(1, split.fa.size)
                    if split.remaining == 0:
                        step = pb - split.reported_bytes
                        split.close()
                        open_splits.discard(split)
                        results.put(split.row, {"error": split.error} if split.error is not None
                                    else combine(split.partials))
                    split.reported_bytes += step
                    done_bytes += step
                if progress is not None:
                    progress(done_bytes, total)
    finally:
        for fut in pending:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        for split in open_splits:  # only after an exception
            split.close()
    return results


TASKS_PER_WORKER = 4  # batches per worker: enough to balance, few enough to keep overhead low


def _compare_batch(batch: list[tuple[Hashable, str, str]]) -> list[tuple[Hashable, dict[str, Any]]]:
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
