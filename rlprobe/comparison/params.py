"""Parameter updates: both runs' fingerprints after each optimizer step matched in SQL
(param_diff.sql, param_first_difference.sql), and the verdict that names an update that differs
before it blames a forward (docs/compare.md, "Parameter updates")."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from rlprobe.comparison.options import has_params
from rlprobe.comparison.sample_alignment import first_rank_only, layout_rtol
from rlprobe.comparison.tolerance import EPS, Tolerance
from rlprobe.lake.reader import Dump
from rlprobe.lake.schema import PARAM, with_rank
from rlprobe.lake.sql_runner import execute, run

# which model's forward produces a key: words one of its monitor names contains
KEY_MODELS = {
    "values": ("critic", "value"),
    "responses": ("actor", "policy"), "rollout_log_prob": ("actor", "policy"),
    "old_log_prob": ("actor", "policy"), "log_prob": ("actor", "policy"), "entropy": ("actor", "policy"),
    "rewards": ("reward",), "token_level_scores": ("reward",),
}
UPDATE_KEYS = {"log_prob", "entropy", "ratio", "pg_loss", "vf_loss", "loss"}  # made by the model being updated


def add_param_comparison(tables: dict[str, pa.Table], summary: dict[str, Any], dump_a: Dump, dump_b: Dump,
                         canonical_key: str | None, read_errors: list[str], steps: Any, ranks: Any,
                         tolerance: Tolerance | None = None, config_diff: pa.Table | None = None) -> None:
    """Where either run recorded fingerprints: tables["params"], summary's params_compared and
    param_first_difference (with what the gradients of that update say: update_gradients), and the
    verdict of a differing update (explain_update). `tables` holds the gradient comparison where it ran."""
    if not (has_params(dump_a) or has_params(dump_b)):
        return
    layout = summary.get("layout") or {}
    tables["params"], firsts = compare_params(dump_a, dump_b, exact=not layout.get("per_sample"),
                                              read_errors=read_errors, steps=steps, ranks=ranks,
                                              layout=layout if layout.get("note") else None, tolerance=tolerance)
    summary["params_compared"] = tables["params"].num_rows
    gradients = update_gradients(tables, firsts, across=bool(layout.get("note")))
    for f in firsts:
        f["gradients"] = gradients.get((f["monitor"], f["rank"], f["step"]))
    explain_update(summary, firsts, canonical_key, optimizer_changes(config_diff))


def update_gradients(tables: dict[str, pa.Table], firsts: list[dict[str, Any]],
                     across: bool = False) -> dict[tuple[Any, Any, Any], dict[str, Any]]:
    """(monitor, rank, step) -> update_noise.sql's row for each first differing update: how many of the
    parameters that differ after it had a gradient within rounding of zero, one whose signs flipped on
    some elements, or a solid one; {} without a gradient comparison (`tables` has no `grads`)."""
    if not firsts or "grads" not in tables or "grad_steps" not in tables:
        return {}
    import duckdb

    from rlprobe.comparison.grads import DEFAULTS

    con = duckdb.connect()
    con.register("params", tables["params"])
    con.register("grads", tables["grads"])
    con.register("grad_steps", tables["grad_steps"])
    con.register("firsts", pa.table({k: [f[k] for f in firsts] for k in ("monitor", "rank", "step")}))
    minimum = DEFAULTS["layout_similarity_min" if across else "first_step_min"]
    return {(r["monitor"], r["rank"], r["step"]): r
            for r in run(con, "update_noise.sql", similarity_min=minimum).to_pylist()}


def optimizer_changes(config_diff: pa.Table | None) -> list[str]:
    """The changed optimizer settings of the config diff (config_families.yaml's learning_rate family:
    learning rate and schedule, betas, eps, weight decay, clipping, the optimizer)."""
    if config_diff is None:
        return []
    from rlprobe.comparison.config_diff import changed

    return [r["path"] for r in changed(config_diff) if r["family"] == "learning_rate"]


def param_table(dump: Dump, errors: list[str] | None = None) -> pa.Table:
    schema = with_rank(PARAM)
    table = dump.arrow("param", errors=errors)
    return table.select(schema.names).cast(schema) if table.num_rows else schema.empty_table()


def compare_params(dump_a: Dump, dump_b: Dump, *, exact: bool, read_errors: list[str] | None = None,
                   steps: list[int] | None = None, ranks: list[int] | None = None,
                   layout: dict[str, Any] | None = None,
                   tolerance: Tolerance | None = None) -> tuple[pa.Table, list[dict[str, Any]]]:
    """(the `params` table: every fingerprint pair with its status, the first differing update
    per monitor, earliest first). A pair is close within `tolerance`'s rtol of its dtype (None: the
    defaults per dtype; rtol 0: bitwise, sql/fingerprint_macros.sql); `exact` false (the runs' layouts
    differ, so reductions ran in another order): within at least the layout tolerance.
    `layout`: summary.json's layout where it notes a difference: each run's first rank only
    (sample_alignment.first_rank_only; `layout` gets a `params` entry and a longer note)."""
    import duckdb

    con = duckdb.connect()
    tables = []
    for dump, side in ((dump_a, "A"), (dump_b, "B")):
        errors: list[str] = []
        table = param_table(dump, errors)
        if read_errors is not None:
            read_errors.extend(f"run {side}: {e}" for e in errors)
        tables.append(_narrowed(table, steps, None if layout is not None else ranks))
    if layout is not None:  # first_rank_only selects the ranks
        tables = list(first_rank_only(tables[0], tables[1], layout, "params", "fingerprint", ranks))
    con.register("params_a", tables[0])
    con.register("params_b", tables[1])
    con.register("param_tolerance", fingerprint_tolerance(tolerance, exact))
    execute(con, "fingerprint_macros.sql")
    params = run(con, "param_diff.sql")
    con.register("params", params)
    return params, run(con, "param_first_difference.sql").to_pylist()


def fingerprint_tolerance(tolerance: Tolerance | None, exact: bool = True) -> pa.Table:
    """dtype -> rtol, the table fingerprint pairs are judged by: the comparison's rtol of each dtype
    (its defaults, --rtol; key families do not apply to weights), at least the layout tolerance where
    the layouts differ (`exact` false)."""
    rtols = (tolerance or Tolerance()).table((None, None, dtype) for dtype in EPS)["rtol"].to_pylist()
    if not exact:
        rtols = [max(r, layout_rtol(d)) for r, d in zip(rtols, EPS)]
    return pa.table({"dtype": list(EPS), "rtol": pa.array(rtols, pa.float64())})


def _narrowed(table: pa.Table, steps: list[int] | None, ranks: list[int] | None) -> pa.Table:
    import pyarrow.compute as pc

    if steps:
        table = table.filter(pc.is_in(table["probe_step"], pa.array(steps, pa.int64())))
    if ranks:
        table = table.filter(pc.is_in(table["rank"], pa.array(ranks, pa.int64())))
    return table


def suspect_update(firsts: list[dict[str, Any]], first: dict[str, Any] | None,
                   canonical_key: str | None) -> dict[str, Any] | None:
    """The first differing update that explains the first key-data divergence: one of the model
    whose forward produced the key (a monitor named after it, or the only monitor), taken at a
    probe step before the divergence (an update at the same step is a consequence: it used the
    data already diverging); with no key-data divergence, the earliest differing update."""
    if not firsts:
        return None
    if first is None:
        return firsts[0]
    words = KEY_MODELS.get(canonical_key or "")
    step = first["step"]
    for f in firsts:
        if f["probe_step"] is None or f["probe_step"] >= step:
            continue
        named = words is not None and any(w in str(f["monitor"]).lower() for w in words)
        only = len(firsts) == 1 and (words is not None or canonical_key in UPDATE_KEYS)
        if named or only:
            return f
    return None


def explain_update(summary: dict[str, Any], firsts: list[dict[str, Any]], canonical_key: str | None,
                   optimizer_changed: list[str] | None = None) -> None:
    """Put a differing update before a forward in `summary` (suspect, advice, next_config, update_noise), in
    place. `optimizer_changed`: the changed optimizer settings of the config diff (optimizer_changes)."""
    summary["param_first_difference"] = firsts[0] if firsts else None
    summary["update_noise"] = None
    if summary.get("first_divergence") is None and summary.get("module_first_divergence") is not None:
        return  # the module dumps name a module: that is the finer finding
    found = suspect_update(firsts, summary.get("first_divergence"), canonical_key)
    if found is None:
        return
    monitor, step, param = found["monitor"], found["probe_step"], found["param"]
    optimizer_step = "" if found["step"] == step else f", its optimizer step {found['step']}"
    old = summary.get("suspect") or ""
    head = old.split(" -> ", 1)[0] + " -> " if " -> " in old and summary.get("first_divergence") else ""
    noise = update_noise(found, optimizer_changed or [])
    if noise is not None:
        summary["update_noise"] = noise
        similarity = ("" if noise["weighted_similarity"] is None else
                      f"; its gradients agree in sign on {noise['weighted_similarity']:.4f} of their elements")
        summary["suspect"] = head + (
            f"rounding noise amplified by the optimizer: after update {found['step']} of model {monitor!r} (step "
            f"{step}, rank {found['rank']}) only parameters whose gradients were within rounding of zero or "
            f"flipped sign on some elements differ ({noise['params']} of {noise['compared']}: "
            f"{noise['near_zero']} near zero, {noise['sign_flipped']} with flipped signs; first "
            f"{noise['first_param']!r}); Adam-style optimizers normalise each element, so a gradient of pure "
            f"rounding becomes a full step; the inputs of that update agree within rounding (the key data it was "
            f"computed from{similarity}) and its optimizer settings are the same")
        summary["advice"] = (
            "not a changed update: to measure how far this noise grows, compare against a control run "
            "(--control, docs/across-devices.md: run A rerun under the same noise), or take both runs on one "
            "deterministic layout and device; a fault beyond the noise then still stands out")
        summary["next_config"] = None
        return
    what = (f"the update of step {step} differs for model {monitor!r} (first parameter {param!r}{optimizer_step}, "
            f"rank {found['rank']}): its weights after that optimizer step differ"
            f"{' while every fingerprint before matched' if found['matched_rows'] else ', the first fingerprinted'}")
    grad = summary.get("grad_first_flagged")
    gradients = found.get("gradients")
    if gradients is None or gradients["gradients_missing"] == gradients["params"]:
        what += ("; the gradients of that update were not captured, so whether only gradients of pure rounding "
                 "differ (noise an Adam-style optimizer amplifies) cannot be told: monitor_grads")
    if grad is not None and grad.get("monitor") == monitor:
        cause = (f"its gradients already part ways (monitor {monitor!r}, optimizer step {grad['step']}): "
                 "find why in the backward of that update")
    else:
        cause = ("check the optimizer and its settings (learning rate and schedule, betas, weight decay, "
                 "gradient clipping), then the gradients (monitor_grads) of that step")
    summary["suspect"] = head + what
    summary["advice"] = f"the forward is not the suspect, the update before it is: {cause}; see the config diff"
    summary["next_config"] = None


def update_noise(found: dict[str, Any], optimizer_changed: list[str]) -> dict[str, Any] | None:
    """summary.json's update_noise where the first differing update `found` is rounding noise the optimizer
    amplified: every parameter that differs after it had a gradient within rounding of zero or one whose signs
    flipped on some elements (update_noise.sql), none a solid gradient or none captured, and no optimizer
    setting changed in the config diff; None otherwise (the update is named as differing)."""
    g = found.get("gradients")
    if g is None or optimizer_changed or not g["differing"] or g["differing_solid"] or g["differing_missing"]:
        return None
    return {"monitor": found["monitor"], "update": found["step"], "probe_step": found["probe_step"],
            "rank": found["rank"], "params": g["differing"], "compared": g["params"],
            "near_zero": g["differing_near_zero"], "sign_flipped": g["differing_sign_flipped"],
            "first_param": g["first_param"], "weighted_similarity": g.get("weighted_similarity")}
