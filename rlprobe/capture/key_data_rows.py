"""The writer's work for save() calls: sample rows, statistics, hashes and packed tensor files of key data,
the key-data rows built as columns of one table.

The writer thread takes the calls of several steps at once (capture/writer.py, `defer`): their
sample rows are one table and their small tensors' statistics one pass, sliced per call, so a
step's fixed costs (the Python and numpy calls per table or stack, which hold the GIL the
training thread needs) are shared by the steps of a commit. What each call adds to the rank's
buffers is then published in the order the calls were made, between the ends of their steps,
so commits and parts hold what they held when each call was a job of its own.

A row per saved value (docs/dump-format.md, "Key data"): a None value is a row marked absent, a
tensor a row of its statistics, hash and packed record. Building a Python dict a row and converting the dicts
to Arrow at commit held the GIL for ~10 us a tensor on a TRL-like load (docs/trl.md, "Twelfth pass"), so the
statistics stay numpy columns, the other columns Python lists, and the batch becomes one table
sliced per call. Tensors are taken a few at a time (STACK_BYTES of host copies): their statistics
are one numpy call per statistic, and their staging memory goes back as soon as they are written.

What each call's rows hold, and every failure path, is as for one dict a row: a tensor whose
statistics cannot be computed is lost (no row; its step is incomplete), one whose record cannot be
written keeps its statistics with a null tensor_file.
"""

from __future__ import annotations

import math
import os
from functools import partial
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from rlprobe.capture.calls import LeafJob, SaveCall, WriterState
from rlprobe.lake.encoding import narrow_integers, widen
from rlprobe.lake.layout import DumpLayout, key_data_pack
from rlprobe.lake.samples import CallIdentity, sample_tables_of_calls
from rlprobe.lake.schema import KEY_DATA
from rlprobe.lake.statistics import (STACK_BYTES, STATISTICS, bitwise_hash, consecutive_chunks,
                                     host_statistics_columns)
from rlprobe.lake.tensor_pack import TensorPack

__all__ = ["key_data_tables", "null_lost_files", "prepare_here", "write_key_data", "write_samples_and_key_data"]


class _Columns:
    """The batch's rows, in the order the calls' rows are published (each call's absent rows first, then
    its tensors): a tuple a row for the columns known when the row is added, the statistics as numpy
    columns (`table`), hashes and packed records filled in by row."""

    NAMES = ("key", "index", "framework", "dtype", "step", "micro_step", "shape", "numel", "absent")

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.hash: list[str | None] = []
        self.records: dict[int, tuple[int, int]] = {}  # row -> its record's (offset, length) in the packed file

    def add(self, c: SaveCall, job: LeafJob) -> int:
        leaf = job.leaf
        if leaf is None:
            self.rows.append((job.key, job.index, job.framework, None, c.step, job.micro_step, None, None, True))
        else:
            self.rows.append((job.key, job.index, job.framework, leaf.dtype, c.step, job.micro_step,
                              tuple(leaf.shape), math.prod(leaf.shape), False))
        self.hash.append(None)
        return len(self.rows) - 1

    def table(self, stats: dict[str, np.ndarray], null: dict[str, np.ndarray], pack_path: str | None) -> pa.Table:
        n = len(self.rows)
        columns: dict[str, Any] = dict(zip(self.NAMES, zip(*self.rows))) if n else {name: [] for name in self.NAMES}
        offsets: list[int | None] = [None] * n
        lengths: list[int | None] = [None] * n
        for row, (offset, length) in self.records.items():
            offsets[row], lengths[row] = offset, length
        columns.update(hash=self.hash, tensor_file=[None if o is None else pack_path for o in offsets],
                       tensor_offset=offsets, tensor_length=lengths)
        return pa.Table.from_arrays([pa.array(stats[f.name], mask=null[f.name]) if f.name in stats
                                     else pa.array(columns[f.name], f.type) for f in KEY_DATA], schema=KEY_DATA)


