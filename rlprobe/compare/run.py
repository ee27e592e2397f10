"""`rlprobe compare A B -o OUT`: match both runs' rows in SQL, compare tensors element-wise,
find the first divergence, explain it, and write the result tables and reports."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe._version import __version__
from rlprobe.compare.key_aliases import key_order_table
from rlprobe.compare.sample_alignment import layout, sample_key_data
from rlprobe.compare.verdict import explain, explain_beyond_key_data
from rlprobe.errors import ProbeError
from rlprobe.lake.atomic import TMP_MARK, is_temporary
from rlprobe.lake.reader import Dump, open_dump
from rlprobe.lake.schema import KEY_DATA, with_rank
from rlprobe.report.output_file import output_os_error
from rlprobe.resources import sql_text

if TYPE_CHECKING:
    import duckdb

    from rlprobe.report.work_dir import WorkDir

Progress = Callable[[int, int], None]


def compare(
    a: Any, b: Any, out: Any, *,
    keys: list[str] | None = None, steps: list[int] | None = None, ranks: list[int] | None = None,
    workers: int = 2, lang: str = "en", per_key_files: bool = False, per_key_dir: str = "per_key",
    stats_rtol: float = 0.0,
    order: list[str] | None = None, reports: bool = True, progress: Progress | None = None,
    key_map: dict[str, str] | None = None, config_ignore: list[str] | None = None, config_ignore_defaults: bool = True,
) -> dict[str, Any]:
    """Compare dumps `a` and `b` (rlprobe or msprobe format); write results under `out`; return the summary."""
    started = time.perf_counter()
    dump_a, dump_b = open_dump(a), open_dump(b)
    if dump_a.may_hold_tensors and dump_b.may_hold_tensors:
        # load numba and the compiled kernels while the runs' statistics are read and matched
        # (not at all for statistics-only or gradient-only dumps: ~0.3 s saved)
        threading.Thread(target=_warm_up_kernels, name="rlprobe-warm-up", daemon=True).start()
    out = Path(out)
    work = _work_dir(out)
    try:
        tables, summary = compare_dumps(dump_a, dump_b, keys=keys, steps=steps, ranks=ranks, workers=workers,
                                        stats_rtol=stats_rtol, order=order, progress=progress, key_map=key_map,
                                        config_ignore=config_ignore, config_ignore_defaults=config_ignore_defaults)
        summary["elapsed_s"] = round(time.perf_counter() - started, 3)
        try:
            _write_outputs(work.path, tables, summary, lang=lang, per_key_files=per_key_files,
                           per_key_dir=per_key_dir, reports=reports)
            _publish(work.path, out)
        except (OSError, ProbeError) as e:  # a full disk, a quota, a read-only folder: OUT keeps its files
            cause = output_os_error(e)
            if cause is None:
                raise
            reason = os.strerror(cause.errno) if cause.errno else str(cause)
            raise ProbeError(f"output directory {out} cannot be written: {reason}{_which_file(cause, work.path)}; "
                             "its earlier files are kept") from None
    finally:
        work.remove()
    return summary


def compare_dumps(dump_a: Dump, dump_b: Dump, *, keys=None, steps=None, ranks=None, workers=2, stats_rtol=0.0,
                  order=None, progress: Progress | None = None,
                  executor: Callable[..., dict] | None = None, grads: dict[str, float] | None = None,
                  modules: dict[str, Any] | None = None,
                  con: "duckdb.DuckDBPyConnection | None" = None, key_map: dict[str, str] | None = None,
                  config_ignore: list[str] | None = None, config_ignore_defaults: bool = True,
                  ) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    """The comparison itself, in memory: (tables by name, summary). `executor` runs the pair
    kernels, called like rlprobe.compare.executor.run_pairs(tasks, workers=, progress=) (default).

    `grads`: thresholds for compare_grads (first_step_min, max_drop, norm_rtol); `modules`:
    keyword arguments for compare_modules (e.g. stages=[...]). With `con`, both runs' statistics
    are left in it as the tables stats_a and stats_b (and key_data, key_rollup, step_rollup are
    registered there) instead of being returned as Arrow tables."""
    import duckdb

    keep_stats = con is None
    con = con or duckdb.connect()
    read_errors: list[str] = []
    _load_stats(con, "stats_a", dump_a, read_errors, "A")
    _load_stats(con, "stats_b", dump_b, read_errors, "B")
    con.register("key_order", key_order_table(order, key_map))
    run_layout = layout(con, dump_a, dump_b, read_errors)  # different layouts: compared per sample
    pairs_sql = _statement(sql_text("key_data_pairs.sql"))
    params = {"keys": keys, "steps": steps, "ranks": ranks}

    # only rows with a tensor file on both sides (and equal shapes) are compared element-wise;
    # a statistics-only dump has none, so its pairs are never looked at twice
    files = []
    if not run_layout["per_sample"] and _has_tensor_files(con, "stats_a") and _has_tensor_files(con, "stats_b"):
        files = con.execute(f"SELECT DISTINCT file_a, file_b FROM ({pairs_sql}) WHERE in_a AND in_b "
                            "AND file_a <> '' AND file_b <> '' AND shape_a IS NOT DISTINCT FROM shape_b "
                            "ORDER BY file_a, file_b", params).fetchall()
    tasks: list = []
    if files:  # the executor (and numba under it) is imported only when there is a pair to compare
        from rlprobe.compare.executor import PairTask, run_pairs

        tasks = [PairTask(i, str(dump_a.path / file_a), str(dump_b.path / file_b))
                 for i, (file_a, file_b) in enumerate(files)]
        results = (executor or run_pairs)(tasks, workers=workers, progress=progress)
    else:
        results = {}
        if progress is not None:
            progress(0, 0)
    pair_results = _results_table(results)
    con.register("pair_results", pair_results.append_column(
        "file_a", pa.array([files[i][0] for i in pair_results["pair_id"].to_pylist()], pa.string())).append_column(
        "file_b", pa.array([files[i][1] for i in pair_results["pair_id"].to_pylist()], pa.string())))

    unknown_position = con.execute("SELECT coalesce(max(position) + 1, 0) FROM key_order").fetchall()[0][0]
    gathered = 0
    if run_layout["per_sample"]:
        key_data, gathered = sample_key_data(con, dump_a, dump_b, params, unknown_position)
    else:
        key_data = _arrow(con, _with_pairs(sql_text("key_data.sql"), pairs_sql),
                          {**params, "stats_rtol": stats_rtol, "unknown_position": unknown_position})
    key_data = _prepend_read_errors(key_data, read_errors)
    con.register("key_data", key_data)
    first = _records(con.execute(sql_text("first_divergence.sql")))
    first = first[0] if first else None
    if first is not None:
        first["kind"] = "key_data"
        first["canonical_key"] = _canonical(con, first["key"])
    key_data = _mark_first(key_data, first)
    con.register("key_data", key_data)

    diverged_at_step = {}
    if first is not None:
        for r in _records(con.execute(sql_text("key_status_at_step.sql"), {"step": first["step"]})):
            diverged_at_step[r["canonical_key"]] = bool(r["diverged"])
    on_policy = {name: _on_policy(con, table) for name, table in (("A", "stats_a"), ("B", "stats_b"))}
    verdict = explain(first, diverged_at_step, on_policy)
    if first is not None:
        earliest = _records(con.execute(sql_text("earliest_in_step.sql"), {"step": first["step"]}))
        if earliest and earliest[0]["micro_step"] < first["micro_step"]:
            e = earliest[0]
            verdict["suspect"] += (f"; note: within step {e['step']}, {e['key']} already differs at micro_step "
                                   f"{e['micro_step']}, before this micro-batch")

    key_rollup = _arrow(con, sql_text("key_rollup.sql"))
    step_rollup = _arrow(con, sql_text("step_rollup.sql"))
    counts = {r["status"]: r["rows"] for r in _records(con.execute(sql_text("status_counts.sql")))}
    summary = {
        "rlprobe_version": __version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_a": str(dump_a.path), "run_b": str(dump_b.path),
        "format_a": dump_a.format, "format_b": dump_b.format,
        "first_divergence": None if first is None else {
            k: first.get(k) for k in ("kind", "key", "step", "rank", "micro_step", "index", "status",
                                      "max_abs_err", "max_rel_err", "message")},
        "module_first_divergence": None,
        "grad_first_flagged": None,
        "param_first_difference": None,
        **verdict,
        "on_policy_recompute": {name: rows for name, rows in on_policy.items() if rows},
        "gates": [],
        "counts": counts,
        "keys": key_rollup.to_pylist(),
        "steps": step_rollup.to_pylist(),
        "read_errors": read_errors,
        "pairs_compared": len(tasks) + gathered,
        "layout": run_layout,
    }
    tables = {"key_data": key_data, "key_rollup": key_rollup, "step_rollup": step_rollup}
    if keep_stats:
        tables["stats_a"], tables["stats_b"] = _arrow(con, "SELECT * FROM stats_a"), _arrow(con, "SELECT * FROM stats_b")
    else:
        con.register("key_rollup", key_rollup)
        con.register("step_rollup", step_rollup)
    con.execute("DROP VIEW IF EXISTS stats")
    for helper in ("pair_results", "key_order"):
        con.unregister(helper)
    from rlprobe.compare.modules import compare_modules, describe, has_module_stats

    if has_module_stats(dump_a) or has_module_stats(dump_b):  # module dumps (probe.stage): docs/modules.md
        tables["modules"], summary["module_first_divergence"] = compare_modules(
            dump_a, dump_b, steps=steps, ranks=ranks, workers=workers, progress=progress, executor=executor,
            read_errors=read_errors, **(modules or {}))
        summary["module_suspect"] = describe(summary["module_first_divergence"])
        summary["suspect"] = summary["suspect"] or summary["module_suspect"]
    from rlprobe.compare.grads import compare_grads, has_grads

    if has_grads(dump_a) or has_grads(dump_b):  # gradient monitors (probe.monitor_grads): docs/grads.md
        grad_tables, summary["grad_first_flagged"] = compare_grads(dump_a, dump_b, read_errors=read_errors,
                                                                   steps=steps, ranks=ranks, **(grads or {}))
        tables.update(grad_tables)
    explain_beyond_key_data(summary, _grad_probe_step(tables.get("grads"), summary["grad_first_flagged"]))
    from rlprobe.compare.params import add_param_comparison

    add_param_comparison(tables, summary, dump_a, dump_b, first and first["canonical_key"], read_errors, steps, ranks)
    from rlprobe.compare.config_diff import diff_configs, explain_config, saved_configs
    from rlprobe.compare.key_aliases import flow_warning
    from rlprobe.compare.verdict_modules import follow_up

    follow_up(summary, tables.get("modules"))  # docs/modules.md: after the module dump; docs/compare.md: config diff
    tables["config_diff"] = diff_configs(dump_a, dump_b, ignore=config_ignore, ignore_defaults=config_ignore_defaults,
                                         read_errors=read_errors)
    explain_config(summary, tables["config_diff"], first and first["canonical_key"], saved_configs(dump_a, dump_b),
                   flow_warning([k["key"] for k in summary["keys"]], key_map, order))
    return tables, summary


def _grad_probe_step(grads: pa.Table | None, flagged: dict[str, Any] | None) -> int | None:
    """The probe step (run A's) at which the first flagged gradient step was taken."""
    if grads is None or flagged is None or "probe_step_a" not in grads.column_names:
        return None
    import pyarrow.compute as pc

    mask = pc.and_(pc.and_(pc.equal(grads["monitor"], flagged["monitor"]), pc.equal(grads["rank"], flagged["rank"])),
                   pc.equal(grads["step"], flagged["step"]))
    steps = grads.filter(mask)["probe_step_a"].drop_null()
    return int(steps[0].as_py()) if len(steps) else None


def _warm_up_kernels() -> None:
    from rlprobe.compare.pair_metrics import warm_up

    warm_up()


def _load_stats(con, name: str, dump: Dump, read_errors: list[str], side: str) -> None:
    """One run's key-data statistics of committed steps as the DuckDB table `name` (rank column
    included; a column that older parts lack, such as `absent`, reads as null).

    rlprobe dumps: parts whose footer cannot be read or whose columns are not key data's are
    left out, each a message in `read_errors`; DuckDB reads the others at once, and if that fails
    (a corrupt data page), they are read one by one, and each unreadable one is a message too."""
    schema = with_rank(KEY_DATA)
    columns = ", ".join(f'"{f.name}"' for f in KEY_DATA)
    create = f'CREATE OR REPLACE TEMP TABLE {name} AS SELECT {columns}, "rank" FROM '
    if dump.format == "rlprobe":
        errors: list[str] = []
        parts = dump.checked_parts("key_data", errors)
        files = [f for fs in parts.values() for f in fs]
        if files:
            import duckdb

            part_rank = pa.table({"filename": pa.array(files, pa.string()),
                                  "rank": pa.array([r for r, fs in parts.items() for _ in fs], pa.int64())})
            helpers = {"_part_rank": part_rank, "_key_data_columns": KEY_DATA.empty_table()}
            committed = dump.committed_table("key_data")
            where = ""
            if committed.num_rows:  # committed steps only, as rlprobe.open shows them
                helpers["_committed"] = committed
                where = (" WHERE _part_rank.rank NOT IN (SELECT rank FROM _committed) OR EXISTS (SELECT 1 FROM "
                         "_committed c WHERE c.rank = _part_rank.rank AND step BETWEEN c.first_step AND c.last_step)")
            for helper, table in helpers.items():
                con.register(helper, table)
            try:
                con.execute(create + "(SELECT * FROM _key_data_columns UNION ALL BY NAME SELECT * FROM "
                            "read_parquet($files, filename = true, union_by_name = true, hive_partitioning = false)) "
                            "JOIN _part_rank USING (filename)" + where, {"files": files})
                read_errors.extend(f"run {side}: {e}" for e in errors)
                return
            except duckdb.Error:
                pass  # a corrupt data page (DuckDB names no file): read part by part below, to name it
            finally:
                for helper in helpers:
                    con.unregister(helper)
    errors = []  # arrow() checks the parts again and names each one it cannot read
    table = dump.arrow("key_data", errors=errors)
    read_errors.extend(f"run {side}: {e}" for e in errors)
    table = table.select(schema.names) if table.num_rows else schema.empty_table()  # arrow() conforms to KEY_DATA
    con.register("_stats_arrow", table)
    try:
        con.execute(create + "_stats_arrow")
    finally:
        con.unregister("_stats_arrow")


def _results_table(results: dict[int, dict[str, Any]]) -> pa.Table:
    rows = []
    for pair_id, r in results.items():
        rows.append({"pair_id": pair_id, "numel": r.get("numel"), "equal_count": r.get("equal_count"),
                     "first_mismatch_index": r.get("first_mismatch_index"), "max_abs_err": r.get("max_abs_err"),
                     "max_rel_err": r.get("max_rel_err"), "within_1e3_count": r.get("within_1e3_count"),
                     "within_1e2_count": r.get("within_1e2_count"), "cosine": r.get("cosine"),
                     "nan_mismatch_count": r.get("nan_mismatch_count"), "error": r.get("error")})
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("pair_id", pa.int64()), ("numel", pa.int64()), ("equal_count", pa.int64()), ("first_mismatch_index", pa.int64()),
        ("max_abs_err", pa.float64()), ("max_rel_err", pa.float64()), ("within_1e3_count", pa.int64()),
        ("within_1e2_count", pa.int64()), ("cosine", pa.float64()), ("nan_mismatch_count", pa.int64()),
        ("error", pa.string())]))


