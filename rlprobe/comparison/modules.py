"""Module-level comparison: match both runs' module tensors, compare them, and name the first
module whose output diverges while its inputs still match (docs/modules.md).

Rows are matched by (stage, step, rank, module, call, direction, io, index) and ordered by run
A's execution sequence. With tensors saved in both runs they are compared element-wise by the
pair executor; otherwise by hash, or by statistics within a dtype-aware tolerance.
"""

from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa

from rlprobe.comparison.pair_results import pair_results_table
from rlprobe.comparison.tolerance import EPS, Tolerance
from rlprobe.lake.reader import Dump
from rlprobe.lake.schema import MODULE, with_rank
from rlprobe.lake.sql_runner import execute, records, run

FIRST_FIELDS = ("stage", "step", "rank", "module", "call", "direction", "io", "index", "status", "inputs_match",
                "seq", "max_abs_err", "max_rel_err", "message")
PRIVATE_COLUMNS = ("file_a", "file_b", "io_order")


def compare_modules(dump_a: Dump, dump_b: Dump, *, stages: list[str] | None = None, steps: list[int] | None = None,
                    ranks: list[int] | None = None, workers: int = 2, tolerance: Tolerance | None = None,
                    stats_rtol: float | None = None, progress: Callable[[int, int], None] | None = None,
                    executor: Callable[..., dict] | None = None,
                    read_errors: list[str] | None = None) -> tuple[pa.Table, dict[str, Any] | None]:
    """(modules table, first divergence or None). Pairs are judged as key data are (`tolerance`: the
    comparison's, its defaults per dtype and --rtol/--atol; families and keys are key data's only);
    `stats_rtol` overrides the tolerance of statistics-only rows (0: exact)."""
    import duckdb

    from rlprobe.comparison.executor import PairTask, run_pairs

    errors = read_errors if read_errors is not None else []
    con = duckdb.connect()
    con.register("module_a", _module_stats(dump_a, errors, "A"))
    con.register("module_b", _module_stats(dump_b, errors, "B"))
    tolerance = (tolerance or Tolerance()).with_overrides(stats_rtol=stats_rtol)
    con.register("module_tolerance", tolerance.table((None, None, dtype) for dtype in EPS))
    execute(con, "pair_macros.sql")
    pairs = run(con, "module_pairs.sql", stages=stages, steps=steps, ranks=ranks)
    con.register("module_pairs", pairs)
    tasks = []
    for row in pairs.select(["pair_id", "in_a", "in_b", "file_a", "file_b", "shape_a", "shape_b"]).to_pylist():
        if row["in_a"] and row["in_b"] and row["file_a"] and row["file_b"] and row["shape_a"] == row["shape_b"]:
            tasks.append(PairTask(row["pair_id"], str(dump_a.path / row["file_a"]), str(dump_b.path / row["file_b"])))
    results = (executor or run_pairs)(tasks, workers=workers, progress=progress)
    con.register("module_results", pair_results_table(results))
    modules = run(con, "modules.sql")
    con.register("modules", modules)
    rows = records(con, "module_first_divergence.sql")
    first = {k: rows[0].get(k) for k in FIRST_FIELDS} if rows else None
    return _mark_first(modules, first), first


def public_table(modules: pa.Table) -> pa.Table:
    """modules.parquet / the Modules sheet: without the internal file and ordering columns."""
    return modules.drop_columns([c for c in PRIVATE_COLUMNS if c in modules.column_names])


def describe(first: dict[str, Any] | None) -> str | None:
    """The first module divergence in words."""
    if first is None:
        return None
    name = first["module"] or "(the whole model)"
    where = (f"{first['stage']} step {first['step']} rank {first['rank']}: module {name!r} "
             f"call {first['call']} {first['direction']}")
    inputs = "grad_output" if first["direction"] == "backward" else "inputs"
    if first["status"] in ("only_in_a", "only_in_b"):
        return f"{where}: {first['io']} {first['index']!r} exists only in run {first['status'][-1].upper()}; " \
               "the runs called different modules (check the model code and config)"
    if first["inputs_match"] is True:
        return f"{where}: its {inputs} match and its {first['io']} differs -> this module's computation diverges"
    if first["inputs_match"] is False:
        return (f"{where}: its {inputs} already differ while every module call before it matches -> the code "
                "between hooked modules (a functional op in the parent's forward) or the data fed to the model")
    return f"{where}: its {first['io']} differs (it has no tensor {inputs} to check)"


def _module_stats(dump: Dump, errors: list[str], side: str) -> pa.Table:
    found: list[str] = []
    table = dump.arrow("module", errors=found)
    errors.extend(f"run {side}: {e}" for e in found)
    schema = with_rank(MODULE)
    return table.select(schema.names) if table.num_rows else schema.empty_table()


def _mark_first(modules: pa.Table, first: dict[str, Any] | None) -> pa.Table:
    flags = [False] * modules.num_rows
    if first is not None:
        names = ("stage", "step", "rank", "module", "call", "direction", "io", "index")
        target = tuple(first[c] for c in names)
        for i, row in enumerate(zip(*(modules[c].to_pylist() for c in names))):
            if row == target:
                flags[i] = True
                break
    return modules.append_column("is_first_divergence", pa.array(flags, pa.bool_()))