def _where(key: str, step: int, micro_step: int, index: str) -> str:
    return f"key {key!r} step {step} micro_step {micro_step}" + (f" index {index!r}" if index else "")


def _not_written(sink: Any, errors: list[str], key: str, step: int, micro_step: int, index: str, pack: TensorPack,
                 e: OSError) -> None:
    msg = f"{_where(key, step, micro_step, index)}: tensor not written to {pack.path}: {e}; its statistics are kept"
    sink.record_error(msg, {"kind": "key_data", "key": key, "step": step, "micro_step": micro_step, "index": index,
                            "what": "tensor"})
    errors.append(msg)


def key_data_tables(writer: WriterState, calls: list[SaveCall], pack: TensorPack | None,
                    pack_path: str | None) -> list[pa.Table]:
    """Each call's key-data rows (a slice of one table), its tensors' records written into `pack` (the
    batch's packed file, relative path `pack_path`) for calls that save tensors; errors recorded and reported."""
    sink = writer.sink
    errors: list[str] = []
    cols = _Columns()
    bounds = [0]
    entries: list[tuple[int, SaveCall, LeafJob, np.ndarray | None]] = []  # (row, call, job, numeric values)
    for c in calls:
        for job in c.jobs:
            if job.leaf is None:
                cols.add(c, job)
        for job in c.jobs:
            leaf = job.leaf
            if leaf is None:
                continue
            try:
                if leaf.finish is not None:
                    leaf.finish()
                    leaf.finish = None
                values = widen(leaf.raw, leaf.dtype) if leaf.raw is not None else None
            except Exception as e:
                _lose(sink, errors, c, job, e)
                _release([job])
                continue
            entries.append((cols.add(c, job), c, job, values))
        bounds.append(len(cols.rows))
    n = len(cols.rows)
    stats = {s.name: np.zeros(n, np.int64 if s.arrow_type == "int64" else np.float64) for s in STATISTICS}
    null = {s.name: np.ones(n, np.bool_) for s in STATISTICS}
    lost: list[int] = []
    for chunk in _chunks(entries):
        try:
            _chunk_rows(writer, chunk, cols, stats, null, lost, pack, pack_path, errors)
        finally:
            _release([job for _, _, job, _ in chunk])
    writer.report(errors)
    table = cols.table(stats, null, pack_path)
    if lost:  # rows whose statistics could not be computed: recorded above, left out here
        keep = np.ones(n, np.bool_)
        keep[lost] = False
        table = table.filter(keep)
        bounds = [0, *np.cumsum([int(keep[a:b].sum()) for a, b in zip(bounds, bounds[1:])]).tolist()]
    return [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]


def _chunks(entries: list[tuple[int, SaveCall, LeafJob, np.ndarray | None]]) -> list[list[Any]]:
    """Consecutive entries of at most STACK_BYTES of host copies in all (a larger one alone)."""
    runs = consecutive_chunks([entry[2].leaf.nbytes for entry in entries], STACK_BYTES)  # type: ignore[union-attr]
    return [[entries[i] for i in run] for run in runs]


def _chunk_rows(writer: WriterState, chunk: list[tuple[int, SaveCall, LeafJob, np.ndarray | None]],
                cols: _Columns, stats: dict[str, np.ndarray], null: dict[str, np.ndarray], lost: list[int],
                pack: TensorPack | None, pack_path: str | None, errors: list[str]) -> None:
    """Statistics, hash and packed record of a chunk's tensors, into the batch's columns."""
    sink = writer.sink
    wanted = [e for e in chunk if e[3] is not None and not _device_has_all(e[2].leaf.device_stats)]
    failed = _host_statistics(wanted, stats, null)
    for row, c, job, values in chunk:
        leaf = job.leaf
        if row in failed:
            _lose(sink, errors, c, job, failed[row])
            lost.append(row)
            continue
        try:
            for name, value in (leaf.device_stats or {}).items():  # the device's statistics win over the host's
                if name in stats:
                    null[name][row] = value is None
                    if value is not None:
                        stats[name][row] = value
            cols.hash[row] = bitwise_hash(leaf.raw) if leaf.raw is not None else None
        except Exception as e:
            _lose(sink, errors, c, job, e)
            lost.append(row)
            continue
        if pack is None or not c.save_tensors or values is None:
            continue
        lo = None if null["min"][row] else stats["min"][row]
        hi = None if null["max"][row] else stats["max"][row]
        try:
            cols.records[row] = sink.write_into(pack, "", narrow_integers(values, lo, hi))
        except OSError as e:
            _not_written(sink, errors, job.key, c.step, job.micro_step, job.index, pack, e)


