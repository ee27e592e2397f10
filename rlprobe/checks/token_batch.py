"""A pool job of many small pairs (a [batch, seq] log-prob per micro-batch and step) in one compiled
call: reduce_pair a pair, a PairFigures and table rows a key cost ~0.4 ms of Python and allocation
around a kernel that takes tens of µs on such a pair, and reading each file from Python as long
again. Each part's files are read in compiled code (kernels.reduce_batch, rlprobe/checks/kernels.pyx) into the thread's scratch rows and
reduced there while their bytes are in the cache; each key's filled histogram bins are taken from the
blocks the kernel marked. The tables are then built a column at a time (figures_tables): the same operations
on the same float64 values as token_tables._key_rows a key, and the key columns repeated in numpy (a run of
1,024 small pairs fills ~500,000 histogram rows); they equal those token_tables.py builds key by key
(tests/check/test_token_tables.py)."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from rlprobe.checks import token_rows as tt
from rlprobe.checks.kernels import reduce_batch
from rlprobe.checks.pair_index import PairIndex
from rlprobe.checks.token_figures import (BLOCK_BITS, LOG_THRESHOLDS, N_BINS, N_POSITIONS, N_PROBABILITY,
                                         PROBABILITY_OF, TABLE_BITS, as_rows, check_shapes, mask_bytes)
from rlprobe.checks.token_rows import Part
from rlprobe.lake import npy_header
from rlprobe.lake.layout import PACK_SUFFIX
from rlprobe.lake.npy_header import header_bytes
from rlprobe.lake.reader import Dump
from rlprobe.lake.regular_files import READ_FLAGS  # O_NONBLOCK among them: a FIFO is never waited on

SMALL = 1 << 20  # tokens: a larger pair goes to the kernel mapped (its own job, or cut into row ranges)
_READ = 4  # parts[:, _READ]: where a part's tokens start in the preloaded arrays, -1: its files are read here


class _Plan(NamedTuple):
    """What the compiled call reads: per part (int64 columns) key, rows, width, first sequence,
    preloaded at (or -1), the paths' places in `paths` of a, b and the mask (-1: none), the headers
    of a and b and of the mask (rows of `headers`, header_sizes[h] bytes long), the folders of a, b
    and the mask (in `folders`, relative to the dump's; the paths relative to them)."""

    parts: np.ndarray
    paths: np.ndarray
    folders: list[str]
    headers: np.ndarray
    header_sizes: np.ndarray
    picks: list[np.ndarray | None]  # a part's rows' numbers in its tensors (a sample pair), None: 0, 1, …
    micro_steps: list[int]


def batch_tables(dump: Dump, batch: list[tuple[tuple[str, int, int], list[Part]]], metas: list[dict[str, Any]],
                 eps: float, edges: Any) -> dict[str, pa.Table] | None:
    """The tables of a run of keys (metas: token_tables._meta of each); None where a pair is not
    small or not float32 (the caller reduces those keys one by one)."""
    plan = _plan(batch)
    if plan is None:
        return None
    parts = [p for _, ps in batch for p in ps]
    f = _reduce(dump, len(batch), parts.__getitem__, plan, eps, edges)
    if f is None:
        return None
    return figures_tables([key for key, _ in batch], metas, f, plan.parts[:, :4], plan.picks, plan.micro_steps,
                          eps, edges)


def index_tables(dump: Dump, index: PairIndex, first: int, last: int, eps: float, edges: Any
                 ) -> dict[str, pa.Table] | None:
    """batch_tables of keys first..last - 1 of a PairIndex (pair_index.py), the plan gathered from its
    columns; None as batch_tables (the caller then reduces those keys' Parts one by one: index.part)."""
    lo, hi = int(index.starts[first]), int(index.starts[last])
    a, b, m = index.a[lo:hi], index.b[lo:hi], index.mask[lo:hi]
    rows, width = index.rows[a], index.width[a]
    if (rows * width > SMALL).any():
        return None
    key = np.repeat(np.arange(last - first), np.diff(index.starts[first:last + 1]))
    masked, m0 = m >= 0, np.maximum(m, 0)
    none = np.full(len(a), -1, np.int64)
    spec = np.stack([key, rows, width, np.cumsum(rows) - rows, none, index.name_at[a], index.name_at[b],
                     np.where(masked, index.name_at[m0], -1), index.header[a], np.where(masked, index.header[m0], -1),
                     index.folder[a], index.folder[b], np.where(masked, index.folder[m0], -1),
                     index.offset[a], index.offset[b], np.where(masked, index.offset[m0], 0)], axis=1)
    if not npy_header.COMPILED_READS:
        spec[:, 5:13] = -1  # every part read by numpy (_preload), as _plan plans them there
    plan = _Plan(spec, index.paths, index.folders, index.headers, index.header_sizes, [None] * len(a),
                 index.micro_step[a])
    f = _reduce(dump, last - first, lambda i: index.part(lo + i), plan, eps, edges)
    if f is None:
        return None
    keys = index.keys()[first:last]
    starts = index.starts[first:last].tolist()
    metas = [{"dtype_a": index.dtypes[int(index.a[s])], "dtype_b": index.dtypes[int(index.b[s])], "masked": bool(k)}
             for s, k in zip(starts, np.add.reduceat(masked, index.starts[first:last] - lo).tolist())]
    return figures_tables(keys, metas, f, spec[:, :4], plan.picks, plan.micro_steps, eps, edges)


def _rows_width(p: Part) -> tuple[int, int]:
    """The part's (sequences, tokens a sequence), as as_rows() shapes its tensors (rows picked)."""
    shape = p.a["shape"] or []
    picked = None if p.a_rows is None else len(p.a_rows)
    if not shape:
        return 1, 1
    if len(shape) == 1:
        return 1, shape[0] if picked is None else picked
    return shape[0] if picked is None else picked, math.prod(shape[1:])


def _plan(batch: list[tuple[tuple[str, int, int], list[Part]]]) -> _Plan | None:
    spec, paths, picks, micro_steps, headers, folders = [], [], [], [], {}, {}
    at = first = 0

    def path(row: dict) -> tuple[int, int]:
        """Where the file's name (its last 4 parts) starts in `paths`, and its folder's number."""
        nonlocal at
        folder, name = _split(row["tensor_file"])
        paths.append(os.fsencode(name) + b"\0")
        at += len(paths[-1])
        return at - len(paths[-1]), folders.setdefault(folder, len(folders))

    def header(row: dict) -> int:
        return headers.setdefault(tuple(row["shape"] or ()), len(headers))

    for k, (_, parts) in enumerate(batch):
        for p in parts:
            rows, width = _rows_width(p)
            if rows * width > SMALL:
                return None
            if p.a_rows is None and p.b_rows is None and p.mask_rows is None and npy_header.COMPILED_READS:
                (a, a_in), (b, b_in), (m, m_in) = path(p.a), path(p.b), (-1, -1) if p.mask is None else path(p.mask)
                files = (a, b, m, header(p.a), -1 if p.mask is None else header(p.mask), a_in, b_in, m_in,
                         _offset(p.a), _offset(p.b), 0 if p.mask is None else _offset(p.mask))
            else:  # a sample pair's rows: numpy reads and gathers them (_preload)
                files = (-1,) * 8 + (0,) * 3
            spec.append((k, rows, width, first, -1, *files))
            picks.append(p.a_rows if isinstance(p.a_rows, np.ndarray) else None)
            micro_steps.append(p.a["micro_step"])
            first += rows
    texts = [header_bytes(npy_header.STORED, shape) for shape in headers]
    sizes = np.array([len(t) for t in texts], np.int64)
    table = np.zeros((len(texts), int(sizes.max()) if texts else 0), np.uint8)
    for i, t in enumerate(texts):
        table[i, :len(t)] = np.frombuffer(t, np.uint8)
    return _Plan(np.array(spec, np.int64).reshape(-1, 16), np.frombuffer(b"".join(paths) or b"\0", np.uint8),
                 list(folders), table, sizes, picks, micro_steps)


def _offset(row: dict) -> int:
    """Where the row's .npy record starts in its file (a packed file's record, lake/tensor_pack.py; else 0)."""
    return row.get("tensor_offset") or 0


def _split(tensor_file: str) -> tuple[str, str]:
    """(folder, name) of a tensor file, the folder shared by many files: opened from there, a file's open
    walks fewer names (one from the dump's folder walked 7 in the layout before issue 15, a third of the
    time of an open). A packed file: its base name, in its rank's folder (or its step's, change 13); a whole
    .npy: its last 4 parts (step=…/rank=…/micro_step=…/_.npy), in its key's folder."""
    if tensor_file.endswith(PACK_SUFFIX):
        folder, _, name = tensor_file.rpartition("/")
        return folder, name
    parts = tensor_file.split("/")
    return "/".join(parts[:-4]), "/".join(parts[-4:])


def _preload(load: Any, p: Part, rows: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A part's tokens read by numpy (rlprobe's map_tensor): a sample pair's rows, or files not in
    numpy's plain float32 layout of the index's shape; None where they are not float32 pairs of that
    shape (the job then reduces its keys one by one, which reads them or says why not)."""
    a, b = load(p.a, p.a_rows), load(p.b, p.b_rows)
    mask = None if p.mask is None else load(p.mask, p.mask_rows)
    if a.dtype != np.float32 or b.dtype != np.float32 or as_rows(a).shape != (rows, width):
        return None
    check_shapes(a, b, mask)
    m = np.ones(rows * width, np.uint8) if mask is None else mask_bytes(mask).reshape(-1)
    return a.reshape(-1), b.reshape(-1), m


def _reduce(dump: Dump, keys: int, part: Callable[[int], Part], plan: _Plan, eps: float, edges: Any
            ) -> BatchFigures | None:
    """The compiled call over every part (part(i): the plan's part i, for numpy to read); where it stops
    at a part it cannot read, numpy reads that part (_preload) and the call goes on from there."""
    spec = plan.parts.copy()  # its column _READ changes as parts are preloaded
    qs = np.array([q for _, q in tt.QUANTILES], np.float64)
    sequences = int(spec[:, 1].sum()) if len(spec) else 0
    bound = np.zeros(keys, np.int64)
    np.add.at(bound, spec[:, 0], spec[:, 1] * spec[:, 2])
    hist, touched, counts, hist_lo, hist_hi = scratch = _scratch(int(np.minimum(bound, N_BINS >> TABLE_BITS).sum()))
    out = BatchFigures(np.zeros((keys, 7)), np.zeros((keys, N_POSITIONS), np.int64), np.zeros((keys, N_POSITIONS)),
                       np.zeros((keys, N_POSITIONS)), np.zeros((keys, N_PROBABILITY), np.int64),
                       np.zeros((keys, N_PROBABILITY)), np.zeros(sequences), np.zeros(sequences, np.int64),
                       counts, hist_lo, hist_hi, np.zeros(keys, np.int64), np.full((keys, len(qs)), -1, np.int64))
    lo = math.log(1.0 - eps) if eps < 1 else -math.inf
    load, count = tt.loader(dump), len(spec)
    loaded: list = [None] * count
    for i in np.flatnonzero(spec[:, 5] < 0).tolist():  # sample pairs' rows: read by numpy first
        loaded[i] = _preload(load, part(i), int(spec[i, 1]), int(spec[i, 2]))
        if loaded[i] is None:
            return None
    part_sums = np.zeros((count, 7))
    folders = np.full(len(plan.folders), -1, np.int32)  # one that cannot be opened: its files are read by numpy
    try:
        for i, folder in enumerate(plan.folders):
            folders[i] = _open_folder(os.path.join(dump.path, folder))
        start = used = 0
        while True:
            pre = _concatenated(spec, loaded)
            start, used = reduce_batch(folders, READ_FLAGS, plan.paths, spec, plan.headers,
                                        plan.header_sizes, *pre, start, used, lo, math.log(1.0 + eps), PROBABILITY_OF,
                                        LOG_THRESHOLDS, qs, npy_header.FLOAT32_DESCR, npy_header.MASK_DESCRS, part_sums, hist,
                                        touched, TABLE_BITS, edges.table_lo, edges.table_hi, *out)
            if start == count:  # the histogram is zero again: the thread's next job reuses it
                _SCRATCH.arrays = scratch
                return out._replace(counts=counts[:used].copy(), hist_lo=hist_lo[:used].copy(),
                                    hist_hi=hist_hi[:used].copy())
            loaded[start] = _preload(load, part(start), int(spec[start, 1]), int(spec[start, 2]))
            if loaded[start] is None:
                return None
    finally:
        for fd in folders[folders >= 0].tolist():
            os.close(fd)


def _open_folder(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return -1


_SCRATCH = threading.local()


def _scratch(room: int) -> tuple[np.ndarray, ...]:
    """This thread's histogram and block marks (zero) and rows for `room` filled bins (counts, lower
    and upper edges), taken until the job gives them back (one that stops half-way leaves them dirty).
    Reused from job to job: rows allocated a job at the bound of `room` (a key's tokens, many times the
    rows a small pair fills) were fresh huge pages zeroed whole, ~10 % of the CPU time of many small
    pairs; a job copies out the rows it filled."""
    found = getattr(_SCRATCH, "arrays", None)
    _SCRATCH.arrays = None
    if found is None:
        found = (np.zeros(N_BINS, np.int64), np.zeros(N_BINS >> BLOCK_BITS, np.uint8))
    elif found[2].size >= room:
        return found
    return (*found[:2], np.empty(room, np.int64), np.empty(room), np.empty(room))


def _concatenated(spec: np.ndarray, loaded: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The preloaded parts' tokens one after the other; spec[:, _READ] set to where each starts."""
    if not any(x is not None for x in loaded):
        return np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0, np.uint8)
    at = 0
    for i, x in enumerate(loaded):
        if x is not None:
            spec[i, _READ] = at
            at += x[0].size
    if at == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros(0, np.uint8)
    return tuple(np.concatenate([x[j] for x in loaded if x is not None]) for j in range(3))


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