def _prepend_read_errors(key_data: pa.Table, read_errors: list[str]) -> pa.Table:
    """An unreadable stats part becomes an error row (step -1, so it is the first thing to fix)."""
    if not read_errors:
        return key_data
    rows = [{"key": "(unreadable stats)", "step": -1, "rank": -1, "micro_step": -1, "index": str(i),
             "status": "error", "message": msg, "canonical_key": "(unreadable stats)", "flow_position": -1}
            for i, msg in enumerate(read_errors)]
    extra = pa.Table.from_pylist(rows, schema=pa.schema([key_data.schema.field(c) for c in rows[0]]))
    return pa.concat_tables([extra, key_data], promote_options="default")


def _mark_first(key_data: pa.Table, first: dict[str, Any] | None) -> pa.Table:
    """key_data with is_first_divergence: true on the first row equal to `first` (by key)."""
    import numpy as np
    import pyarrow.compute as pc

    flags = np.zeros(key_data.num_rows, np.bool_)
    if first is not None and key_data.num_rows:
        mask = None
        for c in ("key", "step", "rank", "micro_step", "index"):
            value = first[c]
            eq = pc.is_null(key_data[c]) if value is None else pc.fill_null(pc.equal(key_data[c], value), False)
            mask = eq if mask is None else pc.and_(mask, eq)
        hit = pc.index(mask, True).as_py()
        if hit >= 0:
            flags[hit] = True
    return key_data.append_column("is_first_divergence", pa.array(flags, pa.bool_()))


