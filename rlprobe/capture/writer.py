"""The background writer: one thread that turns staged tensors into files and stats rows.

The training thread only stages tensors and queues jobs. Memory in flight is bounded by
`max_inflight_bytes`; when the bound is reached `submit` waits (back-pressure) instead of
dropping data or growing without bound. Failures are collected, never raised on this
thread; the probe reports them on its next call.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from rlprobe.frameworks.base import StagedLeaf
from rlprobe.lake.encoding import narrow_integers, widen
from rlprobe.lake.layout import DumpLayout
from rlprobe.lake.rank_writer import RankWriter
from rlprobe.lake.statistics import STATISTICS, bitwise_hash, host_statistics


@dataclass
class LeafJob:
    key: str
    index: str
    micro_step: int
    framework: str
    leaf: StagedLeaf


class BackgroundWriter:
    def __init__(self, sink: RankWriter, max_inflight_bytes: int):
        self.sink = sink
        self.max_inflight = max_inflight_bytes
        self._inflight = 0
        self._cond = threading.Condition()
        self._queue: queue.SimpleQueue[tuple[Callable[[], None], int] | None] = queue.SimpleQueue()
        self._errors: list[str] = []
        self._errors_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"rlprobe-writer-rank{sink.rank}", daemon=True)
        self._thread.start()

    # -- training thread -----------------------------------------------------------------
    def submit(self, job: Callable[[], None], nbytes: int = 0) -> None:
        with self._cond:
            while self._inflight > 0 and self._inflight + nbytes > self.max_inflight:
                self._cond.wait()
            self._inflight += nbytes
        self._queue.put((job, nbytes))

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

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, nbytes = item
            try:
                job()
            except Exception as e:  # a bug or an unexpected failure must not kill the thread
                self.report([f"rlprobe writer: {type(e).__name__}: {e}"])
            finally:
                item = job = None  # let the job's buffers go before waiting for the next one
                with self._cond:
                    self._inflight -= nbytes
                    self._cond.notify_all()


def write_key_data(writer: BackgroundWriter, layout: DumpLayout, step: int, jobs: list[LeafJob], save_tensors: bool) -> None:
    """Writer-thread job: stats, hash and (optionally) the .npy of each tensor of one save call."""
    sink = writer.sink
    errors: list[str] = []
    for job in jobs:
        row = None
        try:
            row = _key_data_row(job, step, sink, layout, save_tensors, errors)
        finally:
            job.leaf.raw = None  # drop the host copy now, not when the job list dies
            if job.leaf.release is not None:
                job.leaf.release()
        if row is not None:
            sink.add_row("key_data", row)
    writer.report(errors)


def _key_data_row(job: LeafJob, step: int, sink: RankWriter, layout: DumpLayout, save_tensors: bool,
                  errors: list[str]) -> dict[str, Any] | None:
    leaf = job.leaf
    where = f"key {job.key!r} step {step} micro_step {job.micro_step}" + (f" index {job.index!r}" if job.index else "")
    lost = {"kind": "key_data", "key": job.key, "step": step, "micro_step": job.micro_step, "index": job.index}
    try:
        if leaf.finish is not None:
            leaf.finish()
        values = widen(leaf.raw, leaf.dtype) if leaf.raw is not None else None
        stats = dict(leaf.device_stats or {})
        if values is not None and any(s.name not in stats for s in STATISTICS):
            stats.update({k: v for k, v in host_statistics(values).items() if k not in stats})
        row: dict[str, Any] = {
            "key": job.key, "step": step, "micro_step": job.micro_step, "index": job.index,
            "dtype": leaf.dtype, "framework": job.framework, "shape": list(leaf.shape),
            "numel": int(np.prod(leaf.shape, dtype=np.int64)), **stats,
            "hash": bitwise_hash(leaf.raw) if leaf.raw is not None else None, "tensor_file": None,
        }
    except Exception as e:
        msg = f"{where}: could not compute statistics: {type(e).__name__}: {e}"
        sink.record_error(msg, {**lost, "what": "row"})
        errors.append(msg)
        return None
    if save_tensors and values is not None:
        path = layout.key_data_tensor(job.key, step, sink.rank, job.micro_step, job.index)
        try:
            row["tensor_file"] = sink.write_tensor(path, narrow_integers(values, stats.get("min"), stats.get("max")))
        except OSError as e:
            msg = f"{where}: tensor not written to {path}: {e}; its statistics are kept"
            sink.record_error(msg, {**lost, "what": "tensor"})
            errors.append(msg)
    return row
