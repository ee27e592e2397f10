"""The token tables of a batch of keys (token_batch.py's figures) built a column at a time: the
same operations on the same float64 values as token_tables._key_rows a key, and the key columns
repeated in numpy (a run of 1,024 small pairs fills ~500,000 histogram rows)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from rlprobe.checks import token_rows as tt

Key = tuple[str, int, int]


class BatchFigures(NamedTuple):
    """token_batch's figures, by key (rows of the 2-D arrays) and by sequence (seq_sum, seq_n: the
    parts' rows one after the other); the histograms as the filled bins of each key in bin order
    (Δ >= 0, then Δ < 0): their counts and edges, key k's in [ends[k - 1], ends[k])."""

    sums: np.ndarray  # [key, 7]: tokens, Σ Δ, Σ Δ², Σ |Δ|, max |Δ|, outside, non-finite
    pos_count: np.ndarray
    pos_sum: np.ndarray
    pos_max: np.ndarray
    prob_count: np.ndarray
    prob_sum: np.ndarray
    seq_sum: np.ndarray
    seq_n: np.ndarray
    counts: np.ndarray
    hist_lo: np.ndarray
    hist_hi: np.ndarray
    ends: np.ndarray
    quantile_bins: np.ndarray  # [key, quantile]: the |Δ| bin (of HALF) holding each quantile, -1 without tokens


def figures_tables(keys: list[Key], metas: list[dict[str, Any]], f: BatchFigures, parts: np.ndarray,
                   picks: list[np.ndarray | None], micro_steps: list[int], eps: float, edges: Any
                   ) -> dict[str, pa.Table]:
    """parts: int64 [part, 4] of key, rows, width, first sequence; picks: a part's rows' numbers in
    its tensors (None: 0, 1, …); micro_steps: each part's."""
    return {"token_steps": _steps(keys, metas, f, eps, edges),
            "token_hist": _hist(keys, f),
            "token_positions": _buckets(keys, f.pos_count, f.pos_sum, f.pos_max, edges.pos_lo, edges.pos_hi),
            "token_probability": _buckets(keys, f.prob_count, f.prob_sum, np.full(f.prob_sum.shape, np.nan),
                                          edges.prob_lo, edges.prob_lo + 1 / len(edges.prob_lo)),
            "token_sequences": _sequences(keys, parts, picks, micro_steps, f)}


def _steps(keys: list[Key], metas: list[dict[str, Any]], f: BatchFigures, eps: float, edges: Any) -> pa.Table:
    """As token_tables._key_rows: the same operations on the same float64 values, a column at a time."""
    n = f.sums[:, 0].astype(np.int64)
    none = n == 0
    d = np.where(none, 1, n).astype(np.float64)
    mean = f.sums[:, 1] / d
    var = f.sums[:, 2] / d - mean * mean
    sd = np.sqrt(np.where(0.0 > var, 0.0, var))  # max(var, 0.0)
    quantiles = np.minimum(edges.quantile[np.maximum(f.quantile_bins, 0)], f.sums[:, 4:5])
    columns: dict[str, Any] = {
        "pair": [k[0] for k in keys], "step": [k[1] for k in keys], "rank": [k[2] for k in keys],
        "dtype_a": [m["dtype_a"] for m in metas], "dtype_b": [m["dtype_b"] for m in metas],
        "masked": [m["masked"] for m in metas], "tokens": n, "nonfinite": f.sums[:, 6].astype(np.int64),
        "mean_delta": mean, "sd_delta": sd, "mean_abs": f.sums[:, 3] / d,
        **{name: quantiles[:, i] for i, (name, _) in enumerate(tt.QUANTILES)},
        "max_abs": f.sums[:, 4], "eps": np.full(len(keys), eps), "outside_share": f.sums[:, 5] / d}
    nullable = {"mean_delta", "sd_delta", "mean_abs", "max_abs", "outside_share", *(q for q, _ in tt.QUANTILES)}
    return pa.table({name: pa.array(columns[name], tt.STEPS.field(name).type,
                                    mask=none if name in nullable else None) for name in tt.STEPS.names},
                    schema=tt.STEPS)


STRING_BYTES = 2 ** 31  # an Arrow string array's 32-bit offsets: a longer column is cut into chunks