def _canonical(con, key: str) -> str:
    rows = con.execute("SELECT canonical FROM key_order WHERE name = ?", [key]).fetchall()
    return rows[0][0] if rows else key


def _on_policy(con, table: str) -> list[dict[str, Any]]:
    con.execute(f"CREATE OR REPLACE TEMP VIEW stats AS SELECT * FROM {table}")
    return _records(con.execute(sql_text("on_policy_recompute.sql")))


def _arrow(con, query: str, params: dict[str, Any] | None = None) -> pa.Table:
    """A query's result as an Arrow table (DuckDB 1.x and 2.x spell it differently)."""
    relation = con.sql(query, params=params)
    to_table = getattr(relation, "to_arrow_table", None) or getattr(relation, "arrow")
    return to_table()


def _has_tensor_files(con, table: str) -> bool:
    return bool(con.execute(f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE tensor_file <> '' LIMIT 1)")
                .fetchall()[0][0])


def _with_pairs(key_data_sql: str, pairs_sql: str) -> str:
    """key_data.sql reading its `pairs` from key_data_pairs.sql as a CTE (one pass, nothing materialised)."""
    head = "WITH joined AS ("
    if head not in key_data_sql:
        raise ValueError(f"key_data.sql no longer starts its query with {head!r}")
    return key_data_sql.replace(head, f"WITH pairs AS (\n{pairs_sql}\n),\njoined AS (", 1)


