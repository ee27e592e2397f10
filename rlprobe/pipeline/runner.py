"""`rlprobe pipeline run FILE`: compare, run every query as a named table, run the gates, write
the reports into a temporary directory, rename it into place, append the history.

Exit codes: 0 every gate passed, 1 a gate failed, 2 a bad spec or a failing user query, 3 a run
that cannot be read or an output (or history) that cannot be written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe.comparison.config_diff import DIFF_SCHEMA
from rlprobe.errors import (ControlRunError, DumpReadError, EXIT_GATE_FAILED, EXIT_OK, EXIT_SPEC, EXIT_UNREADABLE,
    ProbeError, SelectionError)
from rlprobe.lake.schema import SCALAR, with_rank
from rlprobe.lake.sql_runner import bound_memory, create_table, create_table_as, query, set_variables, to_arrow
from rlprobe.pipeline.history import HistoryError, append_history, check_history_writable, history_rows, read_history
from rlprobe.pipeline.spec import NamedSql, Pipeline
from rlprobe.pipeline.spec_models import default_params
from rlprobe.report.markdown import GateResult, junit_xml, render_pipeline_md
from rlprobe.report.output_folder import OutputError, prepare_output, publish_output

__all__ = ["EXIT_GATE_FAILED", "EXIT_OK", "EXIT_SPEC", "EXIT_UNREADABLE", "PipelineError", "PipelineResult",
           "default_params", "run_pipeline"]

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
    from rlprobe.comparison.options import Runtime
    from rlprobe.comparison.run import compare_dumps
    from rlprobe.lake.reader import open_dump

    spec = pipeline.spec
    if len(pipeline.runs) == 1:  # a check only (below: check_runs)
        return _run_check_only(pipeline)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    (name_a, path_a), (name_b, path_b) = pipeline.compared.items()
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
    try:
        prepare_output(pipeline.output)
    except OutputError as e:
        raise PipelineError(str(e), EXIT_UNREADABLE) from None
    import duckdb

    t = time.perf_counter()
    con = duckdb.connect()  # the comparison leaves stats_a, stats_b, key_data, ... in it for the queries
    bound_memory(con)  # rlprobe's own database: spills beyond its limit, as compare's does
    try:
        tables, summary = compare_dumps(dump_a, dump_b, _compare_options(spec, pipeline.control),
                                        Runtime(progress=progress, executor=_executor(spec.executor), con=con))
    except ControlRunError as e:
        raise PipelineError(f"{pipeline.path}: runs.control: {e}", EXIT_UNREADABLE) from None
    except DumpReadError as e:
        raise PipelineError(str(e), EXIT_UNREADABLE) from None
    except SelectionError as e:  # its select: names nothing the runs hold
        raise PipelineError(f"{pipeline.path}: select: {e}", EXIT_SPEC) from None
    timings["compare_s"] = time.perf_counter() - t
    summary["pipeline"] = {"name": spec.name, "file": str(pipeline.path),
                           "runs": {name: str(path) for name, path in pipeline.runs.items()},
                           "executor": spec.executor.kind}

    t = time.perf_counter()
    _connection(con, tables, scalars_a, scalars_b, history, {**default_params(), **spec.params})
    query_tables = {q.name: _run_query(con, q) for q in pipeline.queries}
    gates = [_run_gate(con, g) for g in pipeline.gates]
    timings["sql_s"] = time.perf_counter() - t
    summary["gates"] = [g.summary() for g in gates]
    scalars = to_arrow(con.table("scalars"))
    grad_steps = to_arrow(con.table("grad_steps"))

    t = time.perf_counter()
    checks = _check_runs(pipeline) if spec.check is not None else {}  # each run on its own: check/<run>/
    if checks:
        summary["check"] = check_summaries(checks)
    summary["elapsed_s"] = round(time.perf_counter() - started, 3)

    def write(folder: Path) -> None:
        write_check_folders(folder, checks, plots=spec.check is not None and spec.check.plots)
        _write_outputs(folder, pipeline, tables, summary, query_tables, gates, scalars)

    try:
        publish_output(pipeline.output, write)
    except OutputError as e:
        raise PipelineError(str(e), EXIT_UNREADABLE) from None
    timings["reports_s"] = time.perf_counter() - t

    if pipeline.history is not None:
        try:
            append_history(pipeline.history, history_rows(summary, scalars, grad_steps, pipeline=spec.name))
        except HistoryError as e:
            raise PipelineError(f"{e}; the output {pipeline.output} is complete, but this run is not in the history",
                                EXIT_UNREADABLE) from None
    failed = checks_failed(summary.get("check", {}))
    code = EXIT_GATE_FAILED if any(not g.passed for g in gates) or failed else EXIT_OK
    return PipelineResult(code, pipeline.output, summary, gates, timings)


def _executor(executor) -> Callable[..., dict] | None:
    if executor.kind == "ray":
        from functools import partial

        from rlprobe.comparison.executor import run_pairs_ray

        return partial(run_pairs_ray, address=executor.address)
    return None  # compare_dumps' default: the local thread executor


def _compare_options(spec, control: Path | None = None) -> Any:
    """The spec's select:, executor: and compare: sections (and its control run) as the comparison's
    CompareOptions."""
    from rlprobe.comparison.options import CompareOptions

    key_data = spec.compare.key_data
    return CompareOptions(keys=spec.select.key_list(), steps=spec.select.step_list(), ranks=spec.select.rank_list(),
                          workers=spec.executor.workers, tolerance=key_data.tolerance_rules(), order=key_data.order,
                          key_map=spec.key_map, config_ignore=spec.compare.config.ignore,
                          config_ignore_defaults=spec.compare.config.ignore_defaults,
                          grads=_grad_thresholds(spec.compare.grads), modules=_module_options(spec.compare.modules),
                          control=control)


def _grad_thresholds(grads) -> dict[str, float] | None:
    """compare.grads of the spec as compare_grads thresholds (None: its defaults)."""
    return None if grads is None else grads.model_dump()


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
    create_table(con, "scalars", "scalars.sql")
    con.register("history", history)
    con.register("params", pa.Table.from_pylist([params]))
    set_variables(con, params)  # user values are bound, never pasted into SQL
    return con


def _run_query(con, q: NamedSql) -> pa.Table:
    import duckdb

    try:
        create_table_as(con, q.name, q.sql)
        return to_arrow(con.table(q.name))
    except duckdb.Error as e:
        raise PipelineError(f"query {q.name} ({q.origin}) failed: {e}", EXIT_SPEC) from None


def _run_gate(con, g: NamedSql) -> GateResult:
    import duckdb

    t = time.perf_counter()
    try:
        rows = query(con, g.sql)
    except duckdb.Error as e:
        raise PipelineError(f"gate {g.name} ({g.origin}) failed to run: {e}", EXIT_SPEC) from None
    return GateResult(g.name, g.description, g.origin, rows, time.perf_counter() - t)


def _check_runs(pipeline: Pipeline) -> dict[str, Any]:
    try:
        return check_runs(pipeline.runs, pipeline.spec.check.params, pipeline.path, pipeline.spec.key_map)
    except CheckStageError as e:
        raise PipelineError(str(e), e.exit_code) from None


def _run_check_only(pipeline: Pipeline) -> PipelineResult:
    """A pipeline with one run: check it, publish OUTPUT (summary.json and check/<run>/) whole."""
    started = time.perf_counter()
    try:
        prepare_output(pipeline.output)
    except OutputError as e:
        raise PipelineError(str(e), EXIT_UNREADABLE) from None
    checks = _check_runs(pipeline)
    summary = {"pipeline": {"name": pipeline.spec.name, "file": str(pipeline.path),
                            "runs": {n: str(p) for n, p in pipeline.runs.items()}},
               "check": check_summaries(checks), "elapsed_s": round(time.perf_counter() - started, 3)}

    def write(folder: Path) -> None:
        from rlprobe.report.comparison_files import write_summary_json

        write_check_folders(folder, checks, plots=pipeline.spec.check.plots)
        write_summary_json(folder, summary)

    try:
        publish_output(pipeline.output, write)
    except OutputError as e:
        raise PipelineError(str(e), EXIT_UNREADABLE) from None
    code = EXIT_GATE_FAILED if checks_failed(summary["check"]) else EXIT_OK
    return PipelineResult(code, pipeline.output, summary, [], {"check_s": time.perf_counter() - started})


def _write_outputs(folder: Path, pipeline: Pipeline, tables: dict[str, pa.Table], summary: dict[str, Any],
                   query_tables: dict[str, pa.Table], gates: list[GateResult], scalars: pa.Table) -> None:
    """Every file of the pipeline's output into `folder` (the files `rlprobe compare` writes, and
    scalars.parquet, queries/, gates/, junit.xml)."""
    from rlprobe.report.comparison_files import (ReportOptions, public_key_data, write_reports, write_summary_json,
                                                 write_tables)

    report = pipeline.spec.report
    xlsx_extras = write_tables(folder, tables)  # key data, modules, grads (as `rlprobe compare` writes them)
    if scalars.num_rows:
        pq.write_table(scalars, folder / "scalars.parquet", compression="zstd")
    for name, items in (("queries", query_tables), ("gates", {g.name: g.rows for g in gates})):
        if items:
            (folder / name).mkdir()
            for item, table in items.items():
                pq.write_table(table, folder / name / f"{item}.parquet")
    write_summary_json(folder, summary)
    summary_md = None
    if report.markdown:
        summary_md = render_pipeline_md(pipeline.spec.name, summary, public_key_data(tables["key_data"]), gates)
    write_reports(folder, tables, summary, xlsx_extras, ReportOptions(
        lang=report.lang, xlsx=report.xlsx, csv=report.csv, markdown=report.markdown, summary_md=summary_md,
        plots=report.plots, plot_every_param=report.plot_every_param))
    if report.junit:
        (folder / "junit.xml").write_bytes(junit_xml(pipeline.spec.name, gates, summary.get("elapsed_s") or 0.0))


# -- the `check:` stage of a pipeline: each run checked on its own (rlprobe.check), its reports in
# OUTPUT/check/<run name>/. A pipeline with one run does the check only; with two runs the comparison runs as
# before and the check's reports join its output (published whole with it, rlprobe.report.output_folder). A
# failed check makes the pipeline exit 1, as a failed gate does.


class CheckStageError(ProbeError):
    """A run the check cannot read (exit 3) or a bad check parameter (exit 2)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def check_runs(runs: dict[str, Path], params: dict[str, Any], spec_path: Path,
               key_map: dict[str, str] | None = None) -> dict[str, Any]:
    """{run name: CheckResult} of every run, its keys read through the pipeline's `key_map:` as the
    comparison reads them. Raises CheckStageError."""
    from rlprobe.checks import check_dump

    found = {}
    for name, path in runs.items():
        try:
            found[name] = check_dump(path, dict(params), key_map=key_map)
        except DumpReadError as e:
            raise CheckStageError(f"check of run {name}: {e}", EXIT_UNREADABLE) from None
        except ValueError as e:
            raise CheckStageError(f"{spec_path}: check.params: {e}", EXIT_SPEC) from None
    return found


def check_summaries(checks: dict[str, Any]) -> dict[str, Any]:
    """summary.json's `check`: per run its exit code, the checks that failed and its report."""
    return {name: {"exit_code": result.exit_code,
                   "failed": [r["check"] for r in result.results.to_pylist() if r["status"] == "fail"],
                   "report": f"check/{name}/summary.md"} for name, result in checks.items()}


def write_check_folders(folder: Path, checks: dict[str, Any], *, plots: bool) -> None:
    """Each run's check reports into folder/check/<name>/ (the output's work folder)."""
    from rlprobe.report.check_report import write_check_outputs

    for name, result in checks.items():
        target = folder / "check" / name
        target.mkdir(parents=True)
        write_check_outputs(result, target, plots=plots)


def checks_failed(summaries: dict[str, Any]) -> bool:
    return any(c["exit_code"] == EXIT_GATE_FAILED for c in summaries.values())
