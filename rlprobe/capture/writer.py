"""The background writer: one thread that turns staged tensors into files and stats rows.

The training thread only stages tensors and queues work. Save calls, the ends of steps and
scalars are deferred (`defer`): the writer takes them in one go when they are due, once per
`flush_interval` (or sooner, when CALL_BATCH_BYTES or CALL_BATCH_COUNT of them wait, or another
job is submitted), and works the calls out together (capture/key_data_rows.py): its Python, which
holds the GIL the training thread needs, then runs once per commit instead of once per call.
Memory in flight is bounded by `max_inflight_bytes`; when the bound is reached `submit` waits
(back-pressure) instead of dropping data or growing without bound. Failures are collected,
never raised on this thread; the probe reports them on its next call.

With RLPROBE_WRITER_PROCESS=1 a call's key data is worked out by the writer process
(capture/writer_process.py) when its snapshots lie in the host staging ring. Ended steps are committed
(their stats part and the rank manifest written) at most once per `flush_interval` seconds: after the job
that makes a commit due, or when the interval runs out while the queue is idle.

When a step ends (`step_ended`), work that would fall due before the next step ends (at the last step's
pace) is started at once: the writer's burst then runs at the beginning of a step, which for RL trainers is
the rollout's many small single-threaded ops, instead of wherever its timer happened to run out (in a
backward pass, whose larger ops use both cores, it cost more: docs/trl.md, "Thirteenth pass"). Work is never
started later than its own time, so what a crash can lose is as before.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from rlprobe.capture.calls import SaveCall, short_switch_interval
from rlprobe.frameworks.base import StagedLeaf
from rlprobe.lake.encoding import narrow_integers, widen
from rlprobe.lake.rank_writer import RankWriter
from rlprobe.lake.samples import OccurrenceCounter
from rlprobe.lake.statistics import (STACK_BYTES, STATISTICS, bitwise_hash, consecutive_chunks, host_statistics,
                                     host_statistics_many)

if TYPE_CHECKING:
    from rlprobe.capture.calls import WriterProcessHandle

RETRY_S = 1.0  # the least wait before retrying a failed commit
# save calls go to the writer together: at a step's end (or any other job), or once this many bytes or
# calls wait (their snapshots hold staging memory until the writer is done); once a step has ended, the
# calls over CALL_BATCH_COUNT wait for the next step's end, up to twice as many (step_ended)
CALL_BATCH_BYTES = 1 << 20
CALL_BATCH_COUNT = 64


class BackgroundWriter:
    def __init__(self, sink: RankWriter, max_inflight_bytes: int, flush_interval: float = 0.0,
                 process: WriterProcessHandle | None = None, prepare_calls: Callable[..., list] | None = None):
        # part merges need pyarrow.compute, whose import holds the GIL for ~100 ms: imported on the thread
        # setting the probe up, not on the writer thread, where it stalled the first saves (~100 ms
        # instead of ~7, benchmarks/save_overhead.py --cold)
        import pyarrow.compute  # noqa: F401

        self.sink = sink
        self.prepare_calls = prepare_calls  # deferred save calls -> a publisher each (writer_process.prepare_calls)
        self.samples = OccurrenceCounter()  # the sample rows' occurrence counts (writer thread only)
        self.process = process  # the writer process that works out key data (None: this thread does)
        self.session = process.session() if process is not None else 0
        self.samples_remote = False  # the occurrence counts are the writer process's (it has the newer ones)
        self.max_inflight = max_inflight_bytes
        self.flush_interval = flush_interval
        self._retry_at = 0.0  # after a failed commit: not before this time
        self._inflight = 0
        self._cond = threading.Condition()
        self._queue: queue.SimpleQueue[tuple[Callable[[], None], int, int | None] | None] = queue.SimpleQueue()
        self._errors: list[str] = []
        self._errors_lock = threading.Lock()
        # work of the training thread not handed over yet (save calls, the ends of steps, scalars), taken
        # in one go once per flush_interval: the writer's Python competes for the GIL once a commit,
        # and a step's fixed costs (a sample table, a statistics pass) are shared by its steps
        self._deferred: list[tuple[Any, int | None, bool]] = []  # (save call or job, step, is a save call)
        self._deferred_bytes = 0
        self._deferred_calls = 0  # save calls among the deferred work
        self._deferred_since = 0.0
        self._deferred_lock = threading.Lock()
        self._last_step_end: float | None = None  # when the training thread last ended a step (step_ended)
        self._thread = threading.Thread(target=self._run, name=f"rlprobe-writer-rank{sink.rank}", daemon=True)
        self._thread.start()

    # -- training thread -----------------------------------------------------------------
    def defer(self, item: SaveCall | Callable[[], None], nbytes: int = 0, step: int | None = None,
              call: bool = False) -> None:
        """Queue a save call (`call`) or a small job (`step`: the probe step whose rows it adds), taken within
        flush_interval seconds, or sooner when CALL_BATCH_BYTES/COUNT wait or a job is submitted (`hand_over`)."""
        with self._deferred_lock:
            first = not self._deferred
            self._deferred.append((item, step, call))
            self._deferred_bytes += nbytes
            self._deferred_calls += call
            if first:
                self._deferred_since = time.monotonic()
            # once steps end, a count over the limit waits for the next step's end (step_ended), up to twice it
            count = CALL_BATCH_COUNT if self._last_step_end is None else 2 * CALL_BATCH_COUNT
            full = self._deferred_bytes >= CALL_BATCH_BYTES or self._deferred_calls >= count
        if full:
            self.hand_over()
        elif first:
            self._queue.put((_wake, 0, None))  # the writer's next wait ends when these are due

    def hand_over(self, horizon: float = 0.0) -> None:
        """Queue the deferred work as one job (any other job first does this: jobs keep their order);
        `horizon`: a commit due by then (time.monotonic()) is made at the end of that job."""
        items, nbytes = self._take_deferred()
        if items:
            self._put(lambda: self._run_deferred(items, horizon), nbytes, None)

    def step_ended(self) -> None:
        """Training thread, once a step's end is deferred: hand over now the work (and the commit) that would
        fall due before the next step ends, if that one takes as long as this one did (at most
        flush_interval), and CALL_BATCH_COUNT save calls or more, so that the writer works at the step
        boundary rather than in the middle of a step."""
        now = time.monotonic()
        last, self._last_step_end = self._last_step_end, now
        if last is None or not self.flush_interval:
            return
        horizon = now + min(now - last, self.flush_interval)
        with self._deferred_lock:
            waiting = bool(self._deferred)
            due = waiting and (self._deferred_since + self.flush_interval <= horizon
                               or self._deferred_calls >= CALL_BATCH_COUNT)
        # last_flush is the writer thread's (a float: read as it is); the ended step is among the deferred work
        if due or (waiting and self.sink.last_flush + self.flush_interval <= horizon):
            self.hand_over(horizon)

    def _take_deferred(self) -> tuple[list[tuple[Any, int | None, bool]], int]:
        with self._deferred_lock:
            items, nbytes = self._deferred, self._deferred_bytes
            self._deferred, self._deferred_bytes, self._deferred_calls = [], 0, 0
        return items, nbytes

    def submit(self, job: Callable[[], None], nbytes: int = 0, step: int | None = None) -> None:
        """Queue `job`; `step`: the probe step whose rows it adds, never committed if the job fails."""
        self.hand_over()
        self._put(job, nbytes, step)

    def _put(self, job: Callable[[], None], nbytes: int, step: int | None) -> None:
        with self._cond:
            while self._inflight > 0 and self._inflight + nbytes > self.max_inflight:
                self._cond.wait()
            self._inflight += nbytes
        self._queue.put((job, nbytes, step))

    def wait_idle(self) -> None:
        done = threading.Event()
        self.submit(done.set)
        while not done.wait(0.5):
            if not self._thread.is_alive():
                raise RuntimeError("rlprobe writer thread died")

    def take_errors(self) -> list[str]:
        with self._errors_lock:
            errors, self._errors = self._errors, []
        return errors

    def stop(self) -> None:
        self.hand_over()
        self._queue.put(None)
        self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- writer thread -------------------------------------------------------------------
    def report(self, errors: list[str]) -> None:
        if errors:
            with self._errors_lock:
                self._errors.extend(errors)

    def _deferred_wait(self) -> float | None:
        """Seconds until the deferred work is due (flush_interval after the first of it); None: none."""
        with self._deferred_lock:
            if not self._deferred:
                return None
            return max(0.0, self._deferred_since + self.flush_interval - time.monotonic())

    def _run_deferred(self, items: list[tuple[Any, int | None, bool]], horizon: float = 0.0) -> None:
        """The deferred work: its save calls worked out together (`prepare_calls`), then each call's
        rows published and each small job run in the order they came, committing when due after
        each, as when each was a job of its own; at its end, also when due by `horizon` (step_ended)."""
        calls = [item for item, _, is_call in items if is_call]
        publish: dict[int, Callable[[], None]] = {}
        if calls:
            def prepare() -> None:
                assert self.prepare_calls is not None, "save calls deferred to a writer without prepare_calls"
                publish.update(zip(map(id, calls), self.prepare_calls(self, calls)))

            self._run_job(prepare, *sorted({c.step for c in calls}))
        for item, step, is_call in items:
            if is_call:
                if id(item) in publish:  # else its preparation failed, and its step is marked incomplete
                    self._run_job(publish[id(item)], item.step)
            else:
                self._run_job(item, step)
            if self._commit_wait() == 0.0:
                self._commit()
        if horizon and self._commit_wait(horizon) == 0.0:
            self._commit()

    def _run_job(self, job: Callable[[], None], *steps: int | None) -> None:
        """Run `job`; when it fails, `steps` (the probe steps whose rows it adds) are not committed."""
        try:
            job()
        except Exception as e:  # a bug or an unexpected failure must not kill the thread
            for step in steps or (None,):
                at = "" if step is None else f" (step {step}: not committed, its rows are incomplete)"
                message = f"rlprobe writer: {type(e).__name__}: {e}{at}"
                self.sink.record_error(message, None if step is None else {"step": step, "what": "rows"},
                                       incomplete_step=step)
                self.report([message])

    def _commit_wait(self, horizon: float = 0.0) -> float | None:
        """Seconds until the ended steps are due to be committed (counted from `horizon` when it is later
        than now); None when none are waiting."""
        if not self.sink.pending_steps:
            return None
        due = max(self.sink.last_flush + self.flush_interval, self._retry_at)
        return max(0.0, due - max(time.monotonic(), horizon))

    def _commit(self) -> None:
        try:
            errors = self.sink.flush()
        except Exception as e:
            errors = [f"rlprobe writer: committing steps {self.sink.pending_steps}: {type(e).__name__}: {e}"]
        self.report(errors)
        # a commit whose parts could not be written (a full disk) keeps its steps pending: retry,
        # but not in a tight loop
        self._retry_at = time.monotonic() + max(self.flush_interval, RETRY_S) if self.sink.pending_steps else 0.0

    def _run(self) -> None:
        while True:
            waits = [w for w in (self._commit_wait(), self._deferred_wait()) if w is not None]
            try:
                item = self._queue.get(timeout=min(waits) if waits else None)
            except queue.Empty:  # an interval ran out with nothing queued: the deferred work is the newest
                item = (self._run_deferred_if_due, 0, None)
            if item is None:
                return
            job, nbytes, step = item
            with short_switch_interval():  # the training thread's GIL waits stay short while this works
                try:
                    self._run_job(job, step)
                finally:
                    item = job = None  # let the job's buffers go before waiting for the next one
                    with self._cond:
                        self._inflight -= nbytes
                        self._cond.notify_all()
                if self._commit_wait() == 0.0:
                    self._commit()

    def _run_deferred_if_due(self) -> None:
        if self._deferred_wait() == 0.0:
            self._run_deferred(self._take_deferred()[0])


def _wake() -> None:  # queued when deferred work starts waiting: the writer works out when it is due
    pass


@dataclass
class TensorRow:
    """One staged tensor on the writer thread: its row's key columns and where its .npy goes."""

    leaf: StagedLeaf
    keys: dict[str, Any]  # the row key and the other columns that are not statistics (framework, ...)
    where: str  # for messages: "key 'x' step 3 micro_step 0"
    tensor_path: Path | str | None  # a str is relative to the dump root; None: statistics only


