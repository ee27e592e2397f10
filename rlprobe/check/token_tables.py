"""Token-level tables from the saved tensors: each log-prob pair reduced by the kernel
(rlprobe/check/token_kernel.py) and merged per (pair, step, rank), and GRPO advantages per group.

Pairs (a: the trainer's recomputation, b: the other side, Δ = b − a), matched on (step, rank,
micro_step, index) and equal shapes only, masked by the response mask saved in the same call:
- `rollout_vs_old`: rollout_log_prob vs old_log_prob;
- `rollout_vs_log_prob`: rollout_log_prob vs log_prob, at micro-step 0 where no old_log_prob is
  saved (the checks keep its on-policy steps);
both only in steps without `sample_ids`: trainers that save them (TRL) save the rollout and the
shuffled update micro-batches in different calls, whose rows are other samples until pairs are
aligned by sample id (issue 14);
- `on_policy`: log_prob vs old_log_prob at micro-step 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rlprobe.check.token_kernel import (N_POSITIONS, N_PROBABILITY, HALF, PairFigures, bin_lower_edges,
                                        bin_upper_edges, position_bounds, reduce_pairs)
from rlprobe.lake.reader import Dump

_WANTED = ("log_prob", "old_log_prob", "rollout_log_prob", "response_mask", "advantages", "group_ids", "sample_ids")
QUANTILES = (("p50_abs", 0.5), ("p95_abs", 0.95), ("p99_abs", 0.99))


def tensor_rows(stats: pa.Table) -> dict[tuple[str, int, int, int, str], dict[str, Any]]:
    """(canonical, step, rank, micro_step, index) -> row, for saved tensors of the keys the token checks read."""
    mask = pc.and_(pc.is_in(stats["canonical"], pa.array(_WANTED)), pc.is_valid(stats["tensor_file"]))
    mask = pc.and_(mask, pc.invert(pc.fill_null(stats["absent"], False)))
    rows = stats.filter(mask).select(["canonical", "step", "rank", "micro_step", "index", "dtype", "shape",
                                      "tensor_file"]).to_pylist()
    return {(r["canonical"], r["step"], r["rank"], r["micro_step"], r["index"]): r for r in rows}


def pairs(rows: dict[tuple, dict[str, Any]]) -> list[tuple[str, dict, dict, dict | None]]:
    """(pair name, row a, row b, mask row or None) of every pair of equal shape."""
    found = []
    for (name, step, rank, micro, index), b in rows.items():
        if name == "rollout_log_prob":
            if _has_sample_ids(rows, step, rank):
                continue
            a = rows.get(("old_log_prob", step, rank, micro, index))
            pair = "rollout_vs_old"
            if a is None and micro == 0:
                a, pair = rows.get(("log_prob", step, rank, micro, index)), "rollout_vs_log_prob"
        elif name == "log_prob" and micro == 0:
            a, pair = rows.get(("old_log_prob", step, rank, micro, index)), "on_policy"
        else:
            continue
        if a is None or a["shape"] != b["shape"] or not _is_float(a) or not _is_float(b):
            continue
        mask = (rows.get(("response_mask", step, rank, micro, index))
                or rows.get(("response_mask", step, rank, micro, "")))
        if mask is not None and int(np.prod(mask["shape"] or [1])) != int(np.prod(a["shape"] or [1])):
            mask = None
        found.append((pair, a, b, mask))
    return found


def token_tables(dump: Dump, stats: pa.Table, eps: float, workers: int = 2) -> dict[str, pa.Table]:
    """token_steps, token_hist, token_positions, token_probability and token_sequences."""
    rows = tensor_rows(stats)
    work = pairs(rows)

    def job(a, b, mask):
        return lambda: (dump.load_tensor(a["tensor_file"], a["dtype"], mmap=True),
                        dump.load_tensor(b["tensor_file"], b["dtype"], mmap=True),
                        None if mask is None else dump.load_tensor(mask["tensor_file"], mask["dtype"], mmap=True))

    results = reduce_pairs([job(a, b, m) for _, a, b, m in work], eps, workers)
    merged: dict[tuple[str, int, int], tuple[PairFigures, dict]] = {}
    sequences: dict[str, list] = {k: [] for k in ("pair", "step", "rank", "micro_step", "sequence", "tokens",
                                                   "log_ratio")}
    for (pair, a, b, mask), (figures, seq_sum, seq_n) in zip(work, results):
        key = (pair, a["step"], a["rank"])
        if key not in merged:
            merged[key] = (PairFigures(), {"dtype_a": a["dtype"], "dtype_b": b["dtype"], "masked": False,
                                           "first_micro_step": a["micro_step"]})
        merged[key][0].add(figures)
        merged[key][1]["masked"] |= mask is not None
        n = len(seq_sum)
        for name, values in (("pair", [pair] * n), ("step", [a["step"]] * n), ("rank", [a["rank"]] * n),
                             ("micro_step", [a["micro_step"]] * n), ("sequence", range(n)),
                             ("tokens", seq_n.tolist()), ("log_ratio", seq_sum.tolist())):
            sequences[name].extend(values)
    return {**_step_tables(merged, eps), "token_sequences": pa.table(sequences, schema=SEQUENCES)}


SEQUENCES = pa.schema([("pair", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("micro_step", pa.int64()),
                       ("sequence", pa.int64()), ("tokens", pa.int64()), ("log_ratio", pa.float64())])
STEPS = pa.schema([("pair", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("dtype_a", pa.string()),
                   ("dtype_b", pa.string()), ("masked", pa.bool_()), ("tokens", pa.int64()),
                   ("nonfinite", pa.int64()), ("mean_delta", pa.float64()), ("sd_delta", pa.float64()),
                   ("mean_abs", pa.float64()), ("p50_abs", pa.float64()), ("p95_abs", pa.float64()),
                   ("p99_abs", pa.float64()), ("max_abs", pa.float64()), ("eps", pa.float64()),
                   ("outside_share", pa.float64())])
HIST = pa.schema([("pair", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("lo", pa.float64()),
                  ("hi", pa.float64()), ("tokens", pa.int64())])
BUCKETS = pa.schema([("pair", pa.string()), ("step", pa.int64()), ("rank", pa.int64()), ("lo", pa.float64()),
                     ("hi", pa.float64()), ("tokens", pa.int64()), ("mean_abs", pa.float64()),
                     ("max_abs", pa.float64())])


def _step_tables(merged: dict[tuple[str, int, int], tuple[PairFigures, dict]], eps: float) -> dict[str, pa.Table]:
    steps: list[dict] = []
    hist: dict[str, list[np.ndarray]] = {n: [] for n in HIST.names}
    buckets: dict[str, dict[str, list[np.ndarray]]] = {t: {n: [] for n in BUCKETS.names} for t in ("pos", "prob")}
    lower, upper = bin_lower_edges(), bin_upper_edges()
    pos_lo = np.array([position_bounds(p)[0] for p in range(N_POSITIONS)], np.float64)
    pos_hi = np.array([position_bounds(p)[1] for p in range(N_POSITIONS)], np.float64)
    pos_hi[-1] = np.inf
    prob_lo = np.arange(N_PROBABILITY) / N_PROBABILITY
    for (pair, step, rank), (f, meta) in sorted(merged.items()):
        n = f.tokens
        mean = f.sum_delta / n if n else None
        sd = float(np.sqrt(max(f.sum_sq / n - mean * mean, 0.0))) if n else None
        row = {"pair": pair, "step": step, "rank": rank, "dtype_a": meta["dtype_a"], "dtype_b": meta["dtype_b"],
               "masked": meta["masked"], "tokens": n, "nonfinite": f.nonfinite, "mean_delta": mean, "sd_delta": sd,
               "mean_abs": f.sum_abs / n if n else None, "max_abs": f.max_abs if n else None, "eps": eps,
               "outside_share": f.outside / n if n else None}
        row.update({name: f.quantile(q, upper) for name, q in QUANTILES})
        steps.append(row)
        pos, neg = np.flatnonzero(f.hist[:HALF]), np.flatnonzero(f.hist[HALF:])  # Δ >= 0; Δ < 0 negated
        _extend(hist, pair, step, rank, lo=np.concatenate([lower[pos], -upper[neg]]),
                hi=np.concatenate([upper[pos], -lower[neg]]),
                tokens=np.concatenate([f.hist[pos], f.hist[HALF + neg]]))
        p = np.flatnonzero(f.pos_count)
        _extend(buckets["pos"], pair, step, rank, lo=pos_lo[p], hi=pos_hi[p], tokens=f.pos_count[p],
                mean_abs=f.pos_sum[p] / f.pos_count[p], max_abs=f.pos_max[p])
        q = np.flatnonzero(f.prob_count)
        _extend(buckets["prob"], pair, step, rank, lo=prob_lo[q], hi=prob_lo[q] + 1 / N_PROBABILITY,
                tokens=f.prob_count[q], mean_abs=f.prob_sum[q] / f.prob_count[q], max_abs=np.full(q.size, np.nan))
    return {"token_steps": pa.Table.from_pylist(steps, schema=STEPS),
            "token_hist": _table(hist, HIST), "token_positions": _table(buckets["pos"], BUCKETS),
            "token_probability": _table(buckets["prob"], BUCKETS)}


def _extend(columns: dict[str, list[np.ndarray]], pair: str, step: int, rank: int, **values: np.ndarray) -> None:
    size = len(values["lo"])
    columns["pair"].append(np.full(size, pair, dtype=object))
    columns["step"].append(np.full(size, step, np.int64))
    columns["rank"].append(np.full(size, rank, np.int64))
    for name, array in values.items():
        columns[name].append(np.asarray(array))


def _table(columns: dict[str, list[np.ndarray]], schema: pa.Schema) -> pa.Table:
    if not columns["pair"]:
        return schema.empty_table()
    return pa.table({n: pa.array(np.concatenate(columns[n]), schema.field(n).type) for n in schema.names},
                    schema=schema)


GROUPS = pa.schema([("step", pa.int64()), ("rank", pa.int64()), ("micro_step", pa.int64()), ("index", pa.string()),
                    ("group_id", pa.int64()), ("sequences", pa.int64()), ("advantage_sum", pa.float64()),
                    ("advantage_mean", pa.float64()), ("advantage_abs_mean", pa.float64()),
                    ("group_source", pa.string())])


def group_advantages(dump: Dump, stats: pa.Table, group_size: int | None) -> pa.Table:
    """Per GRPO group: the sum and mean of the sequences' advantages (a sequence's advantage is the
    mean over its tokens). Groups from a `group_ids` tensor saved in the same call, else from
    consecutive rows of `group_size` (a config key)."""
    rows = tensor_rows(stats)
    out: list[dict] = []
    for (name, step, rank, micro, index), row in sorted(rows.items(), key=lambda kv: kv[0][1:]):
        if name != "advantages":
            continue
        adv = dump.load_tensor(row["tensor_file"], row["dtype"]).astype(np.float64)
        per_seq = adv.reshape(adv.shape[0], -1).mean(axis=1) if adv.ndim > 1 else adv.ravel()
        ids_row = rows.get(("group_ids", step, rank, micro, index)) or rows.get(("group_ids", step, rank, micro, ""))
        ids = None
        if ids_row is not None:
            ids = dump.load_tensor(ids_row["tensor_file"], ids_row["dtype"]).ravel().astype(np.int64)
            source = "saved group_ids"
        if ids is None or ids.size != per_seq.size:
            if not group_size:
                continue
            ids, source = np.arange(per_seq.size) // group_size, f"config group size {group_size}"
        groups, inverse = np.unique(ids, return_inverse=True)
        count = np.bincount(inverse)
        total = np.bincount(inverse, weights=per_seq)
        absolute = np.bincount(inverse, weights=np.abs(per_seq))
        for g, c, s, a in zip(groups.tolist(), count.tolist(), total.tolist(), absolute.tolist()):
            out.append({"step": step, "rank": rank, "micro_step": micro, "index": index, "group_id": g,
                        "sequences": c, "advantage_sum": s, "advantage_mean": s / c, "advantage_abs_mean": a / c,
                        "group_source": source})
    return pa.Table.from_pylist(out, schema=GROUPS)


def _has_sample_ids(rows: dict[tuple, dict[str, Any]], step: int, rank: int) -> bool:
    return any(k[0] == "sample_ids" and k[1] == step and k[2] == rank for k in rows)


def _is_float(row: dict[str, Any]) -> bool:
    dtype = (row.get("dtype") or "float").lower()
    return "float" in dtype or "bf16" in dtype or "half" in dtype or "double" in dtype
