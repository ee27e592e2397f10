"""Rollout and trainer rows paired by sample identity (the dump's `sample` rows, written by
`save(..., sample_ids=...)` or derived from the prompt ids: docs/dump-format.md, "Samples"), for
trainers that save the rollout and the shuffled update micro-batches in different calls (TRL).
The join is sql/check/sample_pairs.sql; here its rows become kernel parts, one per pair of save
calls, with the row indices to gather from each tensor."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rlprobe.checks.pair_part import Part, is_float
from rlprobe.key_names import canonical_names
from rlprobe.lake.reader import Dump
from rlprobe.lake.sql_runner import run

_COLUMNS = ("key", "index", "step", "rank", "micro_step", "row", "sample", "occurrence", "group_id", "row_numel")


def samples_table(dump: Dump, names: Mapping[str, str] | None = None) -> pa.Table:
    """The dump's sample rows with each key's canonical name (no rows: a dump without sample identity):
    from `names` (saved key -> canonical: the `stats` table's) where given, else rlprobe/key_names.csv
    decided by the keys of the sample rows."""
    table = dump.arrow("sample")
    if table.num_rows == 0 or not set(_COLUMNS) <= set(table.column_names):
        return pa.table({})
    table = table.select(list(_COLUMNS))
    saved = pc.unique(table["key"])
    keys = saved.to_pylist()
    table_names = canonical_names(keys) if names is None else names
    canonical = pa.array([table_names.get(k, k) for k in keys], pa.string())
    return table.append_column("canonical", pc.take(canonical, pc.index_in(table["key"], saved)))


def sample_parts(samples: pa.Table, rows: dict[tuple, dict[str, Any]]) -> list[Part]:
    """One part per (trainer call, rollout call, mask call) whose rows share samples, float tensors only."""
    import duckdb


    con = duckdb.connect()
    con.register("samples", samples)
    found = run(con, "check/sample_pairs.sql")
    con.close()
    if found.num_rows == 0:
        return []
    groups: dict[tuple, list[tuple[int, int, int | None]]] = {}
    for r in found.to_pylist():
        call = (r["pair"], r["step"], r["rank"], r["a_key"], r["a_micro"], r["a_index"], r["b_micro"], r["b_index"],
                r["m_micro"], r["m_index"])
        groups.setdefault(call, []).append((r["a_row"], r["b_row"], r["m_row"]))
    parts = []
    for (pair, step, rank, a_key, a_micro, a_index, b_micro, b_index, m_micro, m_index), picks in groups.items():
        a = rows.get((a_key, step, rank, a_micro, a_index))
        b = rows.get(("rollout_log_prob", step, rank, b_micro, b_index))
        if a is None or b is None or not is_float(a) or not is_float(b):
            continue  # statistics only, or not log-probs
        mask = None if m_micro is None else rows.get(("response_mask", step, rank, m_micro, m_index))
        index = np.array([(ia, ib, -1 if im is None else im) for ia, ib, im in picks], np.int64)
        mask_rows = index[:, 2] if mask is not None and (index[:, 2] >= 0).all() else None
        parts.append(Part(pair, a, b, None if mask_rows is None else mask, index[:, 0], index[:, 1], mask_rows))
    return parts
