"""`rlprobe pipeline run FILE`: compare, run every query as a named table, run the gates, write
the reports into a temporary directory, rename it into place, append the history.

Exit codes: 0 every gate passed, 1 a gate failed, 2 a bad spec or a failing user query, 3 a run
that cannot be read or an output (or history) that cannot be written.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe.compare.config_diff import DIFF_SCHEMA
from rlprobe.errors import DumpReadError, ProbeError
from rlprobe.lake.schema import SCALAR, with_rank
from rlprobe.pipeline.history import HistoryError, append_history, check_history_writable, history_rows, read_history
from rlprobe.pipeline.reports import GateResult, junit_xml, render_pipeline_md
from rlprobe.pipeline.spec import NamedSql, Pipeline
from rlprobe.report.output_file import output_os_error
from rlprobe.report.work_dir import WorkDir, remove_dead_work_dirs
from rlprobe.resources import sql_text

EXIT_OK, EXIT_GATE_FAILED, EXIT_SPEC, EXIT_UNREADABLE = 0, 1, 2, 3

# parameters the bundled gates read with getvariable(); a pipeline's `params:` overrides them
DEFAULT_PARAMS: dict[str, Any] = {"tps_metric": "e2e_tps", "tps_max_drop": 0.05, "loss_metric": "loss",
                                  "loss_max_rel_drift": 0.01, "timing_prefix": "timing/", "timing_max_rise": 0.10}

# typed empty tables for comparisons that did not run (or that this version does not produce)
EMPTY_TABLES = {
    "grads": pa.schema([("monitor", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("param", pa.string()),
                        ("similarity", pa.float64()), ("weight", pa.float64()), ("status", pa.string())]),
    "grad_steps": pa.schema([("monitor", pa.string()), ("step", pa.int64()), ("rank", pa.int64()),
                             ("weighted_similarity", pa.float64()), ("flagged", pa.bool_())]),
    "modules": pa.schema([("stage", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("module", pa.string()),
                          ("call", pa.int64()), ("direction", pa.string()), ("io", pa.string()), ("index", pa.string()),
                          ("status", pa.string()), ("max_abs_err", pa.float64()), ("max_rel_err", pa.float64())]),
    "config_diff": DIFF_SCHEMA,
}


class PipelineError(ProbeError):
    """A pipeline that stopped; `exit_code` says why (2 spec/query, 3 unreadable run or unwritable output)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class PipelineResult:
    exit_code: int
    output: Path
    summary: dict[str, Any]
    gates: list[GateResult] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def run_pipeline(pipeline: Pipeline, *, progress: Callable[[int, int], None] | None = None) -> PipelineResult:
    """Run a loaded pipeline; raises PipelineError for exit codes 2 and 3."""
    from rlprobe.compare.run import compare_dumps
    from rlprobe.lake.reader import open_dump

    spec = pipeline.spec
    if len(pipeline.runs) == 1:  # a check only (rlprobe/check/pipeline_stage.py)
        from rlprobe.check.pipeline_stage import run_check_only

        return run_check_only(pipeline)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    (name_a, path_a), (name_b, path_b) = pipeline.runs.items()
    try:
        dump_a, dump_b = open_dump(path_a), open_dump(path_b)
        scalars_a, scalars_b = dump_a.arrow("scalar"), dump_b.arrow("scalar")
    except DumpReadError as e:
        raise PipelineError(str(e), EXIT_UNREADABLE) from None
    try:
        history = read_history(pipeline.history)
        if pipeline.history is not None:
            check_history_writable(pipeline.history)  # before the work, not after the output is published
    except HistoryError as e:
        raise PipelineError(str(e), EXIT_UNREADABLE) from None
    work = _work_dir(pipeline.output)
    try:
        import duckdb

        t = time.perf_counter()
        con = duckdb.connect()  # the comparison leaves stats_a, stats_b, key_data, ... in it for the queries
        try:
            tables, summary = compare_dumps(
                dump_a, dump_b, keys=spec.select.key_list(), steps=spec.select.step_list(),
                ranks=spec.select.rank_list(), workers=spec.executor.workers,
                stats_rtol=spec.compare.key_data.stats_rtol, order=spec.compare.key_data.order, progress=progress,
                executor=_executor(spec.executor), grads=_grad_thresholds(spec.compare.grads),
                modules=_module_options(spec.compare.modules), con=con, key_map=spec.key_map,
                config_ignore=spec.compare.config.ignore, config_ignore_defaults=spec.compare.config.ignore_defaults)
        except DumpReadError as e:
            raise PipelineError(str(e), EXIT_UNREADABLE) from None
        timings["compare_s"] = time.perf_counter() - t
        summary["pipeline"] = {"name": spec.name, "file": str(pipeline.path), "runs": {name_a: str(path_a),
                               name_b: str(path_b)}, "executor": spec.executor.kind}

        t = time.perf_counter()
        _connection(con, tables, scalars_a, scalars_b, history, {**DEFAULT_PARAMS, **spec.params})
        query_tables = {q.name: _run_query(con, q) for q in pipeline.queries}
        gates = [_run_gate(con, g) for g in pipeline.gates]
        timings["sql_s"] = time.perf_counter() - t
        summary["gates"] = [g.summary() for g in gates]
        scalars = _arrow(con.sql("SELECT * FROM scalars"))
        grad_steps = _arrow(con.sql("SELECT * FROM grad_steps"))

        t = time.perf_counter()
        if spec.check is not None:  # each run checked on its own, into check/<run>/
            from rlprobe.check.pipeline_stage import write_checks

            summary["check"] = write_checks(work.path, pipeline)
        summary["elapsed_s"] = round(time.perf_counter() - started, 3)
        try:
            _write_outputs(work.path, pipeline, tables, summary, query_tables, gates, scalars)
        except (OSError, ProbeError) as e:  # a full disk, a quota, a read-only folder
            cause = output_os_error(e)
            if cause is None:
                raise
            reason = os.strerror(cause.errno) if cause.errno else str(cause)
            raise PipelineError(f"output {pipeline.output} cannot be written: {reason}; its earlier files are kept",
                                EXIT_UNREADABLE) from None
        _publish(work, pipeline.output)
        timings["reports_s"] = time.perf_counter() - t
    finally:
        work.remove()

    if pipeline.history is not None:
        try:
            append_history(pipeline.history, history_rows(summary, scalars, grad_steps, pipeline=spec.name))
        except HistoryError as e:
            raise PipelineError(f"{e}; the output {pipeline.output} is complete, but this run is not in the history",
                                EXIT_UNREADABLE) from None
    checks_failed = any(c["exit_code"] == EXIT_GATE_FAILED for c in summary.get("check", {}).values())
    code = EXIT_GATE_FAILED if any(not g.passed for g in gates) or checks_failed else EXIT_OK
    return PipelineResult(code, pipeline.output, summary, gates, timings)


