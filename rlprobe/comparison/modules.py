"""Module-level comparison: match both runs' module tensors, compare them, and name the first
module whose output diverges while its inputs still match (docs/modules.md).

Rows are matched by (stage, step, rank, module, call, direction, io, index) and ordered by run
A's execution sequence. With tensors saved in both runs they are compared element-wise by the
pair executor; otherwise by hash, or by statistics within a dtype-aware tolerance.

The weights at a module dump (kind `module_param`, capture/stages.py) are compared here too
(compare_module_weights), with the verdict they change: a module whose inputs agree and whose output does not is
blamed only when the weights it ran with agree too; where the weights of the stage's model differ at that step,
the verdict says so and names the first parameter that differs (docs/modules.md, "Weights at the call"). Judged
by the fingerprint rule of parameter updates (sql/fingerprint_macros.sql) within the comparison's tolerance of
each dtype.

Last, the verdict after a module dump was compared (docs/modules.md, "After the module dump"): no advice to
take the dump the comparison already holds; a model whose every module matches is declared fine, and the code
around it (its inputs, the loss, the update) becomes the suspect.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import pyarrow as pa

from rlprobe.comparison.pair_results import pair_results_table
from rlprobe.comparison.params import fingerprint_tolerance
from rlprobe.comparison.tolerance import EPS, Tolerance
from rlprobe.lake.reader import Dump
from rlprobe.lake.schema import MODULE, MODULE_PARAM, with_rank
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


MATCHING = ("match", "stats_only_match", "close", "stats_only_close")  # close: within rounding
# what surrounds a model in each stage, where the difference must be when all its modules match
AROUND = {
    "actor_update": "the inputs assembled for the update (the batch, masks, old log-probs and advantages it is "
                    "given), the loss and its aggregation, gradient clipping and the optimizer step",
    "critic_update": "the inputs assembled for the critic's update (returns, old values, masks), the value loss "
                     "and its clipping, and the optimizer step",
}
AROUND_FORWARD = ("the inputs assembled for it (token ids, attention mask, position ids, padding) and the code "
                  "that turns its outputs into the key data (log-softmax and gather, temperature scaling, masking)")


def dumped_steps(modules: pa.Table | None) -> dict[tuple[str, int], bool]:
    """(stage, step) held by both runs' module dumps -> whether every compared module row matches."""
    found: dict[tuple[str, int], bool] = {}
    if modules is None or not modules.num_rows:
        return found
    for stage, step, status in zip(*(modules[c].to_pylist() for c in ("stage", "step", "status"))):
        found[(stage, step)] = found.get((stage, step), True) and status in MATCHING
    return found


def follow_up(summary: dict[str, Any], modules: pa.Table | None) -> None:
    """Rewrite advice and next_config in `summary` in place when the advised module dump is the
    one compared: point at the diverging module, or declare the model fine."""
    config = (summary.get("next_config") or {}).get("rlprobe_config") or {}
    stages, step = config.get("stages") or [], config.get("step_start")
    if len(stages) != 1 or step is None:
        return
    stage = stages[0]
    held = dumped_steps(modules)
    if (stage, step) not in held:
        return
    summary["next_config"] = None
    summary["module_dump_compared"] = {"stage": stage, "step": step, "all_match": held[(stage, step)]}
    first = summary.get("module_first_divergence")
    if not held[(stage, step)] and first is not None and first.get("weights"):
        summary["advice"] = (f"the advised module dump ({stage}, step {step}) is compared here, and no module is to "
                             f"blame: {weights_text(first['weights'])}")
        return
    if not held[(stage, step)] and first is not None:
        summary["advice"] = (f"the advised module dump ({stage}, step {step}) is compared here: start from the "
                             f"first diverging module, {first.get('module') or '(the whole model)'!r} "
                             "(its inputs and outputs per call are in modules.parquet and the Modules sheet)")
        return
    if not held[(stage, step)]:
        return
    around = AROUND.get(stage, AROUND_FORWARD)
    summary["model_fine"] = {"stage": stage, "step": step}
    summary["suspect"] = (f"{summary.get('suspect')}; but every module of the model in {stage} at step {step} "
                          f"matches in the module dump: that model is fine, the code around it differs")
    summary["advice"] = (f"the model of {stage} computes the same from the same inputs; look at the code around it: "
                         f"{around}")