def _statement(sql: str) -> str:
    return sql.strip().rstrip(";").strip()


def _records(result) -> list[dict[str, Any]]:
    columns = [d[0] for d in result.description]
    return [dict(zip(columns, row)) for row in result.fetchall()]


# -- outputs -------------------------------------------------------------------------------
WORK_PREFIX = ".rlprobe-tmp-"


def _work_dir(out: Path) -> "WorkDir":
    """A work folder inside `out`, after removing those of killed comparisons into `out`."""
    from rlprobe.report.work_dir import WorkDir, remove_dead_work_dirs

    try:
        out.mkdir(parents=True, exist_ok=True)
        remove_dead_work_dirs(out, WORK_PREFIX)
        return WorkDir(out, WORK_PREFIX)
    except OSError as e:
        raise ProbeError(f"output directory {out} cannot be written: {e.strerror or e}") from None


def _which_file(error: OSError, work: Path) -> str:
    """' (writing report.xlsx)' for an error that names a file of the work folder."""
    name = getattr(error, "filename", None)
    if not name:
        return ""
    try:
        relative = Path(name).relative_to(work)
    except ValueError:
        return ""
    if is_temporary(relative):  # an atomic write's temporary: name the file it was to become
        relative = relative.with_name(relative.name[1:relative.name.index(TMP_MARK)])
    return f" (writing {relative})"