def _pairs(keys: list[Key], sizes: np.ndarray) -> pa.ChunkedArray:
    """The pair column of blocks of sizes[i] rows of keys[i]: its string buffers written at once, a
    run of keys of one pair name (keys are sorted: a job has one or two) as one repeated name and
    evenly spaced offsets (a dictionary array cast to strings took a third of the histogram table's
    time; a bytes object a key joined, and offsets summed up row by row, most of the rest)."""
    names = [key[0].encode() for key in keys]
    lengths = np.array([len(n) for n in names], np.int64)
    if int(lengths @ sizes) >= STRING_BYTES and len(keys) > 1:
        half = len(keys) // 2
        return pa.chunked_array(_pairs(keys[:half], sizes[:half]).chunks + _pairs(keys[half:], sizes[half:]).chunks,
                                pa.string())
    starts = [i for i in range(len(names)) if i == 0 or names[i] != names[i - 1]]
    runs = [(names[i], n) for i, n in zip(starts, np.add.reduceat(sizes, starts).tolist() if starts else []) if n]
    if len(runs) == 1:
        (name, count), = runs
        offsets, data = np.arange(0, len(name) * (count + 1), len(name), dtype=np.int32), name * count
    else:
        count, ends = sum(n for _, n in runs), np.cumsum([len(name) * n for name, n in runs]).tolist()
        offsets = np.concatenate([np.arange(end - len(name) * n, end, len(name), dtype=np.int32)
                                  for (name, n), end in zip(runs, ends)] + [np.array(ends[-1:] or [0], np.int32)])
        data = b"".join(name * n for name, n in runs)
    return pa.chunked_array([pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data))])


def _keyed(keys: list[Key], sizes: np.ndarray, values: dict[str, np.ndarray], schema: pa.Schema) -> pa.Table:
    """A table of blocks of sizes[i] rows for keys[i]: the key columns repeated by each block's size."""
    columns = {"pair": _pairs(keys, sizes),
               "step": pa.array(np.repeat(np.array([key[1] for key in keys], np.int64), sizes)),
               "rank": pa.array(np.repeat(np.array([key[2] for key in keys], np.int64), sizes))}
    columns.update({name: pa.array(values[name], schema.field(name).type) for name in schema.names[3:]})
    return pa.table(columns, schema=schema)


def _hist(keys: list[Key], f: BatchFigures) -> pa.Table:
    used = int(f.ends[-1]) if len(f.ends) else 0
    sizes = np.diff(f.ends, prepend=0)
    return _keyed(keys, sizes, {"lo": f.hist_lo[:used], "hi": f.hist_hi[:used], "tokens": f.counts[:used]}, tt.HIST)


def _buckets(keys: list[Key], count: np.ndarray, total: np.ndarray, largest: np.ndarray, lo: np.ndarray,
             hi: np.ndarray) -> pa.Table:
    """Each key's filled buckets (count [key, bucket] > 0), in key then bucket order."""
    k, bucket = np.nonzero(count)
    sizes = np.bincount(k, minlength=len(keys))
    c = count[k, bucket]
    return _keyed(keys, sizes, {"lo": lo[bucket], "hi": hi[bucket], "tokens": c, "mean_abs": total[k, bucket] / c,
                                "max_abs": largest[k, bucket]}, tt.BUCKETS)


def _sequences(keys: list[Key], parts: np.ndarray, picks: list[np.ndarray | None], micro_steps: list[int],
               f: BatchFigures) -> pa.Table:
    """One row a sequence: each part's micro-step, and its rows' numbers (a sample pair's) or 0, 1, …"""
    rows = parts[:, 1]
    sequences = np.arange(int(rows.sum()), dtype=np.int64) - np.repeat(parts[:, 3], rows)
    for picked, first, count in zip(picks, parts[:, 3], rows):
        if picked is not None:
            sequences[first:first + count] = picked
    per_key = np.bincount(parts[:, 0], weights=rows, minlength=len(keys)).astype(np.int64)
    return _keyed(keys, per_key, {"micro_step": np.repeat(np.array(micro_steps, np.int64), rows),
                                  "sequence": sequences, "tokens": f.seq_n, "log_ratio": f.seq_sum}, tt.SEQUENCES)
