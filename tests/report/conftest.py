"""Synthetic comparison results (key_data table and summary dict) for the report writers."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

KEY_DATA_SCHEMA = pa.schema([
    ("key", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("micro_step", pa.int64()),
    ("index", pa.string()), ("status", pa.string()),
    ("shape_a", pa.list_(pa.int64())), ("shape_b", pa.list_(pa.int64())),
    ("dtype_a", pa.string()), ("dtype_b", pa.string()),
    ("numel", pa.int64()), ("equal_count", pa.int64()), ("same_pct", pa.float64()),
    ("first_mismatch_index", pa.int64()), ("max_abs_err", pa.float64()), ("max_rel_err", pa.float64()),
    ("within_1e3_pct", pa.float64()), ("within_1e2_pct", pa.float64()), ("cosine", pa.float64()),
    ("nan_mismatch_count", pa.int64()), ("message", pa.string()),
    ("min_a", pa.float64()), ("min_b", pa.float64()), ("max_a", pa.float64()), ("max_b", pa.float64()),
    ("mean_a", pa.float64()), ("mean_b", pa.float64()), ("norm_a", pa.float64()), ("norm_b", pa.float64()),
    ("hash_a", pa.string()), ("hash_b", pa.string()), ("is_first_divergence", pa.bool_()),
])


def key_row(key: str, step: int, status: str = "match", *, rank: int = 0, micro_step: int = 0, index: str = "",
            first: bool = False, **over: Any) -> dict[str, Any]:
    """One key_data row with plausible values for its status; `over` replaces any column."""
    both = status not in ("only_in_a", "only_in_b")
    same = status in ("match", "stats_only_match")
    row = {
        "key": key, "step": step, "rank": rank, "micro_step": micro_step, "index": index, "status": status,
        "shape_a": None if status == "only_in_b" else [4, 16],
        "shape_b": None if status == "only_in_a" else ([4, 8] if status == "shape_mismatch" else [4, 16]),
        "dtype_a": None if status == "only_in_b" else "float32",
        "dtype_b": None if status == "only_in_a" else ("bfloat16" if status == "dtype_mismatch" else "float32"),
        "numel": 64, "equal_count": 64 if same else (60 if both else None),
        "same_pct": 100.0 if same else (93.75 if both else None),
        "first_mismatch_index": None if same or not both else 3,
        "max_abs_err": 0.0 if same else (4.172350883483887 if both else None),
        "max_rel_err": 0.0 if same else (1.245355367660522 if both else None),
        "within_1e3_pct": 100.0 if same else (96.875 if both else None),
        "within_1e2_pct": 100.0 if same else (98.4375 if both else None),
        "cosine": 1.0 if same else (0.99 if both else None),
        "nan_mismatch_count": 0, "message": None,
        "min_a": -1.5, "min_b": -1.5, "max_a": 2.0, "max_b": 2.0, "mean_a": 0.1, "mean_b": 0.1,
        "norm_a": 3.0, "norm_b": 3.0, "hash_a": "ab" * 16, "hash_b": "ab" * 16 if same else "cd" * 16,
        "is_first_divergence": first,
    }
    row.update(over)
    return row


def make_key_data(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=KEY_DATA_SCHEMA)


def make_summary(key_data: pa.Table, first: dict[str, Any] | None) -> dict[str, Any]:
    """A summary dict shaped like compare's: counts, per-key and per-step roll-ups."""
    rows = key_data.to_pylist()
    counts: dict[str, int] = {}
    keys: dict[str, dict[str, Any]] = {}
    steps: dict[int, dict[str, Any]] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        ok = r["status"] in ("match", "stats_only_match")
        k = keys.setdefault(r["key"], {"key": r["key"], "rows": 0, "match": 0, "mismatch": 0, "other": 0,
                                       "first_divergent_step": None, "max_abs_err": 0.0, "max_rel_err": 0.0})
        k["rows"] += 1
        k["match" if ok else ("mismatch" if r["status"] == "mismatch" else "other")] += 1
        if not ok and k["first_divergent_step"] is None:
            k["first_divergent_step"] = r["step"]
        k["max_abs_err"] = max(k["max_abs_err"], r["max_abs_err"] or 0.0)
        k["max_rel_err"] = max(k["max_rel_err"], r["max_rel_err"] or 0.0)
        s = steps.setdefault(r["step"], {"step": r["step"], "rows": 0, "diverged_keys": []})
        s["rows"] += 1
        if not ok and r["key"] not in s["diverged_keys"]:
            s["diverged_keys"].append(r["key"])
    return {
        "run_a": "/runs/gpu", "run_b": "/runs/npu", "first_divergence": first,
        "suspect": "the actor's forward during the update" if first else None,
        "advice": "dump the actor's modules during the update for this step" if first else None,
        "next_config": {"rlprobe_config": {"actor_train_dump": True, "step_start": 1, "step_end": 1}} if first else None,
        "counts": counts, "keys": list(keys.values()), "steps": list(steps.values()), "gates": [],
        "elapsed_s": 1.25,
    }


@pytest.fixture
def diverging() -> tuple[pa.Table, dict[str, Any]]:
    """Three keys over two steps; log_prob first diverges at step 1, micro_step 1."""
    rows = [
        key_row("responses", 0), key_row("responses", 0, micro_step=1),
        key_row("log_prob", 0), key_row("log_prob", 0, micro_step=1),
        key_row("kl_loss", 0, "only_in_a"),
        key_row("responses", 1), key_row("responses", 1, micro_step=1),
        key_row("log_prob", 1), key_row("log_prob", 1, "mismatch", micro_step=1, first=True,
                                         message="max | rel err high"),
        key_row("log_prob", 1, "shape_mismatch", micro_step=1, index="0"),
        key_row("kl_loss", 1, "only_in_b"),
    ]
    table = make_key_data(rows)
    first = {"kind": "key_data", "key": "log_prob", "step": 1, "rank": 0, "micro_step": 1, "index": "",
             "status": "mismatch", "max_abs_err": 4.172350883483887, "max_rel_err": 1.245355367660522}
    return table, make_summary(table, first)


@pytest.fixture
def agreeing() -> tuple[pa.Table, dict[str, Any]]:
    table = make_key_data([key_row("responses", s, micro_step=m) for s in range(2) for m in range(2)])
    return table, make_summary(table, None)
