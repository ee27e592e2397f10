"""What each run shows about itself, for the two-run verdict: the single-run rules of `rlprobe check`
that explain a divergence (sql/check/on_policy.sql, sql/check/rollout_vs_recompute.sql), read on
each run through rlprobe.checks.check_dump. check is a library below compare: compare imports it,
it never imports compare (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlprobe.errors import ProbeError
from rlprobe.key_names import canonical_names
from rlprobe.lake.reader import Dump

RULES = ("on_policy", "rollout_vs_recompute")
# the canonical keys (rlprobe/key_names.csv) without which neither rule applies: a run that saved
# none of these sets is not checked at all (reading its statistics again costs ~1 s per 300k rows)
NEEDS = ({"log_prob", "old_log_prob"}, {"rollout_log_prob", "old_log_prob"}, {"rollout_log_prob", "log_prob"})
ROLLOUT_PAIRS = ("rollout_vs_old", "rollout_vs_log_prob")


@dataclass
class SingleRunFindings:
    """Per run name: the on-policy pairs whose log_prob and old_log_prob are not bitwise equal (the
    on_policy rule at tolerance 0; `within_tolerance` says whether its default tolerance, the dtype's
    rounding, covers the row, `tolerance` is that default where it does not), the rollout_vs_recompute
    rule's (the rollout engine disagrees with the trainer), and the largest token |Δ| rollout −
    trainer of every step compared (None: none)."""

    on_policy: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rollout: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rollout_max_abs: dict[str, float | None] = field(default_factory=dict)


def single_run_findings(dumps: dict[str, Dump], saved_keys: dict[str, set[str]],
                        connections: dict[str, Any] | None = None,
                        key_map: dict[str, str] | None = None) -> SingleRunFindings:
    """Run the rules on each dump (name -> Dump) whose saved keys (`saved_keys[name]`) may let one
    apply, in `connections[name]` where given (DuckDB connections of the caller's, one a run: a cursor of
    the comparison's own costs ~20 µs where duckdb.connect() starts a database, ~25 ms of CPU). A rule
    that does not apply (status not_applicable) says nothing; a dump the rules cannot read says nothing
    either (the comparison reports its read errors). The rules read each key as the comparison does: through
    rlprobe/key_names.csv, its ambiguous names decided by the keys of all `dumps`, and the user's `key_map`."""
    names = canonical_names(set().union(*saved_keys.values()) if saved_keys else (), key_map)
    found = SingleRunFindings()
    for name, dump in dumps.items():
        keys = {names.get(k, k) for k in saved_keys.get(name, ())}
        if not any(need <= keys for need in NEEDS):
            continue
        # imported only for a run a rule may apply to (~25 kB of source and pyarrow.compute: start-up)
        from rlprobe.checks.registry import all_params
        from rlprobe.checks.run import check_dump

        ulps = all_params()["on_policy_ulps"]  # the rule's default tolerance, in ulps of the value
        try:
            # on_policy_ulps 0: every on-policy pair that is not bitwise equal (a bitwise divergence
            # between runs is what the verdict explains); each row then says whether the check's
            # default tolerance (rounding of the dtype) covers it
            # maxima_only: the on-policy pairs reduced to what on_policy.sql reads (token count, max |Δ|)
            result = check_dump(dump, {"on_policy_ulps": 0}, only=RULES, con=(connections or {}).get(name),
                                maxima_only=True, key_names=names)
        except ProbeError:
            continue
        strict = _rows(result, "on_policy")
        if strict:
            found.on_policy[name] = [_judged(r, ulps) for r in strict]
        if _rows(result, "rollout_vs_recompute"):
            found.rollout[name] = _rows(result, "rollout_vs_recompute")
        applies = {r["check"] for r in result.results.to_pylist() if r["status"] != "not_applicable"}
        steps = result.tables.get("token_steps")
        if "rollout_vs_recompute" in applies and steps is not None:
            values = [r["max_abs"] for r in steps.to_pylist()
                      if r["pair"] in ROLLOUT_PAIRS and r["max_abs"] is not None]
            found.rollout_max_abs[name] = max(values) if values else None
    return found


def _judged(row: dict[str, Any], ulps: float) -> dict[str, Any]:
    """An on_policy row of tolerance 0 judged at `ulps` as sql/check/on_policy.sql judges it: beyond
    the tolerance where the difference exceeds it or is unknown or NaN (`tolerance` then says how much
    it was, else None)."""
    tolerance = ulps * row["tolerance_per_ulp"]
    diff = row["max_abs_diff"]
    beyond = diff is None or diff != diff or diff > tolerance
    return {**row, "tolerance": tolerance if beyond else None, "within_tolerance": not beyond}


def _rows(result: Any, rule: str) -> list[dict[str, Any]]:
    """The offending rows of `rule` (none where it does not apply)."""
    status = {r["check"]: r["status"] for r in result.results.to_pylist()}
    rows = result.rows.get(rule)
    return rows.to_pylist() if status.get(rule) not in (None, "not_applicable") and rows is not None else []
