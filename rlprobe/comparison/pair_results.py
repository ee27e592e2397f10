"""The element kernel's results of many pairs: `PairResults`, what the executor fills column by
column (no Python object per pair: a batch of small pairs lands as arrays), and the Arrow table
built from it, the `pair_results` (key data) and `module_results` (modules) tables that
key_data.sql and modules.sql join their pairs with. Its columns follow the kernel's metrics
(rlprobe.comparison.partials.METRICS)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Hashable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from rlprobe.comparison.partials import METRICS, metric_row

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