def _device_has_all(device_stats: dict[str, Any] | None) -> bool:
    return bool(device_stats) and all(s.name in device_stats for s in STATISTICS)  # type: ignore[operator]


def _host_statistics(wanted: list[tuple[int, SaveCall, LeafJob, np.ndarray | None]], stats: dict[str, np.ndarray],
                     null: dict[str, np.ndarray]) -> dict[int, Exception]:
    """The statistics of the wanted tensors into the columns at their rows, the small ones stacked; returns
    the rows whose statistics failed, with why (the others are then computed one at a time)."""
    if not wanted:
        return {}
    rows = [row for row, *_ in wanted]
    failed: dict[int, Exception] = {}
    try:
        done = [(rows, host_statistics_columns([values for *_, values in wanted]))]
    except Exception:
        done = []
        for row, *_, values in wanted:  # one at a time, to lose only the one that fails
            try:
                done.append(([row], host_statistics_columns([values])))
            except Exception as e:
                failed[row] = e
    for at, (values, nulls) in done:
        for name, column in values.items():
            stats[name][at] = column
            null[name][at] = nulls[name]
    return failed


def _lose(sink: Any, errors: list[str], c: SaveCall, job: LeafJob, e: BaseException) -> None:
    msg = f"{_where(job.key, c.step, job.micro_step, job.index)}: could not compute statistics: {type(e).__name__}: {e}"
    sink.record_error(msg, {"kind": "key_data", "key": job.key, "step": c.step, "micro_step": job.micro_step,
                            "index": job.index, "what": "row"}, incomplete_step=c.step)
    errors.append(msg)


def _release(jobs: list[LeafJob]) -> None:
    for job in jobs:
        leaf = job.leaf
        if leaf is not None:
            leaf.raw = None
            if leaf.release is not None:
                leaf.release()
                leaf.release = None


def null_lost_files(table: pa.Table, pack: TensorPack, pack_path: str, sink: Any, errors: list[str],
                    e: OSError) -> pa.Table:
    """The batch's packed file could not be renamed into place: the rows naming it keep their statistics,
    without a file (recorded and reported per row)."""
    files = table.column("tensor_file").to_pylist()
    gone = [f == pack_path for f in files]
    if not any(gone):
        return table
    for i in np.flatnonzero(gone).tolist():
        _not_written(sink, errors, *(table.column(name)[i].as_py() for name in ("key", "step", "micro_step", "index")),
                     pack, e)
    for name, type_ in (("tensor_file", pa.string()), ("tensor_offset", pa.int64()), ("tensor_length", pa.int64())):
        at = table.schema.get_field_index(name)
        values = table.column(name).to_pylist()
        table = table.set_column(at, KEY_DATA.field(name), pa.array(
            [None if g else v for g, v in zip(gone, values)], type_))
    return table