def write_tensor_rows(writer: BackgroundWriter, kind: str, items: list[TensorRow]) -> None:
    """Writer-thread job: statistics, hash and (optionally) the .npy of each tensor, one row each.

    Small tensors are taken a few at a time (STACK_BYTES in all), so that their statistics are
    one numpy call per statistic for the lot (lake/statistics.py). A tensor whose statistics
    cannot be computed is recorded as lost; one whose file cannot be written keeps its
    statistics row (tensor_file null). Host copies are released as soon as their chunk is done, so staging
    memory returns to the ring in order. (Key data, whose tensors go into packed files, is written as
    columns: capture/key_data_rows.py.)"""
    sink = writer.sink
    errors: list[str] = []
    rows: list[dict[str, Any]] = []
    for chunk in _chunks(items):
        try:
            rows.extend(_tensor_rows(chunk, kind, sink, errors))
        finally:
            for item in chunk:
                item.leaf.raw = None
                if item.leaf.release is not None:
                    item.leaf.release()
    for row in rows:
        sink.add_row(kind, row)
    writer.report(errors)


def _chunks(items: list[TensorRow]) -> list[list[TensorRow]]:
    """Consecutive items of at most STACK_BYTES of host copies in all (a larger one alone)."""
    return [[items[i] for i in run] for run in consecutive_chunks([item.leaf.nbytes for item in items], STACK_BYTES)]


