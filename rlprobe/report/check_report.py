"""The reports of `rlprobe check` (one run, no baseline): check.parquet, each check's offending rows
and the token/gradient tables as Parquet, summary.json, summary.md, report.xlsx (a Summary sheet,
then one sheet per check with rows, then the per-step rollout-vs-trainer figures) and plots/,
written into a folder that rlprobe.report.output_folder publishes (pipeline/check_command.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe.report.comparison_files import jsonable

STATUS_FILL = {"fail": "FFC7CE", "warn": "FFEB9C", "pass": "C6EFCE"}
TABLE_SHEETS = {"token_steps": "Rollout vs trainer", "grad_steps": "Grad steps"}


def write_check_outputs(result: Any, work: Path, *, plots: bool = True) -> None:
    """Every report of a CheckResult into the folder `work`."""
    summary = result.summary()
    pq.write_table(result.results, work / "check.parquet", compression="zstd")
    rows_dir = work / "rows"
    rows_dir.mkdir()
    for name, table in result.rows.items():
        if table.num_rows:
            pq.write_table(table, rows_dir / f"{name}.parquet", compression="zstd")
    for name, table in result.tables.items():
        if table.num_rows:
            pq.write_table(table, work / f"{name}.parquet", compression="zstd")
    (work / "summary.json").write_text(json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n",
                                       encoding="utf-8")
    (work / "summary.md").write_text(summary_md(result), encoding="utf-8")
    write_check_xlsx(work / "report.xlsx", result)
    if plots:
        from rlprobe.report.plots import write_check_plots

        write_check_plots(work / "plots", result.tables)


def verdict_line(result: Any) -> str:
    failed = [r["check"] for r in result.results.to_pylist() if r["status"] == "fail"]
    warned = [r["check"] for r in result.results.to_pylist() if r["status"] == "warn"]
    if failed:
        return f"FAILED: {', '.join(failed)}" + (f" (warnings: {', '.join(warned)})" if warned else "")
    return "all applicable checks passed" + (f" (warnings: {', '.join(warned)})" if warned else "")


def summary_md(result: Any) -> str:
    from rlprobe.report.markdown import escape_md, table

    lines = [f"# rlprobe check: {escape_md(result.dump)}", "",
             f"**{verdict_line(result)}** (exit {result.exit_code})", ""]
    lines += [f"- {escape_md(note)}" for note in result.notes]
    info = result.info
    lines += [f"- eps {info['eps']} ({info['eps_source']}); a generation every {info['generation_every']} step(s) "
              f"({info['generation_every_source']}); GRPO group size {info['group_size'] or 'unknown'}", ""]
    lines += table(["check", "status", "rows", "first offending row", "note"],
                   [[r["check"], r["status"], r["rows"], r["first"] or "", r["note"] or ""]
                    for r in result.results.to_pylist()])
    steps = result.tables.get("token_steps")
    if steps is not None and steps.num_rows:
        columns = ["pair", "step", "rank", "tokens", "mean_delta", "sd_delta", "mean_abs", "p50_abs", "p95_abs",
                   "p99_abs", "max_abs", "outside_share"]
        lines += ["", "## Rollout vs trainer, per step (Δ = other − trainer log-prob, nats)", ""]
        lines += table(columns, [[r[c] for c in columns] for r in steps.slice(0, 200).to_pylist()])
    return "\n".join(lines) + "\n"


def write_check_xlsx(path: Path, result: Any) -> None:
    from rlprobe.report.output_folder import write_report_file
    from rlprobe.report.workbook import CellFormat, SheetNames, Workbook

    def write(fileobj) -> None:
        with Workbook(fileobj) as book:
            names = SheetNames()
            bold = book.style(CellFormat(bold=True))
            summary = book.add_sheet(names.claim("Summary"), (24, 16, 10, 8, 90, 60), freeze="A4")
            summary.append([f"rlprobe check: {result.dump}"], bold)
            summary.append([verdict_line(result)], bold)
            summary.append(["check", "status", "severity", "rows", "first offending row", "note"], bold)
            for r in result.results.to_pylist():
                style = book.style(CellFormat(fill=STATUS_FILL[r["status"]])) if r["status"] in STATUS_FILL else None
                summary.append([r["check"], r["status"], r["severity"], r["rows"], r["first"], r["note"]],
                               [None, style, None, None, None, None])
            summary.blank_row()
            for note in result.notes:
                summary.append([note])
            for name, table in [(n, t) for n, t in result.rows.items() if t.num_rows] + \
                               [(TABLE_SHEETS[n], result.tables[n]) for n in TABLE_SHEETS if result.tables[n].num_rows]:
                _table_sheet(book, names.claim(name), table, bold)

    write_report_file(path, write)


def _table_sheet(book: Any, name: str, table: pa.Table, bold: Any, limit: int = 100_000) -> None:
    """The first `limit` rows, a column at a time (nested values as their Python text)."""
    sheet = book.add_sheet(name, [14] * table.num_columns, freeze="A2")
    sheet.append(table.column_names, bold)
    table = table.slice(0, limit)
    columns = [[_cell(v) for v in c.to_pylist()] if pa.types.is_nested(c.type) else c.combine_chunks()
               for c in table.columns]
    sheet.append_columns(columns, [[None]] * len(columns), pa.array([0] * table.num_rows, pa.int32()))


def _cell(value: Any) -> Any:
    return str(value) if isinstance(value, (list, dict)) else value

