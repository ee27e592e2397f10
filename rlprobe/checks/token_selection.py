"""Which token pairs `check_dump(only=...)` reduces: those the requested checks read, no more. Each
token-level check reads token_steps rows of some pair kinds (token_tables.pairs names them), and
on_policy only those of the (step, rank) its query judges, so a check run for a few rules (compare's
single-run rules: rlprobe/comparison/single_run.py) never reads a tensor only other checks would. The
full check (`only` None) reduces every pair: its reports show them all."""

from __future__ import annotations

from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

# token_steps' `pair` kinds each check's query reads (sql/check/<name>.sql); a check not named reads none
PAIRS_READ = {"on_policy": ("on_policy",), "rollout_vs_recompute": ("rollout_vs_old", "rollout_vs_log_prob")}
ROLLOUT_KINDS = frozenset(PAIRS_READ["rollout_vs_recompute"])


class PairSelection(NamedTuple):
    """The pair kinds to reduce, and the (step, rank) whose on_policy pairs are reduced (None: every one)."""

    kinds: frozenset[str]
    on_policy: frozenset[tuple[int, int]] | None = None

    def keeps(self, kind: str, step: int, rank: int) -> bool:
        if kind not in self.kinds:
            return False
        return kind != "on_policy" or self.on_policy is None or (step, rank) in self.on_policy


def selection_for(checks: tuple[str, ...], stats: pa.Table, info: dict[str, Any]) -> PairSelection:
    """The pairs that `checks` read, for a dump's statistics (`stats`: inputs.stats_table) and run_info."""
    kinds = frozenset(kind for name in checks for kind in PAIRS_READ.get(name, ()))
    if "on_policy" not in kinds:
        return PairSelection(kinds)
    return PairSelection(kinds, on_policy_judged(stats, info["first_step"], info["generation_every"]))


def on_policy_judged(stats: pa.Table, first_step: int | None, generation_every: int) -> frozenset[tuple[int, int]]:
    """The (step, rank) whose token figures sql/check/on_policy.sql reads (its `pairs` and WHERE, in
    Python): a log_prob and an old_log_prob saved at micro-step 0 of one call with one shape, at a
    generating step ((step - first_step) % generation_every == 0), not at a later epoch (an `epoch`
    saved at micro-step 0 with a value other than 0), and not bitwise equal by their hashes (the rule
    reports no such pair, whatever its tokens). tests/check/test_token_selection.py checks it against
    the query itself."""
    if first_step is None or stats.num_rows == 0:
        return frozenset()
    mask = pc.and_(pc.is_in(stats["canonical"], pa.array(["log_prob", "old_log_prob", "epoch"])),
                   pc.equal(stats["micro_step"], 0))
    table = stats.filter(pc.fill_null(mask, False))
    columns = [table[c].to_pylist() for c in ("canonical", "step", "rank", "index", "shape", "hash", "max", "absent")]
    later: set[tuple[int, int]] = set()
    saved: dict[tuple, list[tuple[Any, Any]]] = {}  # a canonical name may be saved under two keys: every pairing
    for canonical, step, rank, index, shape, digest, largest, absent in zip(*columns):
        if canonical == "epoch":
            if (largest or 0) != 0:  # coalesce(max, 0) <> 0; NaN too
                later.add((step, rank))
        elif not absent:
            saved.setdefault((canonical, step, rank, index), []).append((shape, digest))
    found = set()
    for (canonical, step, rank, index), rows in saved.items():
        if canonical != "log_prob" or (step - first_step) % generation_every or (step, rank) in later:
            continue
        for shape, digest in rows:
            for other_shape, other_digest in saved.get(("old_log_prob", step, rank, index), ()):
                # `n.hash IS NOT NULL AND n.hash = o.hash` is true or null (o.hash null) for a row the rule drops
                if other_shape == shape and (digest is None or (other_digest is not None and other_digest != digest)):
                    found.add((step, rank))
    return frozenset(found)