def prepare_here(writer: WriterState, calls: list[SaveCall]) -> list[Callable[[], None]]:
    """Work out `calls` together on this thread (or in the writer process, whose `writer` is its own
    session); returns, per call, what publishes its rows (to run in call order)."""
    for c in calls:
        for job in c.jobs:
            if job.leaf is not None and job.leaf.finish is not None:
                job.leaf.finish()
                job.leaf.finish = None
    samples: dict[int, pa.Table] = {}
    identified = [c for c in calls if c.identity is not None]
    if identified:
        try:  # while the host copies exist: the key data's pass below releases them
            tables = sample_tables_of_calls([(c.identity, c.jobs, c.step) for c in identified], writer.samples)
            samples = {id(c): t for c, t in zip(identified, tables)}
        except Exception as e:  # the key data is still written; the steps are marked incomplete
            for step in sorted({c.step for c in identified}):
                message = f"step {step}: sample rows not written: {type(e).__name__}: {e}"
                writer.sink.record_error(message, {"step": step, "what": "sample rows"}, incomplete_step=step)
                writer.report([message])
    key_data = _key_data_of_calls(writer, calls)
    return [partial(_publish, writer, samples.get(id(c)), *planned) for c, planned in zip(calls, key_data)]


def write_save_calls(writer: WriterState, calls: list[SaveCall]) -> None:
    """Writer-thread job for save calls: worked out together, published in order."""
    for publish in prepare_here(writer, calls):
        publish()


def write_samples_and_key_data(writer: WriterState, layout: DumpLayout | None, step: int, jobs: list[LeafJob],
                               save_tensors: bool, identity: CallIdentity, call: int = 0) -> None:
    """One save call's `sample` rows (lake/samples.py), then its key data (write_key_data)."""
    write_save_calls(writer, [SaveCall(layout, step, jobs, save_tensors, identity, call)])  # type: ignore[arg-type]


def write_key_data(writer: WriterState, layout: DumpLayout | None, step: int, jobs: list[LeafJob],
                   save_tensors: bool, call: int = 0) -> None:
    """Writer-thread job for one save call (the step's `call`-th). A None value becomes a row marked
    absent: its key, step, micro_step and index, and nothing else. The call's tensors go into one
    packed file, renamed into place when all are written (docs/dump-format.md, "Files")."""
    write_save_calls(writer, [SaveCall(layout, step, jobs, save_tensors, None, call)])  # type: ignore[arg-type]


def _key_data_of_calls(writer: WriterState, calls: list[SaveCall]) -> list[
        tuple[TensorPack | None, str | None, bool, pa.Table]]:
    """Per call: its packed file (records written into it) and path, whether the call renames it into place,
    and its rows (capture/key_data_rows.py). The calls taken together share one packed file, named after
    the first of them and the last step (docs/dump-format.md, change 14): the steps of a commit create one
    file, not a file and two folders each."""
    sink = writer.sink
    with_tensors = [c for c in calls if c.save_tensors]
    pack_path, pack = None, None
    if with_tensors:
        first = with_tensors[0]
        pack_path = key_data_pack(sink.rank, first.step, first.call, with_tensors[-1].step)
        pack = TensorPack(os.path.join(os.fspath(sink.layout.root), pack_path))
    tables = key_data_tables(writer, calls, pack, pack_path)
    return [(pack, pack_path, c is with_tensors[0], table) if c.save_tensors else (None, None, False, table)
            for c, table in zip(calls, tables)]


def _publish(writer: WriterState, samples: pa.Table | None, pack: TensorPack | None, pack_path: str | None,
             owner: bool, rows: pa.Table) -> None:
    """One call's rows into the rank's buffers (sample rows, then key data). The first call of its packed
    file (`owner`) renames it into place first, holding the records of the batch's later calls too (all
    written before any call is published); if that fails, every call's rows in it keep their statistics,
    without files."""
    sink = writer.sink
    if samples is not None:
        sink.add_row("sample", samples)
    if pack is not None:
        errors: list[str] = []
        try:
            if owner:
                sink.commit_folder(pack)
            elif pack.lost is not None:
                raise pack.lost
        except OSError as e:
            rows = null_lost_files(rows, pack, pack_path, sink, errors, e)  # type: ignore[arg-type]
        writer.report(errors)
    if rows.num_rows:
        sink.add_row("key_data", rows)
