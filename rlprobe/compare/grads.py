"""Gradient comparison: sign agreement per (monitor, rank, step, param) by XOR + popcount of the
packed sign bits, then SQL (grad_similarity.sql, grad_flags.sql) for similarity, drift and flags.
Reads rlprobe dumps and msprobe grad_probe dumps alike."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rlprobe.lake.reader import Dump
from rlprobe.lake.schema import GRAD, with_rank
from rlprobe.resources import sql_text

DEFAULTS = {"first_step_min": 0.97, "max_drop": 0.03, "norm_rtol": 1e-3}
KEY = ("monitor", "rank", "step", "param")
SIGN_COLUMNS = [*KEY, "numel", "sign_file", "sign_offset", "sign_numel"]
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], np.uint8)


def has_grads(dump: Dump) -> bool:
    return dump.arrow("grad").num_rows > 0


def grad_table(dump: Dump, errors: list[str] | None = None) -> pa.Table:
    table = dump.arrow("grad", errors=errors) if dump.format == "rlprobe" else dump.arrow("grad")
    schema = with_rank(GRAD)
    if table.num_rows == 0:
        return schema.empty_table()
    return table.select(schema.names).cast(schema)


def packed_signs(dump: Dump, row: dict[str, Any], cache: dict[str, np.ndarray]) -> np.ndarray:
    """The packed sign bytes of one row (np.packbits order; padding bits of the last byte are 0)."""
    file = row["sign_file"]
    if row["sign_offset"] is None:  # msprobe: a bool .npy per parameter
        return np.packbits(np.load(dump.path / file).reshape(-1))
    whole = cache.get(file)
    if whole is None:
        cache.clear()  # rows come a file (step) at a time: one open map, not one per step of the run
        whole = cache[file] = np.load(dump.path / file, mmap_mode="r")
    start = int(row["sign_offset"])
    return np.asarray(whole[start: start + (int(row["sign_numel"]) + 7) // 8])


def agreeing_bits(a: np.ndarray, b: np.ndarray, numel: int) -> int:
    """Elements whose sign bits agree, of `numel`, from two packed arrays (padding ignored)."""
    if a.size != b.size or a.size != (numel + 7) // 8:
        raise ValueError(f"packed sizes {a.size} and {b.size} bytes do not hold {numel} bits")
    x = np.bitwise_xor(a, b)
    if numel % 8 and x.size:
        x = x.copy()
        x[-1] &= (0xFF << (8 - numel % 8)) & 0xFF
    count = np.bitwise_count(x).sum(dtype=np.int64) if hasattr(np, "bitwise_count") else _POPCOUNT[x].sum(dtype=np.int64)
    return numel - int(count)


def sign_results(dump_a: Dump, dump_b: Dump, table_a: pa.Table, table_b: pa.Table) -> pa.Table:
    """same_count for every pair with sign maps on both sides and equal element counts."""
    side_b = {tuple(r[k] for k in KEY): r for r in table_b.select(SIGN_COLUMNS).to_pylist() if r["sign_file"]}
    rows = []
    cache_a: dict[str, np.ndarray] = {}
    cache_b: dict[str, np.ndarray] = {}
    for ra in table_a.select(SIGN_COLUMNS).to_pylist():
        key = tuple(ra[k] for k in KEY)
        rb = side_b.get(key)
        if not ra["sign_file"] or rb is None or ra["sign_numel"] != rb["sign_numel"] or ra["sign_numel"] is None:
            continue
        same, error = None, None
        try:
            same = agreeing_bits(packed_signs(dump_a, ra, cache_a), packed_signs(dump_b, rb, cache_b), ra["sign_numel"])
        except (OSError, ValueError) as e:
            error = f"sign maps of {ra['param']!r} step {ra['step']}: {e}"
        rows.append({**dict(zip(KEY, key)), "same_count": same, "error": error})
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("monitor", pa.string()), ("rank", pa.int64()), ("step", pa.int64()), ("param", pa.string()),
        ("same_count", pa.int64()), ("error", pa.string())]))


def compare_grads(dump_a: Dump, dump_b: Dump, read_errors: list[str] | None = None, *,
                  steps: list[int] | None = None, ranks: list[int] | None = None,
                  **thresholds: float) -> tuple[dict[str, pa.Table], dict[str, Any] | None]:
    """({'grads', 'grad_steps'}, grad_first_flagged) for two dumps; thresholds as in DEFAULTS.
    `steps`/`ranks` (None: all) select as select_steps_ranks says."""
    import duckdb

    unknown = set(thresholds) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown gradient thresholds {sorted(unknown)}; expected {sorted(DEFAULTS)}")
    params = {**DEFAULTS, **{k: float(v) for k, v in thresholds.items()}}
    errors: list[str] = []
    table_a, table_b = select_steps_ranks(grad_table(dump_a, errors), grad_table(dump_b, errors), steps, ranks)
    if read_errors is not None:
        read_errors.extend(f"grad stats: {e}" for e in errors)
    con = duckdb.connect()
    con.register("grad_a", _with_position(table_a))
    con.register("grad_b", _with_position(table_b))
    con.register("sign_results", sign_results(dump_a, dump_b, table_a, table_b))
    grads = _arrow(con, sql_text("grad_similarity.sql"), params)
    grads = grads.append_column("flagged", pa.compute.is_valid(grads["flag_reason"]))
    con.register("grads", grads)
    steps = _arrow(con, sql_text("grad_flags.sql"), {k: params[k] for k in ("first_step_min", "max_drop")})
    return {"grads": grads, "grad_steps": steps}, first_flagged(grads, steps)


def select_steps_ranks(table_a: pa.Table, table_b: pa.Table, steps: list[int] | None,
                       ranks: list[int] | None) -> tuple[pa.Table, pa.Table]:
    """The rows of the selected ranks and probe steps (`rlprobe compare --steps/--ranks`). A row's
    probe step is the one it was recorded in (an msprobe row, which has none: its optimizer
    step). An optimizer step (monitor, rank, step) is kept on both sides when either side's row
    is selected, so runs whose optimizer steps fall in different probe steps still pair up."""
    if steps is None and ranks is None:
        return table_a, table_b
    import pyarrow.compute as pc

    group = ["monitor", "rank", "step"]

    def selected(table: pa.Table) -> pa.Table:
        conditions = []
        if ranks is not None:
            conditions.append(pc.is_in(table["rank"], pa.array(ranks, pa.int64())))
        if steps is not None:
            conditions.append(pc.is_in(pc.coalesce(table["probe_step"], table["step"]), pa.array(steps, pa.int64())))
        mask = conditions[0] if len(conditions) == 1 else pc.and_(*conditions)
        return table.filter(mask).select(group)

    chosen = pa.concat_tables([selected(table_a), selected(table_b)]).group_by(group).aggregate([])

    def keep(table: pa.Table) -> pa.Table:  # a semi join on the keys only (list columns cannot be joined)
        rows = table.select(group).append_column("_row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
        kept = rows.join(chosen, group, join_type="left semi")["_row"].to_numpy()
        return table.take(np.sort(kept))  # in the table's own row order

    return keep(table_a), keep(table_b)


def first_flagged(grads: pa.Table, steps: pa.Table, worst: int = 10) -> dict[str, Any] | None:
    """The earliest flagged step (by step, then monitor, rank) and its worst parameters."""
    flagged = [r for r in steps.to_pylist() if r["flagged"]]
    if not flagged:
        return None
    first = min(flagged, key=lambda r: (r["step"], r["monitor"], r["rank"]))
    rows = [r for r in grads.select([*KEY, "similarity", "norm_rel_diff", "flag_reason"]).to_pylist()
            if (r["monitor"], r["rank"], r["step"]) == (first["monitor"], first["rank"], first["step"])]
    rows.sort(key=lambda r: (r["similarity"] if r["similarity"] is not None else 2.0, -(r["norm_rel_diff"] or 0.0)))
    return {"monitor": first["monitor"], "rank": first["rank"], "step": first["step"],
            "weighted_similarity": first["weighted_similarity"], "reason": first["reason"],
            "worst_params": [{"param": r["param"], "similarity": r["similarity"], "reason": r["flag_reason"]}
                             for r in rows[:worst]]}


def similarities_csvs(grads: pa.Table, steps: pa.Table) -> dict[str, str]:
    """msprobe's similarities.csv per (monitor, rank): relative path -> text (UTF-8 with BOM).
    One monitor: grads/rank<R>/similarities.csv; several: grads/monitor=<name>/rank<R>/..."""
    per: dict[tuple[str, int], dict[str, dict[int, float]]] = defaultdict(dict)
    all_steps: dict[tuple[str, int], set[int]] = defaultdict(set)
    for r in grads.select([*KEY, "similarity"]).to_pylist():
        group = (r["monitor"], r["rank"])
        all_steps[group].add(r["step"])
        if r["similarity"] is not None:
            per[group].setdefault(r["param"], {})[r["step"]] = r["similarity"]
    summary: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for r in steps.to_pylist():
        if r["weighted_similarity"] is not None:
            summary[(r["monitor"], r["rank"])][r["step"]] = r["weighted_similarity"]
    monitors = {m for m, _ in all_steps}
    files = {}
    for (monitor, rank), step_set in sorted(all_steps.items()):
        ordered = sorted(step_set)
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\r\n")  # as msprobe (pandas) writes it
        w.writerow(["step", *ordered])
        for param, values in per[(monitor, rank)].items():
            w.writerow([param, *[_cell(values.get(s)) for s in ordered]])
        w.writerow(["summary", *[_cell(summary[(monitor, rank)].get(s)) for s in ordered]])
        prefix = "grads" if len(monitors) == 1 else f"grads/monitor={monitor}"
        files[f"{prefix}/rank{rank}/similarities.csv"] = "\ufeff" + buf.getvalue()
    return files


def write_grad_outputs(work: Path, tables: dict[str, pa.Table]) -> list[Path]:
    """grads.parquet, grad_steps.parquet and the similarities.csv files under `work`."""
    import pyarrow.parquet as pq

    written = []
    for name in ("grads", "grad_steps"):
        written.append(work / f"{name}.parquet")
        pq.write_table(tables[name], written[-1], compression="zstd")
    for rel, text in similarities_csvs(tables["grads"], tables["grad_steps"]).items():
        path = work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="")
        written.append(path)
    return written


def _with_position(table: pa.Table) -> pa.Table:
    return table.append_column("position", pa.array(np.arange(table.num_rows, dtype=np.int64)))


def _cell(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _arrow(con, query: str, params: dict[str, Any]) -> pa.Table:
    relation = con.sql(query, params=params)
    to_table = getattr(relation, "to_arrow_table", None) or getattr(relation, "arrow")
    return to_table()