def _executor(executor) -> Callable[..., dict] | None:
    if executor.kind == "ray":
        from functools import partial

        from rlprobe.compare.ray_executor import run_pairs_ray

        return partial(run_pairs_ray, address=executor.address)
    return None  # compare_dumps' default: the local thread executor


def _grad_thresholds(grads) -> dict[str, float] | None:
    """compare.grads of the spec as compare_grads thresholds (None: its defaults)."""
    return None if grads is None else {"first_step_min": grads.first_step_min, "max_drop": grads.max_drop}


def _module_options(modules) -> dict[str, Any] | None:
    """compare.modules of the spec as compare_modules arguments (stage: only that stage)."""
    return {"stages": [modules.stage]} if modules is not None and modules.stage else None


def _connection(con, tables: dict[str, pa.Table], scalars_a: pa.Table, scalars_b: pa.Table, history: pa.Table,
                params: dict[str, Any]):
    """Complete `con` (which compare_dumps left holding key_data, key_rollup, step_rollup, stats_a
    and stats_b) with every other table queries and gates may read."""
    for name, schema in EMPTY_TABLES.items():
        con.register(name, tables.get(name, schema.empty_table()))
    empty_scalars = with_rank(SCALAR).empty_table()
    con.register("scalars_a", scalars_a if scalars_a.num_rows else empty_scalars)
    con.register("scalars_b", scalars_b if scalars_b.num_rows else empty_scalars)
    con.execute(f"CREATE TEMP TABLE scalars AS {_statement(sql_text('scalars.sql'))}")
    con.register("history", history)
    con.register("params", pa.Table.from_pylist([params]))
    for name, value in params.items():  # user values are bound, never pasted into SQL
        con.execute(f'SET VARIABLE "{name}" = ?', [value])
    return con


def _statement(sql: str) -> str:
    return sql.strip().rstrip(";").strip()