def _write_outputs(work: Path, tables: dict[str, pa.Table], summary: dict[str, Any], *, lang: str,
                   per_key_files: bool, per_key_dir: str, reports: bool) -> None:
    key_data = tables["key_data"]
    pq.write_table(key_data, work / "key_data.parquet", compression="zstd")
    xlsx_extras = write_extra_tables(work, tables)
    (work / "summary.json").write_text(json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    if not reports:
        return
    from rlprobe.report.csv_report import write_key_data_csv
    from rlprobe.report.markdown import write_summary_md
    from rlprobe.report.xlsx import write_per_key_xlsx, write_report_xlsx

    public = public_key_data(key_data)
    write_key_data_csv(work / "key_data.csv", public, lang=lang)
    write_summary_md(work / "summary.md", summary, public)
    write_report_xlsx(work / "report.xlsx", public, summary, lang=lang, **xlsx_extras)
    if per_key_files:
        write_per_key_xlsx(work / per_key_dir, public, lang=lang)


def public_key_data(key_data: pa.Table) -> pa.Table:
    """key_data as the reports show it: without the internal file and ordering columns."""
    return key_data.drop_columns([c for c in ("file_a", "file_b", "canonical_key", "flow_position")
                                  if c in key_data.column_names])


# the Grad flags sheet's columns: why a row is flagged (`flagged` also puts flagged rows first
# when the sheet is capped); the raw max/min/zero fractions of both runs stay in grads.parquet
# (the sheet took 2/3 of report.xlsx's time with them)
GRAD_FLAG_COLUMNS = ("monitor", "rank", "step", "param", "status", "shape_a", "shape_b", "numel", "similarity",
                     "prev_similarity", "flagged", "flag_reason", "norm_a", "norm_b", "norm_rel_diff", "max_abs_diff",
                     "min_abs_diff", "digest_equal", "probe_step_a", "probe_step_b", "message")


def write_extra_tables(work: Path, tables: dict[str, pa.Table]) -> dict[str, Any]:
    """The module and gradient comparisons that ran, under `work`: modules.parquet, grads.parquet,
    grad_steps.parquet and grads/.../similarities.csv. Returns the keyword arguments of
    write_report_xlsx that add their sheets (`rlprobe compare` and pipelines write the same)."""
    extra_sheets: dict[str, pa.Table] = {}
    if "config_diff" in tables:  # every changed config path, the ignored ones marked (docs/compare.md)
        pq.write_table(tables["config_diff"], work / "config_diff.parquet", compression="zstd")
    if "modules" in tables:
        from rlprobe.compare.modules import public_table

        extra_sheets["Modules"] = public_table(tables["modules"])
        pq.write_table(extra_sheets["Modules"], work / "modules.parquet", compression="zstd")
    if "grads" in tables:
        import pyarrow.compute as pc

        from rlprobe.compare.grads import write_grad_outputs

        write_grad_outputs(work, tables)
        extra_sheets["Grads"] = tables["grad_steps"]
        grads = tables["grads"]  # the Grad flags sheet: flagged rows and parameters on one side only
        noted = pc.or_kleene(pc.fill_null(grads["flagged"], False),
                             pc.invert(pc.is_in(grads["status"], pa.array(["compared", "stats_only"]))))
        extra_sheets["Grad flags"] = grads.filter(pc.fill_null(noted, True)).select(
            [c for c in GRAD_FLAG_COLUMNS if c in grads.column_names])
    if "params" in tables:  # parameter fingerprints (docs/compare.md, "Parameter updates")
        from rlprobe.compare.params import write_param_outputs

        extra_sheets["Param updates"] = write_param_outputs(work, tables["params"])
    return {"extra_sheets": extra_sheets,
            "extra_files": {"Modules": "modules.parquet", "Grads": "grad_steps.parquet", "Grad flags": "grads.parquet",
                            "Param updates": "params.parquet"},
            "grad_matrix": (tables["grads"], tables["grad_steps"]) if "grads" in tables else None}


def _publish(work: Path, out: Path) -> None:
    """Move finished files into `out` (each a rename), so no half-written report is ever there."""
    for item in sorted(work.iterdir()):
        target = out / item.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        item.replace(target)


def jsonable(value: Any) -> Any:
    """Strict JSON: non-finite floats become the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