def _tensor_rows(chunk: list[TensorRow], kind: str, sink: RankWriter, errors: list[str]) -> list[dict[str, Any]]:
    ready: list[tuple[TensorRow, np.ndarray | None]] = []
    for item in chunk:
        try:
            if item.leaf.finish is not None:
                item.leaf.finish()
            ready.append((item, widen(item.leaf.raw, item.leaf.dtype) if item.leaf.raw is not None else None))
        except Exception as e:
            _lose(item, kind, sink, errors, e)
    wanted = [i for i, (item, values) in enumerate(ready)
              if values is not None and any(s.name not in (item.leaf.device_stats or ()) for s in STATISTICS)]
    host: list[dict[str, Any] | Exception | None] = [None] * len(ready)
    for i, stats in zip(wanted, _host_statistics([ready[i][1] for i in wanted])):  # type: ignore[misc]
        host[i] = stats
    rows = []
    for (item, values), stats in zip(ready, host):
        row = _tensor_row(item, values, stats, kind, sink, errors)
        if row is not None:
            rows.append(row)
    return rows


def _host_statistics(arrays: list[np.ndarray]) -> list[dict[str, Any] | Exception]:
    """host_statistics of each array, the small ones stacked; one that fails gives its exception."""
    try:
        return host_statistics_many(arrays)  # type: ignore[return-value]
    except Exception:
        out: list[dict[str, Any] | Exception] = []
        for values in arrays:  # one at a time, to lose only the one that fails
            try:
                out.append(host_statistics(values))
            except Exception as e:
                out.append(e)
        return out


