"""What each run shows about itself, for the two-run verdict: the single-run rules of `rlprobe check`
that explain a divergence (sql/check/on_policy.sql, sql/check/rollout_vs_recompute.sql), read on
each run through rlprobe.check.check_dump. check is a library below compare: compare imports it,
it never imports compare (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlprobe.errors import ProbeError
from rlprobe.lake.reader import Dump

RULES = ("on_policy", "rollout_vs_recompute")
ROLLOUT_PAIRS = ("rollout_vs_old", "rollout_vs_log_prob")


@dataclass
class SingleRunFindings:
    """Per run name: the on_policy rule's offending rows (the recomputation is not deterministic
    where the run is on-policy), the rollout_vs_recompute rule's (the rollout engine disagrees with
    the trainer), and the largest token |Δ| rollout − trainer of every step compared (None: none)."""

    on_policy: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rollout: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    rollout_max_abs: dict[str, float | None] = field(default_factory=dict)


def single_run_findings(dumps: dict[str, Dump]) -> SingleRunFindings:
    """Run the rules on each dump (name -> Dump). A rule that does not apply (status
    not_applicable) says nothing; a dump the rules cannot read says nothing either (the
    comparison reports its read errors)."""
    from rlprobe.check import check_dump

    found = SingleRunFindings()
    for name, dump in dumps.items():
        try:
            result = check_dump(dump, only=RULES)
        except ProbeError:
            continue
        applies = {r["check"] for r in result.results.to_pylist() if r["status"] != "not_applicable"}
        for rule, target in (("on_policy", found.on_policy), ("rollout_vs_recompute", found.rollout)):
            rows = result.rows.get(rule)
            if rule in applies and rows is not None and rows.num_rows:
                target[name] = rows.to_pylist()
        steps = result.tables.get("token_steps")
        if "rollout_vs_recompute" in applies and steps is not None:
            values = [r["max_abs"] for r in steps.to_pylist() if r["pair"] in ROLLOUT_PAIRS and r["max_abs"] is not None]
            found.rollout_max_abs[name] = max(values) if values else None
    return found
