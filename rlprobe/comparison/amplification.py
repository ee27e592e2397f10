"""Where something new happens (docs/across-devices.md, "The amplification point"): within a step, the key
whose error jumps far above the errors of the keys it is computed from; across steps, the first
step whose largest error jumps far above the previous step's.

A key's error is the measure its tolerance judges (sql/key_errors.sql): max|a-b| over
max(|a|inf, |b|inf, its family's scale floor). Rounding carries an error from a key's inputs to the
key at about its size (a sum, a difference, a normalisation or an exponential of order-1 values
moves it by a few units at most), and the key's own arithmetic adds a few units of its dtype's eps.
So the ratio of a key's error to the larger of its inputs' largest error and its dtype's eps stays
near 1 under noise, while code that computes the key differently puts it at the size of the
difference it makes over the rounding. AMPLIFICATION is the ratio from which a key is where
something new happens. Measured on the PPO example against its simulated second device
(tests/second_device.py; up to 6 steps, temperatures 1 and 2): noise gives at most 8 (a KL, whose
scale floor of 1 is below the log-probs' magnitudes it is made of), the planted faults 1.2e4 (the
reference model in bfloat16) to 3.8e6 (GAE's lambda halved). Across steps, noise moves the largest
error by 0.2x to 2.8x from one step to the next; a fault planted at a later step makes it jump by 2e6.

Then whether responses that part at a step part by sampling or because the weights differ
(shared_prefix_log_probs; docs/across-devices.md, "Responses that part"): the log-probs of the tokens both runs
share. A sample's tokens before its first differing token are the same in both runs, and so are their contexts;
a causal model's log-probs of them depend on nothing else. With the same weights they differ by rounding only,
and the tokens parted because a draw straddled a probability that rounding moved; with other weights (a learning
rate, an update that differed) they differ beyond rounding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from rlprobe.comparison.key_aliases import computed_from
from rlprobe.comparison.tolerance import EPS, EXACT_FAMILIES, FAMILY_OF, SCALE_FLOOR, SCALE_FLOORS, Tolerance
from rlprobe.errors import DumpReadError
from rlprobe.lake.reader import Dump

AMPLIFICATION = 1e3  # three orders of magnitude: noise measured <= 8, faults >= 1.2e4 (module docstring)


class KeyErrors:
    """The errors of a comparison (sql/key_errors.sql on its key_data): `per_step`, step -> the largest error
    over its float keys ({key, dtype, error, bitwise, diverged}); at(step), canonical key -> {key, rank,
    micro_step, dtype, error, bitwise, diverged}, in data-flow order, read for the steps asked only (25,600
    rows of key_data as Python rows took ~50 ms)."""

    def __init__(self, con: Any, steps: list[int]):
        self._con = con
        self._at: dict[int, dict[str, dict[str, Any]]] = {}
        self.per_step: dict[int, dict[str, Any]] = {}
        self._read(steps, per_step=True)

    def at(self, step: int) -> dict[str, dict[str, Any]]:
        if step not in self._at:
            self._read([step], per_step=False)
        return self._at.get(step, {})

    def _read(self, steps: list[int], per_step: bool) -> None:
        import pyarrow as pa

        from rlprobe.lake.sql_runner import records

        floors = {key: SCALE_FLOORS.get(family, SCALE_FLOOR) for key, family in FAMILY_OF.items()}
        self._con.register("key_floors", pa.table({"canonical_key": list(floors), "floor": list(floors.values())}))
        try:
            rows = records(self._con, "key_errors.sql", steps=steps, default_floor=SCALE_FLOOR,
                           float_dtypes=list(EPS), exact_keys=[k for k, f in FAMILY_OF.items() if f in EXACT_FAMILIES])
        finally:
            self._con.unregister("key_floors")
        for step in steps:
            self._at.setdefault(step, {})
        for r in rows:
            if r["canonical_key"] is None:
                if per_step:
                    self.per_step[r["step"]] = r
            else:
                self._at[r["step"]][r["canonical_key"]] = r


def measured(row: dict[str, Any]) -> bool:
    """Whether `row`'s error is a rounding measure (sql/key_errors.sql: a float key, not tokens, with an error)."""
    return row["error"] is not None


def _eps(row: dict[str, Any]) -> float:
    return EPS.get(row["dtype"] or "", EPS["float32"])


