"""The element kernel's results of many pairs as one Arrow table, the `pair_results` (key data)
and `module_results` (modules) tables that key_data.sql and modules.sql join their pairs with.
Its columns follow the kernel's metrics (rlprobe.compare.partials.METRICS)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from rlprobe.compare.partials import METRICS


def results_schema() -> pa.Schema:
    """pair_id, every metric of the kernel, and the error of a pair that could not be compared."""
    return pa.schema([("pair_id", pa.int64()), *((name, pa.type_for_alias(t)) for name, t in METRICS.items()),
                      ("error", pa.string())])


def pair_results_table(results: dict[int, dict[str, Any]],
                       files: list[tuple[str, str]] | None = None) -> pa.Table:
    """One row per compared pair (`results`: pair id -> the executor's metrics or error); with
    `files` (pair id -> (file_a, file_b)) the columns file_a and file_b join the key-data pairs."""
    schema = results_schema()
    rows = [{"pair_id": pair_id, **{c: r.get(c) for c in schema.names[1:]}} for pair_id, r in results.items()]
    table = pa.Table.from_pylist(rows, schema=schema)
    if files is None:
        return table
    ids = table["pair_id"].to_pylist()
    return table.append_column("file_a", pa.array([files[i][0] for i in ids], pa.string())).append_column(
        "file_b", pa.array([files[i][1] for i in ids], pa.string()))
