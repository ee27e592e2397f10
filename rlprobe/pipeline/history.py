"""The pipeline history: one Parquet row per run per metric, for trends across nightly runs.

Columns: run_id, created_at (UTC), pipeline, run_a, run_b, metric, key, value, text. Metrics:
first_divergence_step (text: the key), max_abs_err / max_rel_err per key, diverging_rows,
grad_weighted_similarity (min over steps, when the grads table has it), gate_passed per gate
(1/0; key = gate name), scalar_mean_a / scalar_mean_b per scalar name.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe.errors import ProbeError

HISTORY = pa.schema([
    ("run_id", pa.string()), ("created_at", pa.timestamp("us", tz="UTC")), ("pipeline", pa.string()),
    ("run_a", pa.string()), ("run_b", pa.string()), ("metric", pa.string()), ("key", pa.string()),
    ("value", pa.float64()), ("text", pa.string()),
])


class HistoryError(ProbeError):
    """The history file cannot be read or written (exit code 3)."""


def read_history(path: Path | None) -> pa.Table:
    """The whole history, or an empty table when there is none yet."""
    if path is None or not Path(path).exists():
        return HISTORY.empty_table()
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise HistoryError(f"history file {path} cannot be read ({e}); move it away to start a new history") from None
    missing = [f.name for f in HISTORY if f.name not in table.column_names]
    if missing:
        raise HistoryError(f"history file {path} is not an rlprobe history (missing columns {missing})")
    return table.select(HISTORY.names).cast(HISTORY)


def history_rows(summary: dict[str, Any], scalars: pa.Table, grad_steps: pa.Table, *, pipeline: str,
                 run_id: str | None = None, created_at: dt.datetime | None = None) -> pa.Table:
    """This run's metrics as history rows."""
    run_id = run_id or uuid.uuid4().hex[:12]
    created_at = created_at or dt.datetime.now(dt.timezone.utc)
    base = {"run_id": run_id, "created_at": created_at, "pipeline": pipeline,
            "run_a": summary.get("run_a"), "run_b": summary.get("run_b")}
    rows: list[dict[str, Any]] = []

    def add(metric: str, value: Any, key: str | None = None, text: str | None = None) -> None:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else (
            float(value) if isinstance(value, bool) else None)
        rows.append({**base, "metric": metric, "key": key, "value": number, "text": text})

    first = summary.get("first_divergence")
    add("first_divergence_step", first["step"] if first else None, text=first["key"] if first else None)
    counts = summary.get("counts") or {}
    matching = ("match", "stats_only_match", "close", "stats_only_close", "absent_in_both")
    add("diverging_rows", sum(n for status, n in counts.items() if status not in matching))
    for k in summary.get("keys") or []:
        for metric in ("max_abs_err", "max_rel_err"):
            value = k.get(metric)
            add(metric, value if value is None or math.isfinite(value) else None, key=k["key"],
                text=None if value is None or math.isfinite(value) else str(value))
    if "weighted_similarity" in grad_steps.column_names and grad_steps.num_rows:
        import pyarrow.compute as pc

        add("grad_weighted_similarity", pc.min(grad_steps["weighted_similarity"]).as_py())
    for g in summary.get("gates") or []:
        add("gate_passed", 1.0 if g["passed"] else 0.0, key=g["name"], text=f"{g['rows']} rows")
    if scalars.num_rows:
        import duckdb

        con = duckdb.connect()
        con.register("scalars", scalars)
        for name, mean_a, mean_b in con.execute(
                "SELECT name, avg(value_a), avg(value_b) FROM scalars GROUP BY name ORDER BY name").fetchall():
            add("scalar_mean_a", mean_a, key=name)
            add("scalar_mean_b", mean_b, key=name)
    return pa.Table.from_pylist(rows, schema=HISTORY)


def check_history_writable(path: Path) -> None:
    """Refuse a history file that could not be written (a read-only or missing-permission folder)
    before a pipeline does its work: its folder is created if need be and must take a new file."""
    path = Path(path)
    probe = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as e:
        raise HistoryError(f"history file {path} cannot be written: {_reason(e)}; make its folder writable "
                           "or change `history:`") from None


def append_history(path: Path, rows: pa.Table) -> pa.Table:
    """Read, append, write a temporary file beside it, rename: readers never see half a file."""
    path = Path(path)
    table = pa.concat_tables([read_history(path), rows.cast(HISTORY)])
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # the folder turned read-only, or is gone: nothing of ours is left to remove
            pass
        raise HistoryError(f"history file {path} cannot be written: {_reason(e)}") from None
    return table


def _reason(error: OSError) -> str:
    return os.strerror(error.errno) if error.errno else str(error)


def history_overview(table: pa.Table) -> list[dict[str, Any]]:
    """One row per run, newest last: first divergence, worst error, gates passed, diverging rows."""
    import duckdb

    from rlprobe.lake.sql_runner import to_arrow

    con = duckdb.connect()
    con.register("history", table)
    query = """
        SELECT run_id, min(created_at) AS created_at, any_value(pipeline) AS pipeline,
               max(value) FILTER (WHERE metric = 'first_divergence_step') AS first_divergence_step,
               any_value(text) FILTER (WHERE metric = 'first_divergence_step') AS first_divergence_key,
               max(value) FILTER (WHERE metric = 'max_rel_err') AS worst_max_rel_err,
               max(value) FILTER (WHERE metric = 'diverging_rows') AS diverging_rows,
               min(value) FILTER (WHERE metric = 'grad_weighted_similarity') AS grad_weighted_similarity,
               sum(value) FILTER (WHERE metric = 'gate_passed') AS gates_passed,
               count(*) FILTER (WHERE metric = 'gate_passed') AS gates
        FROM history GROUP BY run_id ORDER BY created_at, run_id"""
    # through Arrow: DuckDB before 2.0 needs pytz to hand a timestamp with a time zone to Python
    return to_arrow(con.sql(query)).to_pylist()


def write_history_plots(table: pa.Table, out: Path) -> list[Path]:
    """One PNG per metric (a line per key) over runs: out/history_<metric>.png."""
    from rlprobe.report.plots import new_figure, save

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = history_overview(table)
    order = {r["run_id"]: i for i, r in enumerate(runs)}
    labels = [r["created_at"].strftime("%m-%d %H:%M") if r["created_at"] else r["run_id"] for r in runs]
    series: dict[str, dict[str, dict[int, float]]] = {}
    for r in table.to_pylist():
        if r["value"] is None or r["run_id"] not in order:
            continue
        series.setdefault(r["metric"], {}).setdefault(r["key"] or r["metric"], {})[order[r["run_id"]]] = r["value"]
    written = []
    for metric, lines in sorted(series.items()):
        fig, ax = new_figure((8, 4.5))
        for key, points in sorted(lines.items()):
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], marker="o", label=key)
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize="small")
        if metric in ("max_abs_err", "max_rel_err") and all(v > 0 for p in lines.values() for v in p.values()):
            ax.set_yscale("log")
        ax.set_title(f"{metric} by run")
        ax.grid(True, alpha=0.3)
        if 1 < len(lines) <= 20:
            ax.legend(fontsize="small", ncol=2)
        written.append(save(fig, out / f"history_{metric.replace('/', '_')}.png", dpi=100))
    return written