def _run_query(con, q: NamedSql) -> pa.Table:
    import duckdb

    try:
        con.execute(f'CREATE TEMP TABLE "{q.name}" AS {_statement(q.sql)}')
        return _arrow(con.sql(f'SELECT * FROM "{q.name}"'))
    except duckdb.Error as e:
        raise PipelineError(f"query {q.name} ({q.origin}) failed: {e}", EXIT_SPEC) from None


def _run_gate(con, g: NamedSql) -> GateResult:
    import duckdb

    t = time.perf_counter()
    try:
        rows = _arrow(con.sql(_statement(g.sql)))
    except duckdb.Error as e:
        raise PipelineError(f"gate {g.name} ({g.origin}) failed to run: {e}", EXIT_SPEC) from None
    return GateResult(g.name, g.description, g.origin, rows, time.perf_counter() - t)


def _arrow(relation) -> pa.Table:
    if relation is None:
        return pa.table({})
    to_table = getattr(relation, "to_arrow_table", None) or getattr(relation, "arrow")
    table = to_table()
    return table.read_all() if hasattr(table, "read_all") else table


# -- outputs -------------------------------------------------------------------------------
def _work_dir(out: Path) -> WorkDir:
    """A fresh directory beside `out`, renamed to `out` only when every file is written; first the
    work directories of killed runs into `out` go (an earlier output one had set aside comes back)."""
    prefix = f".{out.name}.tmp-"
    remove_dead_work_dirs(out.parent, prefix, restore_to=out)
    if out.exists() and not out.is_dir():
        raise PipelineError(f"output {out} is a file; give a directory", EXIT_UNREADABLE)
    if out.is_dir() and any(out.iterdir()) and not (out / "summary.json").exists():
        raise PipelineError(f"output {out} holds other files (no summary.json of an earlier run); "
                            "give a new or empty directory", EXIT_UNREADABLE)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return WorkDir(out.parent, prefix)
    except OSError as e:
        raise PipelineError(f"output {out} cannot be written: {e.strerror or e}", EXIT_UNREADABLE) from None


def _write_outputs(work: Path, pipeline: Pipeline, tables: dict[str, pa.Table], summary: dict[str, Any],
                   query_tables: dict[str, pa.Table], gates: list[GateResult], scalars: pa.Table) -> None:
    from rlprobe.compare.run import jsonable, public_key_data, write_extra_tables

    report = pipeline.spec.report
    key_data = tables["key_data"]
    pq.write_table(key_data, work / "key_data.parquet", compression="zstd")
    if scalars.num_rows:
        pq.write_table(scalars, work / "scalars.parquet", compression="zstd")
    xlsx_extras = write_extra_tables(work, tables)  # modules, grads (as `rlprobe compare` writes them)
    for folder, items in (("queries", query_tables), ("gates", {g.name: g.rows for g in gates})):
        if items:
            (work / folder).mkdir()
            for name, table in items.items():
                pq.write_table(table, work / folder / f"{name}.parquet")
    (work / "summary.json").write_text(json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n",
                                       encoding="utf-8")
    public = public_key_data(key_data)
    if report.csv:
        from rlprobe.report.csv_report import write_key_data_csv

        write_key_data_csv(work / "key_data.csv", public, lang=report.lang)
    if report.xlsx:
        from rlprobe.report.xlsx import write_report_xlsx

        write_report_xlsx(work / "report.xlsx", public, summary, lang=report.lang, **xlsx_extras)
    if report.markdown:
        text = render_pipeline_md(pipeline.spec.name, summary, public, gates)
        (work / "summary.md").write_text(text, encoding="utf-8")
    if report.junit:
        (work / "junit.xml").write_bytes(junit_xml(pipeline.spec.name, gates, summary.get("elapsed_s") or 0.0))
    if report.plots or report.plot_every_param:
        from rlprobe.report.plots import write_plots

        write_plots(work, every_param=report.plot_every_param)


def _publish(work: WorkDir, out: Path) -> None:
    """Swap the finished directory into place; an earlier run's output goes only after (a run
    killed in between leaves it as `work.old`, which the next run puts back)."""
    old = None
    try:
        if out.exists():
            old = work.old
            out.rename(old)
        work.path.rename(out)
    except OSError as e:
        if old is not None and not out.exists():
            old.rename(out)
        raise PipelineError(f"output {out} cannot be written: {e.strerror or e}", EXIT_UNREADABLE) from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
