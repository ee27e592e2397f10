"""The weights at a module dump (kind `module_param`, capture/stages.py) compared, and the
verdict they change: a module whose inputs agree and whose output does not is blamed only when the
weights it ran with agree too; where the weights of the stage's model differ at that step, the
verdict says so and names the first parameter that differs (docs/modules.md, "Weights at the call").
Judged by the fingerprint rule of parameter updates (sql/fingerprint_macros.sql) within the
comparison's tolerance of each dtype."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from rlprobe.comparison.params import fingerprint_tolerance
from rlprobe.comparison.tolerance import Tolerance
from rlprobe.lake.reader import Dump
from rlprobe.lake.schema import MODULE_PARAM, with_rank
from rlprobe.lake.sql_runner import execute, run

WEIGHT_FIELDS = ("stage", "step", "rank", "block", "module", "call", "parameter", "status", "rel_err", "rtol", "dtype",
                 "dtype_a", "dtype_b")


def has_module_weights(dump: Dump) -> bool:
    return dump.format == "rlprobe" and bool(dump.parts("module_param"))


def module_weight_table(dump: Dump, errors: list[str] | None = None) -> pa.Table:
    schema = with_rank(MODULE_PARAM)
    table = dump.arrow("module_param", errors=errors)
    return table.select(schema.names).cast(schema) if table.num_rows else schema.empty_table()


def compare_module_weights(dump_a: Dump, dump_b: Dump, *, tolerance: Tolerance | None = None,
                           steps: list[int] | None = None, ranks: list[int] | None = None,
                           stages: list[str] | None = None, exact: bool = True,
                           read_errors: list[str] | None = None) -> tuple[pa.Table, list[dict[str, Any]]]:
    """(the `module_weights` table: every fingerprint pair with its status, the first differing
    weights per (stage, step, rank), earliest step first); `stages`, `steps`, `ranks` (None: all)
    select as compare_modules does; `exact` false (the runs' layouts differ): within at least the
    layout tolerance, as parameter updates are judged."""
    import duckdb
    import pyarrow.compute as pc

    con = duckdb.connect()
    for dump, side in ((dump_a, "a"), (dump_b, "b")):
        errors: list[str] = []
        table = module_weight_table(dump, errors)
        if read_errors is not None:
            read_errors.extend(f"run {side.upper()}: {e}" for e in errors)
        if steps:
            table = table.filter(pc.is_in(table["step"], pa.array(steps, pa.int64())))
        if ranks:
            table = table.filter(pc.is_in(table["rank"], pa.array(ranks, pa.int64())))
        if stages:
            table = table.filter(pc.is_in(table["stage"], pa.array(stages, pa.string())))
        con.register(f"module_weights_{side}", table)
    con.register("module_weight_tolerance", fingerprint_tolerance(tolerance, exact))
    execute(con, "fingerprint_macros.sql")
    weights = run(con, "module_weights.sql")
    con.register("module_weights", weights)
    return weights, run(con, "module_weights_first_difference.sql").to_pylist()


def model_of(stage: str) -> str:
    """The model a stage runs, as its name says: actor_compute_log_prob -> actor, critic_update ->
    critic; a name without _compute/_update is its own."""
    return re.split(r"_(?:compute|update)", stage, maxsplit=1)[0] or stage


def weights_text(weights: dict[str, Any]) -> str:
    """`the weights of 'actor' differ at step 1 (first parameter 'embed.weight', ...)`."""
    where = ("check how that run loads or casts the model (its dtype, .to(), autocast)"
             if weights["status"] == "dtype_mismatch" else
             "find where they parted: the update before this step (its optimizer settings and gradients) or the "
             "loading or sync of the weights")
    return (f"the weights of {model_of(weights['stage'])!r} differ at step {weights['step']} (first parameter "
            f"{weights['parameter']!r}, stage {weights['stage']} rank {weights['rank']}: {_how(weights)}): every "
            f"module computes from other weights, so no module is blamed; {where}")


def _how(weights: dict[str, Any]) -> str:
    if weights["status"] == "shape_mismatch":
        return "shapes differ"
    if weights["status"] == "dtype_mismatch":
        return f"held in {weights['dtype_a']} in run A, {weights['dtype_b']} in run B"
    return f"fingerprint error {weights['rel_err']:.3g} > rtol {weights['rtol']:.3g} ({weights['dtype']})"


def add_module_weights(tables: dict[str, pa.Table], summary: dict[str, Any], dump_a: Dump, dump_b: Dump, *,
                       tolerance: Tolerance | None, steps: list[int] | None, ranks: list[int] | None,
                       stages: list[str] | None = None, read_errors: list[str]) -> None:
    """Where either run's module dumps hold weights: tables["module_weights"], summary's
    `module_weights_first_difference`, and the module verdict rewritten where the weights of the
    first diverging module's stage differ at that step (or, with no module diverging, named)."""
    if not (has_module_weights(dump_a) or has_module_weights(dump_b)):
        return
    exact = not (summary.get("layout") or {}).get("per_sample")
    tables["module_weights"], firsts = compare_module_weights(dump_a, dump_b, tolerance=tolerance, steps=steps,
                                                              ranks=ranks, stages=stages, exact=exact,
                                                              read_errors=read_errors)
    summary["module_weights_first_difference"] = _fields(firsts[0]) if firsts else None
    first = summary.get("module_first_divergence")
    found = weights_at(firsts, first) if first is not None else (firsts[0] if firsts else None)
    if found is None:
        return
    text = weights_text(found)
    if first is not None:
        first["weights"] = _fields(found)
    if summary.get("module_suspect") is not None and summary.get("suspect") == summary["module_suspect"]:
        summary["suspect"] = text
    elif summary.get("suspect") is None:  # every module agrees within rounding, yet the weights differ
        summary["suspect"] = text
        summary["advice"] = ("the module dumps' outputs agree, but the weights they ran with differ beyond rounding "
                             "(module_weights.parquet): " + text.split("; ", 1)[-1])
    summary["module_suspect"] = text


def weights_at(firsts: list[dict[str, Any]], first: dict[str, Any]) -> dict[str, Any] | None:
    """The differing weights that explain the first module divergence: the weights of its stage's
    model at its step and rank."""
    for f in firsts:
        if (f["stage"], f["step"], f["rank"]) == (first["stage"], first["step"], first["rank"]):
            return f
    return None


def _fields(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in WEIGHT_FIELDS}
