"""A pool job of many small pairs (a [batch, seq] log-prob per micro-batch and step) in one kernel
call and columnar tables: reduce_pair a pair, a PairFigures and table rows a key cost ~0.4 ms of
Python and allocation around a kernel that takes tens of µs on such a pair. The rows equal those
token_tables.py builds key by key (tests/check/test_token_tables.py)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from rlprobe.check import token_rows as tt
from rlprobe.check.mapped_tensors import read_into
from rlprobe.check.pair_part import Part
from rlprobe.check.token_kernel import (LOG_THRESHOLDS, PROBABILITY_OF, HALF, N_BINS, N_POSITIONS, N_PROBABILITY,
                                        float32_bits, reduce_rows, as_rows, check_shapes, mask_bytes)
from rlprobe.lake.reader import Dump

import numba  # noqa: E402  (after token_kernel has set numba's cache dir)

SMALL = 1 << 16  # tokens: a larger pair goes to the kernel as it is (copying it into the batch costs more)


def batch_tables(dump: Dump, batch: list[tuple[tuple[str, int, int], list[Part]]], metas: list[dict[str, Any]],
                 eps: float, edges: Any) -> dict[str, pa.Table] | None:
    """The tables of a run of keys (metas: token_tables._meta of each); None where a pair is not
    small or not float32 (the caller reduces those keys one by one)."""
    sizes = [[tt.part_tokens(p) for p in parts] for _, parts in batch]
    if any(size > SMALL for row in sizes for size in row):
        return None
    total = sum(map(sum, sizes))
    a_all, b_all, m_all = np.empty(total, np.float32), np.empty(total, np.float32), np.empty(total, np.uint8)
    spec, sequences, load, root = [], [], tt.loader(dump), str(dump.path)
    first = start = 0
    for k, (_, parts) in enumerate(batch):
        for p, size in zip(parts, sizes[k]):
            stop = start + size
            shape = _read(root, p, a_all[start:stop], b_all[start:stop], m_all[start:stop])
            if shape is None:  # not numpy's plain float32 files of the shapes in the index: as reduce_pair reads them
                a, b = load(p.a, p.a_rows), load(p.b, p.b_rows)
                mask = None if p.mask is None else load(p.mask, p.mask_rows)
                if a.dtype != np.float32 or b.dtype != np.float32 or a.size != size:
                    return None
                check_shapes(a, b, mask)
                a_all[start:stop], b_all[start:stop] = a.reshape(-1), b.reshape(-1)
                m_all[start:stop] = 1 if mask is None else mask_bytes(mask).reshape(-1)
                shape = as_rows(a).shape
            spec.append((k, start, *shape, first))
            sequences.append((p.a["micro_step"], p.a_rows if isinstance(p.a_rows, np.ndarray) else None, shape[0]))
            start = stop
            first += shape[0]
    qs = tuple(q for _, q in tt.QUANTILES)
    f = reduce_batch(a_all, b_all, m_all, np.array(spec, np.int64).reshape(-1, 5), len(batch), eps, qs)
    keys = [key for key, _ in batch]
    return {"token_steps": _steps(keys, metas, f, eps, edges),
            "token_hist": _hist(keys, f, edges),
            "token_positions": _buckets(keys, f.pos_count, f.pos_sum, f.pos_max, edges.pos_lo, edges.pos_hi),
            "token_probability": _buckets(keys, f.prob_count, f.prob_sum, np.full(f.prob_sum.shape, np.nan),
                                          edges.prob_lo, edges.prob_lo + 1 / len(edges.prob_lo)),
            "token_sequences": _sequences([keys[k] for k, *_ in spec], sequences, f)}


_FLOAT32 = (np.dtype("<f4"),)
_MASKS = (np.dtype(np.bool_), np.dtype(np.uint8), np.dtype(np.int8))  # a byte a token, nonzero: counted


def _read(root: str, p: Part, a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> tuple[int, int] | None:
    """The part's files straight into a, b and mask (its tokens' places in the batch); its (rows,
    width), or None where they are not numpy's plain files of float32 (masks: of a byte a token) of
    the shapes in the tensor index, or the part picks rows (a sample pair)."""
    if p.a_rows is not None or p.b_rows is not None or p.mask_rows is not None:
        return None
    if not (read_into(root, p.a, a, _FLOAT32) and read_into(root, p.b, b, _FLOAT32)):
        return None
    if p.mask is None:
        mask.fill(1)
    elif not read_into(root, p.mask, mask, _MASKS):
        return None
    shape = p.a["shape"] or []
    return (1, 1) if not shape else (1, shape[0]) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))


def _steps(keys: list[tuple[str, int, int]], metas: list[dict[str, Any]], f: BatchFigures, eps: float,
           edges: Any) -> pa.Table:
    """As token_tables._key_rows: the same operations on the same float64 values, a column at a time."""
    n = f.sums[:, 0].astype(np.int64)
    none = n == 0
    d = np.where(none, 1, n).astype(np.float64)
    mean = f.sums[:, 1] / d
    var = f.sums[:, 2] / d - mean * mean
    sd = np.sqrt(np.where(0.0 > var, 0.0, var))  # max(var, 0.0)
    quantiles = np.minimum(edges.upper[np.maximum(f.quantile_bins, 0)], f.sums[:, 4:5])
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


def _keyed(keys: list[tuple[str, int, int]], sizes: np.ndarray, values: dict[str, np.ndarray],
           schema: pa.Schema) -> pa.Table:
    """A table of blocks of sizes[i] rows for keys[i]: the key columns gathered by each row's key."""
    of = np.repeat(np.arange(len(keys)), sizes)
    names = sorted({key[0] for key in keys})
    codes = np.array([names.index(key[0]) for key in keys], np.int32)[of]
    columns = {"pair": pa.DictionaryArray.from_arrays(codes, pa.array(names, pa.string())).cast(pa.string()),
               "step": pa.array(np.array([key[1] for key in keys], np.int64)[of]),
               "rank": pa.array(np.array([key[2] for key in keys], np.int64)[of])}
    columns.update({name: pa.array(values[name], schema.field(name).type) for name in schema.names[3:]})
    return pa.table(columns, schema=schema)