def against_inputs(row: dict[str, Any], at_step: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """`row`'s error against the largest of its inputs' (floored at its dtype's eps): {ratio,
    upstream_key, upstream_error}; None where none of its inputs was captured at its step, or where
    tokens it is computed from differ (its error is then their consequence, not a rounding carried on)."""
    inputs = [at_step[k] for k in computed_from(row["canonical_key"]) if k in at_step]
    if not inputs or not measured(row):
        return None
    if any(not r["bitwise"] for r in inputs if FAMILY_OF.get(r["canonical_key"]) in EXACT_FAMILIES):
        return None
    carried = [r for r in inputs if measured(r)]
    largest = max(carried, key=lambda r: r["error"], default=None)
    upstream_error = 0.0 if largest is None else float(largest["error"])
    return {"ratio": float(row["error"]) / max(upstream_error, _eps(row)),
            "upstream_key": None if largest is None else largest["key"], "upstream_error": upstream_error}


def amplification_point(errors: KeyErrors, step: int) -> dict[str, Any] | None:
    """The first key of `step`, in data-flow order, that diverges beyond tolerance with an error
    AMPLIFICATION or more times its inputs' (summary.json's `amplification`)."""
    at_step = errors.at(step)
    for row in at_step.values():
        if not row["diverged"]:
            continue
        found = against_inputs(row, at_step)
        if found is not None and found["ratio"] >= AMPLIFICATION:
            return {"key": row["key"], "canonical_key": row["canonical_key"], "step": step, "rank": row["rank"],
                    "micro_step": row["micro_step"], "error": float(row["error"]), **found}
    return None


def error_jump(errors: KeyErrors) -> dict[str, Any] | None:
    """The first step with a divergence whose largest error is AMPLIFICATION or more times the previous
    compared step's (floored at its dtype's eps): {step, ratio, key, error, previous_error}."""
    steps = sorted(errors.per_step)
    for previous, step in zip(steps, steps[1:]):
        row, before_row = errors.per_step[step], errors.per_step[previous]
        if not row["diverged"] or not measured(row):
            continue
        before = float(before_row["error"]) if measured(before_row) else 0.0
        ratio = float(row["error"]) / max(before, _eps(row))
        if ratio >= AMPLIFICATION:
            return {"step": step, "ratio": ratio, "key": row["key"], "error": float(row["error"]),
                    "previous_error": before}
    return None


# the policy's log-probs, the rollout engine's first (it drew the tokens): the reference model is not updated
POLICY_LOG_PROBS = ("rollout_log_prob", "old_log_prob")


def shared_prefix_log_probs(dump_a: Dump, dump_b: Dump, key_data: pa.Table, step: int,
                            tolerance: Tolerance) -> dict[str, Any] | None:
    """The policy's log-probs of the tokens both runs share at `step` against their tolerance:
    {key, step, positions, max_abs_err, bound, within} for the first of POLICY_LOG_PROBS saved as tensors
    of the responses' shape (None without one, or without a shared token)."""
    import pyarrow.compute as pc  # here: a comparison whose tokens do not part never needs it (start-up)

    rows = [r for r in key_data.filter(pc.equal(key_data["step"], step)).to_pylist()
            if r["file_a"] is not None and r["file_b"] is not None]
    responses = {(r["rank"], r["micro_step"], r["index"]): r for r in rows if r["canonical_key"] == "responses"}
    for canonical in POLICY_LOG_PROBS:
        found = [r for r in rows if r["canonical_key"] == canonical
                 and (r["rank"], r["micro_step"], r["index"]) in responses]
        measured = [m for m in (_shared(dump_a, dump_b, responses[(r["rank"], r["micro_step"], r["index"])], r)
                                for r in found) if m is not None]
        positions = sum(m[0] for m in measured)
        if not positions:
            continue
        max_abs = max(m[1] for m in measured)
        scale = max(m[2] for m in measured)
        row = found[0]
        rule = tolerance.resolve(row["key"], canonical, row["dtype_a"] or row["dtype_b"])
        bound = rule.atol + rule.rtol * scale
        return {"key": row["key"], "step": step, "positions": positions, "max_abs_err": max_abs, "bound": bound,
                "within": bool(max_abs <= bound)}
    return None


def _shared(dump_a: Dump, dump_b: Dump, responses: dict[str, Any],
            log_probs: dict[str, Any]) -> tuple[int, float, float] | None:
    """(shared positions, max |a-b| and max |a|, |b| of the log-probs there) for one pair of rows."""
    where = (responses["step"], responses["rank"], responses["micro_step"], responses["index"])
    try:
        tokens_a, tokens_b = (dump.tensor(responses["key"], *where) for dump in (dump_a, dump_b))
        lp_a, lp_b = (dump.tensor(log_probs["key"], *where).astype(np.float64) for dump in (dump_a, dump_b))
    except DumpReadError:  # a tensor saved under another name or unreadable: key_data's read errors name it
        return None
    if not (tokens_a.ndim == 2 and tokens_a.shape == tokens_b.shape == lp_a.shape == lp_b.shape):
        return None  # another layout: no position to pair
    differs = tokens_a != tokens_b
    first = np.where(differs.any(axis=1), differs.argmax(axis=1), tokens_a.shape[1])
    shared = np.arange(tokens_a.shape[1])[None, :] < first[:, None]
    if not shared.any():
        return None
    a, b = lp_a[shared], lp_b[shared]
    return int(shared.sum()), float(np.nanmax(np.abs(a - b))), float(max(np.nanmax(np.abs(a)), np.nanmax(np.abs(b))))
