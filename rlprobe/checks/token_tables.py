"""Token-level tables from the saved tensors: each log-prob pair reduced by the kernel
(rlprobe/checks/token_figures.py) and merged per (pair, step, rank), and GRPO advantages per group.

Pairs (a: the trainer's recomputation, b: the other side, Δ = b − a), masked by the response mask:
- `rollout_vs_old`: rollout_log_prob vs old_log_prob;
- `rollout_vs_log_prob`: rollout_log_prob vs log_prob where no old_log_prob is saved (the checks
  keep its on-policy steps);
  both by sample where the rollout's rows carry a sample identity (`save(..., sample_ids=...)`:
  rlprobe/checks/pair_index.py; TRL saves the rollout and the shuffled update micro-batches in
  different calls), else within one save call (same step, rank, micro_step, index; micro-step 0
  for log_prob; equal shapes);
- `on_policy`: log_prob vs old_log_prob at micro-step 0 of one save call.
The pairs of one (pair, step, rank) add into one set of figures, a kernel call per part (no
per-pair histogram or Python object per pair); pool jobs are runs of such keys, each job building
its keys' table rows and Arrow tables, so that the main thread only concatenates them. A job of
small pairs only is one compiled call with tables built a column at a time (token_batch.py). Pairs
within a call are found on the tensor index's columns (pair_index.py) where the rows need not be
read one by one (no sample identity, no `selection`, more keys than pool jobs).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate, pairwise
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rlprobe.checks.compiled import reduce_pair
from rlprobe.checks.pair_index import PairIndex, pair_index, sample_parts, samples_table
from rlprobe.checks.token_figures import HALF, N_PROBABILITY, TABLE_BITS, PairFigures
from rlprobe.checks.token_rows import (BUCKETS, HIST, QUANTILES, SEQUENCES, STEPS, Edges, is_float, loader, Part,
                                       part_tokens, table_edges)
from rlprobe.checks.token_rows import ROLLOUT_KINDS, PairSelection
from rlprobe.lake.reader import Dump

_WANTED = ("log_prob", "old_log_prob", "rollout_log_prob", "response_mask", "advantages", "group_ids")


def tensor_rows(stats: pa.Table, names: tuple[str, ...] = _WANTED
                ) -> dict[tuple[str, int, int, int, str], dict[str, Any]]:
    """(canonical, step, rank, micro_step, index) -> row, for saved tensors of the keys the token
    checks read (or of `names`); the rows built from the columns (Table.to_pylist costs twice as much)."""
    mask = pc.and_(pc.is_in(stats["canonical"], pa.array(names)), pc.is_valid(stats["tensor_file"]))
    mask = pc.and_(mask, pc.invert(pc.fill_null(stats["absent"], False)))
    table = stats.filter(mask)
    columns = [table[c].to_pylist() for c in _ROW]
    return {(c, step, rank, micro, index): {"canonical": c, "step": step, "rank": rank, "micro_step": micro,
                                            "index": index, "dtype": dtype, "shape": shape, "tensor_file": file,
                                            "tensor_offset": offset, "tensor_length": length}
            for c, step, rank, micro, index, dtype, shape, file, offset, length in zip(*columns)}


_ROW = ("canonical", "step", "rank", "micro_step", "index", "dtype", "shape", "tensor_file", "tensor_offset",
        "tensor_length")


def pairs(rows: dict[tuple, dict[str, Any]], samples: pa.Table | None = None,
          selection: PairSelection | None = None) -> list[Part]:
    """Every pair (or those of `selection`): rollout rows by sample where the dump saved their identity,
    else within a call."""
    rollout = selection is None or bool(selection.kinds & ROLLOUT_KINDS)
    by_sample = sample_parts(samples, rows) if rollout and samples is not None and samples.num_rows else []
    aligned = {(p.b["step"], p.b["rank"], p.b["micro_step"], p.b["index"]) for p in by_sample}
    found = list(by_sample)
    for (name, step, rank, micro, index), b in rows.items():
        if name == "rollout_log_prob":
            if (step, rank, micro, index) in aligned:
                continue
            a = rows.get(("old_log_prob", step, rank, micro, index))
            pair = "rollout_vs_old"
            if a is None and micro == 0:
                a, pair = rows.get(("log_prob", step, rank, micro, index)), "rollout_vs_log_prob"
        elif name == "log_prob" and micro == 0:
            a, pair = rows.get(("old_log_prob", step, rank, micro, index)), "on_policy"
        else:
            continue
        if selection is not None and not selection.keeps(pair, step, rank):
            continue
        if a is None or a["shape"] != b["shape"] or not is_float(a) or not is_float(b):
            continue
        mask = (rows.get(("response_mask", step, rank, micro, index))
                or rows.get(("response_mask", step, rank, micro, "")))
        if mask is not None and math.prod(mask["shape"] or [1]) != math.prod(a["shape"] or [1]):
            mask = None
        found.append(Part(pair, a, b, mask))
    return found


def token_tables(dump: Dump, stats: pa.Table, eps: float, workers: int = 2, samples: pa.Table | None = None,
                 selection: PairSelection | None = None) -> dict[str, pa.Table]:
    """token_steps, token_hist, token_positions, token_probability and token_sequences
    (`samples`: samples_table(dump), when the caller has it already), of every pair or of `selection`'s
    (token_rows.selection_for: check_dump(only=...))."""
    samples = samples_table(dump) if samples is None else samples
    jobs = JOBS_PER_THREAD * max(1, workers)
    index = pair_index(stats, jobs) if selection is None and not samples.num_rows else None
    if index is not None:  # the pairs from the index's columns (pair_index.py)
        return _index_tables(dump, index, eps, workers, jobs)
    work: dict[tuple[str, int, int], list[Part]] = {}
    for part in pairs(tensor_rows(stats), samples, selection):
        work.setdefault((part.pair, part.a["step"], part.a["rank"]), []).append(part)
    keys = sorted(work)
    # few keys: each cut into row ranges (split_rows), so that the threads end together
    count = -(-jobs // len(keys)) if workers > 1 and 0 < len(keys) < jobs else 1
    cut = count > 1  # every key in pieces: their figures are added up before the rows are built
    pieces = [(key, piece) for key in keys for piece in split_rows(work[key], count)] if cut else \
        [(key, work[key]) for key in keys]
    edges = table_edges()
    job = _job(dump, eps, edges, cut)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(job, batches(pieces, jobs)))
    tables = [t for _, t in results]
    if cut:
        merged: dict[tuple[str, int, int], PairFigures] = {}
        for (key, _), (figures, _) in zip(pieces, (piece for found, _ in results for piece in found)):
            merged.setdefault(key, PairFigures()).add(figures)
        tables.append(_step_tables([_key_rows(key, f, _meta(work[key]), eps, edges) for key, f in merged.items()]))
    return _joined(tables)


def _joined(tables: list[dict[str, pa.Table]]) -> dict[str, pa.Table]:
    return {name: _concat([t[name] for t in tables if name in t], schema)
            for name, schema in (("token_steps", STEPS), ("token_hist", HIST), ("token_positions", BUCKETS),
                                 ("token_probability", BUCKETS), ("token_sequences", SEQUENCES))}


def _index_tables(dump: Dump, index: PairIndex, eps: float, workers: int, jobs: int) -> dict[str, pa.Table]:
    """token_tables from a PairIndex: each pool job a run of its keys in one compiled call
    (token_batch.index_tables), else (a pair not small, not float32) their Parts one by one as below."""
    from rlprobe.checks.token_batch import index_tables

    edges, keys = table_edges(), index.keys()
    tokens = np.add.reduceat(index.rows[index.a] * index.width[index.a], index.starts[:-1])
    job = _job(dump, eps, edges, False)

    def run(first: int, last: int) -> dict[str, pa.Table]:
        found = index_tables(dump, index, first, last, eps, edges)
        if found is not None:
            return found
        return job([(keys[k], [index.part(i) for i in range(index.starts[k], index.starts[k + 1])])
                    for k in range(first, last)], batched=False)[1]

    ends = list(accumulate(len(r) for r in runs(tokens.tolist(), jobs)))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return _joined(list(pool.map(run, [0, *ends[:-1]], ends)))


def _job(dump: Dump, eps: float, edges: Edges, cut: bool) -> Callable[..., tuple[list, dict[str, pa.Table]]]:
    """A pool job: a run of pieces (key, parts) and their tables (built in the job: both threads share that
    work too); small pairs in one kernel call (token_batch.py), else a kernel call a part."""
    scratch = threading.local()  # a thread's figures, zeroed where filled after each key: no 256 KiB page-in a key

    def piece_job(key: tuple[str, int, int], parts: list[Part]) -> tuple[PairFigures | _KeyRows, list]:
        if cut:
            figures = PairFigures()
            return figures, _reduce_parts(dump, parts, eps, figures)
        figures = getattr(scratch, "figures", None) or PairFigures()
        scratch.figures = None  # a key that fails leaves it dirty: the next one starts afresh
        sequences = _reduce_parts(dump, parts, eps, figures)
        rows = _key_rows(key, figures, _meta(parts), eps, edges)  # not cut: the parts are all the key's
        figures.clear(rows.filled)
        scratch.figures = figures
        return rows, sequences

    def job(batch: list[tuple[tuple[str, int, int], list[Part]]], batched: bool = True
            ) -> tuple[list, dict[str, pa.Table]]:
        if batched and not cut:
            from rlprobe.checks.token_batch import batch_tables

            tables = batch_tables(dump, batch, [_meta(parts) for _, parts in batch], eps, edges)
            if tables is not None:
                return [], tables
        found = [piece_job(key, parts) for key, parts in batch]
        tables = {} if cut else _step_tables([rows for rows, _ in found])
        tables["token_sequences"] = _sequence_table([(key, s) for (key, _), (_, seqs) in zip(batch, found)
                                                     for s in seqs])
        return found, tables
    return job


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables(tables) if tables else schema.empty_table()


JOBS_PER_THREAD = 4  # batches a thread: enough to even out the threads' ends, few enough that a job's cost is the work


def batches(pieces: list[tuple[Any, list[Part]]], count: int) -> list[list[tuple[Any, list[Part]]]]:
    """The pieces in order as up to `count` runs of about equal tokens (one per pool job: a
    thousand small pairs are not a thousand jobs)."""
    found = runs([sum(part_tokens(p) for p in parts) for _, parts in pieces], count)
    at = [0, *accumulate(len(r) for r in found)]
    return [pieces[i:j] for i, j in pairwise(at)]


def runs(sizes: list[int], count: int) -> list[list[int]]:
    """batches() on the pieces' token counts: the runs as lists of the pieces' numbers."""
    target = sum(sizes) / max(1, count)
    found: list[list[int]] = [[]]
    filled = 0.0
    for i, size in enumerate(sizes):
        if found[-1] and filled + size / 2 > target * len(found):
            found.append([])
        found[-1].append(i)
        filled += size
    return [r for r in found if r]


def _reduce_parts(dump: Dump, parts: list[Part], eps: float, figures: PairFigures) -> list:
    """Every part through the kernel into `figures`; (micro_step, rows, tokens, log ratios) per part."""
    sequences, load = [], loader(dump)
    for p in parts:
        mask = None if p.mask is None else load(p.mask, p.mask_rows)
        _, seq_sum, seq_n = reduce_pair(load(p.a, p.a_rows), load(p.b, p.b_rows), eps, mask, into=figures)
        rows = p.a_rows if isinstance(p.a_rows, np.ndarray) else np.arange(len(seq_sum))
        if isinstance(p.a_rows, slice):
            rows = rows + p.a_rows.start
        sequences.append((p.a["micro_step"], rows, seq_n, seq_sum))
    return sequences


def _meta(parts: list[Part]) -> dict[str, Any]:
    return {"dtype_a": parts[0].a["dtype"], "dtype_b": parts[0].b["dtype"],
            "masked": any(p.mask is not None for p in parts)}


MIN_PIECE = 1 << 16  # tokens: a smaller piece's own histogram (and its merge) costs more than a thread saves


def split_rows(parts: list[Part], count: int) -> list[list[Part]]:
    """The parts of one job as up to `count` jobs, each part cut into row ranges of at least
    MIN_PIECE tokens where its tensors (and mask) share the leading dimension (a single large pair
    then keeps every thread busy); sequences keep their row numbers."""
    if count <= 1:
        return [parts]
    pieces: list[list[Part]] = [[] for _ in range(count)]
    for p in parts:
        shape = p.a["shape"] or []
        rows = len(p.a_rows) if p.a_rows is not None else (shape[0] if len(shape) > 1 else 1)
        mask_shape = None if p.mask is None else p.mask["shape"] or []
        same_rows = p.a_rows is not None or mask_shape is None or (len(mask_shape) > 1 and mask_shape[0] == rows)
        size = rows * int(np.prod(shape[1:])) if len(shape) > 1 else 0
        cuts = min(count, rows, size // MIN_PIECE) if len(shape) > 1 and same_rows else 1
        if cuts <= 1:
            pieces[0].append(p)
            continue
        bounds = np.linspace(0, rows, cuts + 1).astype(int).tolist()
        for i, (lo, hi) in enumerate(pairwise(bounds)):
            if p.a_rows is None:
                pieces[i].append(p._replace(a_rows=slice(lo, hi), b_rows=slice(lo, hi),
                                            mask_rows=None if p.mask is None else slice(lo, hi)))
            else:
                pieces[i].append(p._replace(a_rows=p.a_rows[lo:hi], b_rows=p.b_rows[lo:hi],
                                            mask_rows=None if p.mask_rows is None else p.mask_rows[lo:hi]))
    return [piece for piece in pieces if piece]


class _KeyRows(NamedTuple):
    """The rows of one (pair, step, rank) in each step table, and its filled histogram bins."""

    key: tuple[str, int, int]
    step: dict[str, Any]
    hist: dict[str, np.ndarray]
    positions: dict[str, np.ndarray]
    probability: dict[str, np.ndarray]
    filled: np.ndarray


def _key_rows(key: tuple[str, int, int], f: PairFigures, meta: dict[str, Any], eps: float, edges: Edges
              ) -> _KeyRows:
    pair, step, rank = key
    n = f.tokens
    mean = f.sum_delta / n if n else None
    sd = float(np.sqrt(max(f.sum_sq / n - mean * mean, 0.0))) if n else None
    row = {"pair": pair, "step": step, "rank": rank, **meta, "tokens": n, "nonfinite": f.nonfinite,
           "mean_delta": mean, "sd_delta": sd, "mean_abs": f.sum_abs / n if n else None,
           "max_abs": f.max_abs if n else None, "eps": eps, "outside_share": f.outside / n if n else None}
    counts = f.abs_hist()
    filled = np.flatnonzero(counts != 0)  # the few hundred filled bins of 16,384 (on bools: 3x faster)
    row.update(zip((name for name, _ in QUANTILES),
                   f.quantiles(tuple(q for _, q in QUANTILES), edges.quantile, counts, filled)))
    bins = np.concatenate([filled[f.hist[filled] > 0], HALF + filled[f.hist[HALF + filled] > 0]])  # Δ >= 0; Δ < 0
    merged = bins >> TABLE_BITS  # the table's bins: 2^TABLE_BITS of the kernel's summed, in the same order
    starts = np.flatnonzero(np.diff(merged, prepend=-1))
    tokens = np.add.reduceat(f.hist[bins], starts)
    hist = {"lo": edges.table_lo[merged[starts]], "hi": edges.table_hi[merged[starts]], "tokens": tokens}
    p = np.flatnonzero(f.pos_count)
    positions = {"lo": edges.pos_lo[p], "hi": edges.pos_hi[p], "tokens": f.pos_count[p],
                 "mean_abs": f.pos_sum[p] / f.pos_count[p], "max_abs": f.pos_max[p]}
    q = np.flatnonzero(f.prob_count)
    probability = {"lo": edges.prob_lo[q], "hi": edges.prob_lo[q] + 1 / N_PROBABILITY,
                   "tokens": f.prob_count[q], "mean_abs": f.prob_sum[q] / f.prob_count[q],
                   "max_abs": np.full(q.size, np.nan)}
    return _KeyRows(key, row, hist, positions, probability, bins)


def _step_tables(done: list[_KeyRows]) -> dict[str, pa.Table]:
    return {"token_steps": pa.Table.from_pylist([d.step for d in done], schema=STEPS),
            "token_hist": _table([(d.key, d.hist) for d in done], HIST),
            "token_positions": _table([(d.key, d.positions) for d in done], BUCKETS),
            "token_probability": _table([(d.key, d.probability) for d in done], BUCKETS)}


def _sequence_table(found: list[tuple[tuple[str, int, int], tuple]]) -> pa.Table:
    return _table([(key, {"micro_step": np.full(len(seq_sum), micro, np.int64), "sequence": rows,
                          "tokens": seq_n, "log_ratio": seq_sum})
                   for key, (micro, rows, seq_n, seq_sum) in found], SEQUENCES)


def _table(blocks: list[tuple[tuple[str, int, int], dict[str, np.ndarray]]], schema: pa.Schema) -> pa.Table:
    """One table from blocks of rows of one (pair, step, rank) each: the key columns repeated in
    Arrow and numpy (no Python object per row)."""
    if not blocks:
        return schema.empty_table()
    sizes = np.array([len(next(iter(values.values()))) for _, values in blocks], np.int64)
    names = sorted({key[0] for key, _ in blocks})
    codes = np.repeat(np.array([names.index(key[0]) for key, _ in blocks], np.int32), sizes)
    columns = {"pair": pa.DictionaryArray.from_arrays(codes, pa.array(names, pa.string())).cast(pa.string()),
               "step": np.repeat(np.array([key[1] for key, _ in blocks], np.int64), sizes),
               "rank": np.repeat(np.array([key[2] for key, _ in blocks], np.int64), sizes)}
    for name in schema.names[3:]:
        columns[name] = np.concatenate([np.asarray(values[name]) for _, values in blocks])
    return pa.table({n: pa.array(columns[n], schema.field(n).type) if n != "pair" else columns[n]
                     for n in schema.names}, schema=schema)


GROUPS = pa.schema([("step", pa.int64()), ("rank", pa.int64()), ("micro_step", pa.int64()), ("index", pa.string()),
                    ("group_id", pa.string()), ("sequences", pa.int64()), ("advantage_sum", pa.float64()),
                    ("advantage_mean", pa.float64()), ("advantage_abs_mean", pa.float64()),
                    ("group_source", pa.string())])


def group_advantages(dump: Dump, stats: pa.Table, group_size: int | None, samples: pa.Table | None = None
                     ) -> pa.Table:
    """Per GRPO group: the sum and mean of the sequences' advantages (a sequence's advantage is the
    mean over its tokens). Groups from the advantages' sample rows (`save(..., group_ids=...)`),
    else from a `group_ids` tensor saved in the same call (older dumps), else from consecutive rows
    of `group_size` (a config key)."""
    rows = tensor_rows(stats, ("advantages", "group_ids"))
    saved_groups = _sample_groups(samples_table(dump) if samples is None else samples)
    out: list[dict] = []
    for (name, step, rank, micro, index), row in sorted(rows.items(), key=lambda kv: kv[0][1:]):
        if name != "advantages":
            continue
        adv = dump.load_row_tensor(row).astype(np.float64)
        per_seq = adv.reshape(adv.shape[0], -1).mean(axis=1) if adv.ndim > 1 else adv.ravel()
        ids, source = saved_groups.get((step, rank, micro, index)), "save(group_ids=...)"
        ids_row = rows.get(("group_ids", step, rank, micro, index)) or rows.get(("group_ids", step, rank, micro, ""))
        if (ids is None or ids.size != per_seq.size) and ids_row is not None:
            ids, source = dump.load_row_tensor(ids_row).ravel(), "saved group_ids"
        if ids is None or ids.size != per_seq.size:
            if not group_size:
                continue
            ids, source = np.arange(per_seq.size) // group_size, f"config group size {group_size}"
        groups, inverse = np.unique(np.asarray(ids).astype(str), return_inverse=True)
        count = np.bincount(inverse)
        total = np.bincount(inverse, weights=per_seq)
        absolute = np.bincount(inverse, weights=np.abs(per_seq))
        for g, c, s, a in zip(groups.tolist(), count.tolist(), total.tolist(), absolute.tolist()):
            out.append({"step": step, "rank": rank, "micro_step": micro, "index": index, "group_id": g,
                        "sequences": c, "advantage_sum": s, "advantage_mean": s / c, "advantage_abs_mean": a / c,
                        "group_source": source})
    return pa.Table.from_pylist(out, schema=GROUPS)


def _sample_groups(samples: pa.Table) -> dict[tuple[int, int, int, str], np.ndarray]:
    """(step, rank, micro_step, index) of each advantages tensor -> its rows' group ids, from save(group_ids=...)."""
    if samples.num_rows == 0:
        return {}
    table = samples.filter(pc.and_(pc.equal(samples["canonical"], "advantages"), pc.is_valid(samples["group_id"])))
    found: dict[tuple[int, int, int, str], dict[int, str]] = {}
    for r in table.select(["step", "rank", "micro_step", "index", "row", "group_id"]).to_pylist():
        found.setdefault((r["step"], r["rank"], r["micro_step"], r["index"]), {})[r["row"]] = r["group_id"]
    return {k: np.array([v[i] for i in sorted(v)], dtype=object) for k, v in found.items()}