def _hist(keys: list[tuple[str, int, int]], f: BatchFigures, edges: Any) -> pa.Table:
    used = int(f.ends[-1]) if len(f.ends) else 0
    bins = f.bins[:used]
    sizes = np.diff(f.ends, prepend=0)
    return _keyed(keys, sizes, {"lo": edges.signed_lo[bins], "hi": edges.signed_hi[bins], "tokens": f.counts[:used]},
                  tt.HIST)


def _buckets(keys: list[tuple[str, int, int]], count: np.ndarray, total: np.ndarray, largest: np.ndarray,
             lo: np.ndarray, hi: np.ndarray) -> pa.Table:
    """Each key's filled buckets (count [key, bucket] > 0), in key then bucket order."""
    k, bucket = np.nonzero(count)
    sizes = np.bincount(k, minlength=len(keys))
    c = count[k, bucket]
    return _keyed(keys, sizes, {"lo": lo[bucket], "hi": hi[bucket], "tokens": c, "mean_abs": total[k, bucket] / c,
                                "max_abs": largest[k, bucket]}, tt.BUCKETS)


def _sequences(keys: list[tuple[str, int, int]], parts: list[tuple[int, np.ndarray | None, int]],
               f: BatchFigures) -> pa.Table:
    """One row a sequence: each part's micro-step, and its rows' numbers (a sample pair's) or 0, 1, …"""
    sizes = np.array([rows for _, _, rows in parts], np.int64)
    numbers = [np.arange(rows) if picked is None else picked for _, picked, rows in parts]
    return _keyed(keys, sizes, {"micro_step": np.repeat(np.array([m for m, _, _ in parts], np.int64), sizes),
                                "sequence": np.concatenate(numbers) if numbers else np.zeros(0, np.int64),
                                "tokens": f.seq_n, "log_ratio": f.seq_sum}, tt.SEQUENCES)


class BatchFigures(NamedTuple):
    """reduce_batch's figures, by key (rows of the 2-D arrays) and by sequence (seq_sum, seq_n: the
    parts' rows one after the other); the histograms as the filled bins of each key in bin order
    (Δ >= 0, then Δ < 0), key k's in bins[ends[k - 1]:ends[k]]."""

    sums: np.ndarray  # [key, 7]: tokens, Σ Δ, Σ Δ², Σ |Δ|, max |Δ|, outside, non-finite
    pos_count: np.ndarray
    pos_sum: np.ndarray
    pos_max: np.ndarray
    prob_count: np.ndarray
    prob_sum: np.ndarray
    seq_sum: np.ndarray
    seq_n: np.ndarray
    bins: np.ndarray
    counts: np.ndarray
    ends: np.ndarray
    quantile_bins: np.ndarray  # [key, quantile]: the |Δ| bin (of HALF) holding each quantile, -1 without tokens


