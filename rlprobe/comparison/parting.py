"""Whether responses that part at a step part by sampling or because the weights differ
(docs/across-devices.md, "Responses that part"): the log-probs of the tokens both runs share.

A sample's tokens before its first differing token are the same in both runs, and so are their
contexts; a causal model's log-probs of them depend on nothing else. With the same weights they
differ by rounding only, and the tokens parted because a draw straddled a probability that rounding
moved; with other weights (a learning rate, an update that differed) they differ beyond rounding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from rlprobe.comparison.tolerance import Tolerance
from rlprobe.errors import DumpReadError
from rlprobe.lake.reader import Dump

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