def _lose(item: TensorRow, kind: str, sink: RankWriter, errors: list[str], e: BaseException) -> None:
    lost = {"kind": kind, **{k: v for k, v in item.keys.items() if k not in ("framework", "absent")}}
    msg = f"{item.where}: could not compute statistics: {type(e).__name__}: {e}"
    sink.record_error(msg, {**lost, "what": "row"}, incomplete_step=item.keys.get("step"))
    errors.append(msg)


def _tensor_row(item: TensorRow, values: np.ndarray | None, host: dict[str, Any] | Exception | None, kind: str,
                sink: RankWriter, errors: list[str]) -> dict[str, Any] | None:
    leaf = item.leaf
    try:
        if isinstance(host, Exception):
            raise host
        stats = leaf.device_stats or {}  # the device's statistics win over the host's (one merge, no copies)
        if host is not None:
            stats = {**host, **stats} if stats else host
        row: dict[str, Any] = {
            **item.keys, "dtype": leaf.dtype, "shape": list(leaf.shape), "numel": math.prod(leaf.shape), **stats,
            "hash": bitwise_hash(leaf.raw) if leaf.raw is not None else None, "tensor_file": None,
        }
    except Exception as e:
        _lose(item, kind, sink, errors, e)
        return None
    if item.tensor_path is not None and values is not None:
        try:
            stored = narrow_integers(values, stats.get("min"), stats.get("max"))
            row["tensor_file"] = sink.write_tensor(item.tensor_path, stored)
        except OSError as e:
            path = item.tensor_path if isinstance(item.tensor_path, Path) else sink.layout.root / item.tensor_path
            msg = f"{item.where}: tensor not written to {path}: {e}; its statistics are kept"
            lost = {"kind": kind, **{k: v for k, v in item.keys.items() if k not in ("framework", "absent")}}
            sink.record_error(msg, {**lost, "what": "tensor"})
            errors.append(msg)
    return row