def reduce_batch(a: np.ndarray, b: np.ndarray, mask: np.ndarray, parts: np.ndarray, keys: int, eps: float,
                 qs: tuple[float, ...]) -> BatchFigures:
    """Many small pairs in one call (one per pair costs more around the kernel than in it): a, b
    (float32) and mask (uint8) hold the pairs' tokens one after the other; parts: int64 [pair, 5] of
    key (ascending), first token, rows, row width, first sequence. The figures of a key are those
    reduce_pair adds up over its pairs, in the same order; quantile_bins those PairFigures.quantiles reads."""
    sequences = int((parts[:, 2]).sum()) if len(parts) else 0
    bound = np.zeros(keys, np.int64)
    np.add.at(bound, parts[:, 0], parts[:, 2] * parts[:, 3])
    room = int(np.minimum(bound, N_BINS).sum())
    out = BatchFigures(np.zeros((keys, 7)), np.zeros((keys, N_POSITIONS), np.int64), np.zeros((keys, N_POSITIONS)),
                       np.zeros((keys, N_POSITIONS)), np.zeros((keys, N_PROBABILITY), np.int64),
                       np.zeros((keys, N_PROBABILITY)), np.zeros(sequences), np.zeros(sequences, np.int64),
                       np.empty(room, np.int64), np.empty(room, np.int64), np.zeros(keys, np.int64),
                       np.full((keys, len(qs)), -1, np.int64))
    lo = math.log(1.0 - eps) if eps < 1 else -math.inf
    _reduce_batch(a, b, mask, parts, lo, math.log(1.0 + eps), PROBABILITY_OF, LOG_THRESHOLDS,
                  np.array(qs, np.float64), np.zeros((len(parts), 7)), np.zeros(N_BINS, np.int64), *out)
    return out


@numba.njit(cache=True, nogil=True)
def _reduce_batch(a, b, mask, parts, lo, hi, prob_of, thr, qs, part_sums, hist, sums, pos_count, pos_sum, pos_max,
                  prob_count, prob_sum, seq_sum, seq_n, bins, counts, ends, quantile_bins):  # pragma: no cover
    used = 0
    for p in range(parts.shape[0]):
        k, start, rows, width, first = parts[p, 0], parts[p, 1], parts[p, 2], parts[p, 3], parts[p, 4]
        stop = start + rows * width
        reduce_rows(a[start:stop].reshape((rows, width)), b[start:stop].reshape((rows, width)),
                mask[start:stop].reshape((rows, width)), lo, hi, prob_of, thr, part_sums[p], hist, pos_count[k],
                pos_sum[k], pos_max[k], prob_count[k], prob_sum[k], seq_sum[first:first + rows],
                seq_n[first:first + rows])
        for i in (0, 1, 2, 3, 5, 6):  # as reduce_pair adds a pair's sums to its PairFigures
            sums[k, i] += part_sums[p, i]
        sums[k, 4] = max(sums[k, 4], part_sums[p, 4])
        if p + 1 < parts.shape[0] and parts[p + 1, 0] == k:
            continue
        begin = used
        # the key's filled bins, in order, and the histogram zeroed for the next key: those up to the
        # bin of max |Δ| (and the next: a float32 Δ rounds at most a bin above it), all where those miss a token
        top = min(HALF, ((float32_bits(np.float32(sums[k, 4])) >> 17) + 9) & ~7)
        if hist[:top].sum() + hist[HALF:HALF + top].sum() != sums[k, 0]:
            top = HALF
        used = _take(hist, 0, top, bins, counts, used)
        used = _take(hist, HALF, HALF + top, bins, counts, used)
        ends[k] = used
        _quantile_bins(bins[begin:used], counts[begin:used], qs, quantile_bins[k])


@numba.njit(cache=True, nogil=True)
def _take(hist, start, stop, bins, counts, used):  # pragma: no cover - compiled
    """The filled bins of hist[start:stop] (a multiple of 8 long) into bins, counts from `used`, zeroed
    (indexes from 0 on a view: the compiler proves them >= 0, no negative-index wrap-around per access)."""
    h = hist[start:stop]
    for block in range(h.size // 8):
        at = block * 8
        if (h[at] | h[at + 1] | h[at + 2] | h[at + 3] | h[at + 4] | h[at + 5] | h[at + 6] | h[at + 7]) == 0:
            continue
        for i in range(at, at + 8):
            if h[i] != 0:
                bins[used] = start + i
                counts[used] = h[i]
                h[i] = 0
                used += 1
    return used


@numba.njit(cache=True, nogil=True)
def _quantile_bins(bins, counts, qs, found):  # pragma: no cover - compiled
    """The |Δ| bin of each quantile: the first whose cumulative count reaches max(1, ⌈q · total⌉),
    the |Δ| bins merged from the Δ >= 0 and Δ < 0 ones (as PairFigures.quantiles)."""
    total = counts.sum()
    mid = 0
    while mid < bins.size and bins[mid] < HALF:
        mid += 1
    i, j, seen = 0, mid, 0
    while i < mid or j < bins.size:
        if j >= bins.size or (i < mid and bins[i] <= bins[j] - HALF):
            at, c = bins[i], counts[i]
            i += 1
            if j < bins.size and bins[j] - HALF == at:
                c += counts[j]
                j += 1
        else:
            at, c = bins[j] - HALF, counts[j]
            j += 1
        seen += c
        for q in range(qs.size):
            if found[q] < 0 and seen >= max(1, math.ceil(qs[q] * total)):
                found[q] = at
