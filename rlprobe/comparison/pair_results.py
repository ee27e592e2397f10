"""The element kernel's results of many pairs: `PairResults`, what the executor fills column by
column (no Python object per pair: a batch of small pairs lands as arrays), and the Arrow table
built from it, the `pair_results` (key data) and `module_results` (modules) tables that
key_data.sql and modules.sql join their pairs with. Its columns follow the kernel's metrics
(rlprobe.comparison.partials.METRICS).

The executor's tasks are here too: PairTask, one pair, and PairColumns, many pairs held column by column (pair
i's paths and records in arrays, its PairTask made only where it is asked for): the 25,600 pairs of an rlprobe
dump as PairTask and Record tuples took ~0.12-0.14 s of the main thread before any pair was compared; a batch of
small pairs reads its paths and records straight from these columns instead.

Last, PairsAhead: tensor pairs compared ahead, while the main thread still reads both runs' statistics. With
more than one worker, a comparison of two msprobe dumps knows the pairs it will compare, in the usual case, as
soon as run A's folders are listed: each tensor file of run A with the file under the same path in run B. The
statistics files (a JSON file per tensor), run B's listing and the layout and pairing SQL take longer than the
pairs themselves on a dump of many small tensors, so the pairs start on the workers (compiled, GIL-free:
rlprobe.comparison.small_pairs) beside that reading (docs/performance.md, "Comparison: many small pairs"). The
SQL still decides which pairs are compared (tensor_pairs.sql): `take` gives each of its pairs the result
computed ahead where there is one - the same kernel on the same files, so the same bits - and compares the
others (another key name in run B, say) the usual way. A pair compared ahead that the SQL does not pick (shapes
that differ, a file run B lacks) is dropped. Where the comparing ahead failed, every pair is compared the usual
way, which names the problem as it always did.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable, Hashable, NamedTuple, overload

import numpy as np
import pyarrow as pa

from rlprobe.comparison.partials import METRICS, metric_row
from rlprobe.lake.tensor_pack import Record

# what a metric without a value holds in its column: no first mismatch, no cosine (numel 0, or
# sums that overflowed); a real cosine is never NaN
_NO_FIRST = -1
_NO_COSINE = np.nan


class PairResults(Mapping):
    """Results of run_pairs, one row per task in task order: a column per metric and the error of
    each pair that could not be compared. As a mapping it is what run_pairs always returned,
    ``{task_id: metrics dict or {"error": message}}``; the dicts are made only when asked for."""

    def __init__(self, ids: Sequence[Hashable]):
        self.ids = list(ids)
        n = len(self.ids)
        self.columns = {name: np.zeros(n, np.dtype(kind)) for name, kind in METRICS.items()}
        self.errors: dict[int, str] = {}  # row -> message
        self._rows: dict[Hashable, int] | None = None

    def put_rows(self, rows: np.ndarray, columns: Mapping[str, np.ndarray]) -> None:
        """The metrics of the tasks at `rows`, a column per metric (first_mismatch_index -1 and
        cosine NaN where there is none)."""
        for name, values in columns.items():
            self.columns[name][rows] = values

    def put(self, row: int, metrics: Mapping[str, Any]) -> None:
        """One task's metrics dict (combine()'s) or {"error": message}."""
        if "error" in metrics:
            self.errors[row] = metrics["error"]
            return
        for name, column in self.columns.items():
            value = metrics[name]
            if value is None:
                value = _NO_FIRST if name == "first_mismatch_index" else _NO_COSINE
            column[row] = value

    def row(self, i: int) -> dict[str, Any]:
        """Row `i` as the metrics dict (Python ints and floats, None for no value) or {"error": ...}."""
        if i in self.errors:
            return {"error": self.errors[i]}
        return metric_row(self.columns, i)

    def __getitem__(self, task_id: Hashable) -> dict[str, Any]:
        if self._rows is None:
            self._rows = dict(zip(self.ids, range(len(self.ids))))
        return self.row(self._rows[task_id])

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def table(self) -> pa.Table:
        """pair_id (the task ids), every metric (null where none, and in a pair's row with an error),
        and the error."""
        n = len(self.ids)
        failed = np.zeros(n, np.bool_)
        failed[list(self.errors)] = True
        arrays = [pa.array(self.ids, pa.int64())]
        for name, kind in METRICS.items():
            column = self.columns[name]
            missing = failed
            if name == "first_mismatch_index":
                missing = failed | (column < 0)
            elif name == "cosine":
                missing = failed | np.isnan(column)
            arrays.append(_arrow(column, pa.type_for_alias(kind), missing))
        errors = [None] * n
        for i, message in self.errors.items():
            errors[i] = message
        arrays.append(pa.array(errors, pa.string()))
        return pa.Table.from_arrays(arrays, schema=results_schema())


def _arrow(column: np.ndarray, kind: pa.DataType, missing: np.ndarray) -> pa.Array:
    """`column` (int64 or float64) as an Arrow array of `kind`, null where `missing`: what
    pa.array(column, mask=missing) gives, without pyarrow's look for numpy.ma (which imports it: ~60-100 ms
    of a one-step comparison's start-up)."""
    nulls = int(np.count_nonzero(missing))
    validity = pa.py_buffer(np.packbits(~missing, bitorder="little")) if nulls else None
    values = pa.py_buffer(np.ascontiguousarray(column))
    return pa.Array.from_buffers(kind, len(column), [validity, values], null_count=nulls)


def results_schema() -> pa.Schema:
    """pair_id, every metric of the kernel, and the error of a pair that could not be compared."""
    return pa.schema([("pair_id", pa.int64()), *((name, pa.type_for_alias(t)) for name, t in METRICS.items()),
                      ("error", pa.string())])


def pair_results_table(results: Mapping[int, Mapping[str, Any]],
                       files: pa.Table | list[tuple[str, str]] | None = None) -> pa.Table:
    """One row per compared pair (`results`: pair id -> the executor's metrics or error, a PairResults
    or a dict); with `files` (pair id -> (file_a, file_b): a list, or a table whose row i holds pair i's
    file_a and file_b) the columns file_a and file_b join the key-data pairs."""
    if isinstance(results, PairResults):
        table = results.table()
    else:
        schema = results_schema()
        rows = [{"pair_id": pair_id, **{c: r.get(c) for c in schema.names[1:]}} for pair_id, r in results.items()]
        table = pa.Table.from_pylist(rows, schema=schema)
    if files is None:
        return table
    if isinstance(files, pa.Table):  # taken by pair id, no Python per pair
        ids = table["pair_id"]
        return table.append_column("file_a", files["file_a"].take(ids).cast(pa.string())).append_column(
            "file_b", files["file_b"].take(ids).cast(pa.string()))
    ids = table["pair_id"].to_pylist()
    return table.append_column("file_a", pa.array([files[i][0] for i in ids], pa.string())).append_column(
        "file_b", pa.array([files[i][1] for i in ids], pa.string()))


class PairTask(NamedTuple):
    """One pair to compare: two absolute paths of ``.npy`` files, or of packed files with the records
    to compare in them (lake/tensor_pack.py; None: the whole file)."""

    task_id: Hashable
    path_a: str
    path_b: str
    record_a: Record | None = None
    record_b: Record | None = None


class Side:
    """One side's columns: absolute paths, and each pair's record (`offsets`, `lengths`: byte offset and
    length of a record of a packed file) or, with `offsets` None, whole files."""

    __slots__ = ("paths", "offsets", "lengths")

    def __init__(self, paths: list[str], offsets: np.ndarray | None = None, lengths: np.ndarray | None = None):
        if (offsets is None) != (lengths is None):
            raise ValueError("a side's offsets and lengths go together")
        if offsets is not None and not (len(offsets) == len(lengths) == len(paths)):
            raise ValueError(f"a side of {len(paths)} paths needs as many offsets and lengths, "
                             f"got {len(offsets)} and {len(lengths)}")
        self.paths = paths
        self.offsets = offsets
        self.lengths = lengths

    def __getitem__(self, rows: slice) -> "Side":
        if self.offsets is None:
            return Side(self.paths[rows])
        return Side(self.paths[rows], self.offsets[rows], self.lengths[rows])

    def records(self) -> list[Record | None]:
        if self.offsets is None:
            return [None] * len(self.paths)
        return list(map(Record, self.offsets.tolist(), self.lengths.tolist()))

    def record(self, i: int) -> Record | None:
        return None if self.offsets is None else Record(int(self.offsets[i]), int(self.lengths[i]))

    def record_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """As small_pairs.record_arrays gives them: offset 0 and length -1 for a whole file."""
        if self.offsets is None:
            return np.zeros(len(self.paths), np.int64), np.full(len(self.paths), -1, np.int64)
        return self.offsets, self.lengths


class PairColumns(Sequence):
    """Pairs as columns; item i is PairTask(first_id + i, path_a, path_b, record_a, record_b), a slice is
    PairColumns again (task ids kept), so run_pairs, its batches and any executor see PairTasks."""

    def __init__(self, a: Side, b: Side, first_id: int = 0):
        if len(a.paths) != len(b.paths):
            raise ValueError(f"both sides need as many pairs: {len(a.paths)} and {len(b.paths)}")
        self.a, self.b, self.first_id = a, b, first_id

    def __len__(self) -> int:
        return len(self.a.paths)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> "PairColumns": ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, _, step = i.indices(len(self))
            if step != 1:
                raise ValueError("PairColumns slices are contiguous")
            return PairColumns(self.a[i], self.b[i], self.first_id + start)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"pair {i} of {n}")
        i %= n
        return PairTask(self.first_id + i, self.a.paths[i], self.b.paths[i], self.a.record(i), self.b.record(i))

    def __iter__(self) -> Iterator[Any]:
        """Every pair's PairTask, made at once (an executor that takes them all: run_pairs_ray, PairsAhead)."""
        return map(PairTask, self.task_ids, self.a.paths, self.b.paths, self.a.records(), self.b.records())

    @property
    def task_ids(self) -> range:
        return range(self.first_id, self.first_id + len(self))

    def paths(self) -> list[str]:
        """Every pair's path a, then every pair's path b (as small_pairs.compare_small_pairs reads them)."""
        return self.a.paths + self.b.paths

    def record_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """small_pairs.record_arrays of these pairs, from the columns."""
        (offsets_a, lengths_a), (offsets_b, lengths_b) = self.a.record_arrays(), self.b.record_arrays()
        return np.concatenate([offsets_a, offsets_b]), np.concatenate([lengths_a, lengths_b])

    def __repr__(self) -> str:
        return f"PairColumns({len(self)} pairs from task {self.first_id})"


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
