"""The key-data rows of the save calls the writer takes together, built as columns of one table.

A row per saved value (docs/dump-format.md, "Key data"): a None value is a row marked absent, a
tensor a row of its statistics, hash and packed record. The writer works a batch of calls out at
once (capture/save_calls.py); building a Python dict a row and converting the dicts to Arrow at
commit held the GIL for ~10 us a tensor on a TRL-like load (docs/trl.md, "Twelfth pass"), so the
statistics stay numpy columns, the other columns Python lists, and the batch becomes one table
sliced per call. Tensors are taken a few at a time (STACK_BYTES of host copies): their statistics
are one numpy call per statistic, and their staging memory goes back as soon as they are written.

What each call's rows hold, and every failure path, is as for one dict a row: a tensor whose
statistics cannot be computed is lost (no row; its step is incomplete), one whose record cannot be
written keeps its statistics with a null tensor_file.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rlprobe.lake.encoding import narrow_integers, widen
from rlprobe.lake.schema import KEY_DATA
from rlprobe.lake.statistics import (STACK_BYTES, STATISTICS, bitwise_hash, consecutive_chunks,
                                     host_statistics_columns)

if TYPE_CHECKING:
    from rlprobe.capture.calls import LeafJob, SaveCall, WriterState
    from rlprobe.lake.tensor_pack import TensorPack

__all__ = ["key_data_tables", "null_lost_files"]


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
