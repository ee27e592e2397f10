"""The pairs within a save call (token_tables.pairs' rule) computed on the tensor index's columns, with
what token_batch's compiled reads need of each file: a dump of a thousand small pairs built a dict a
tensor row, a Part a pair and a plan row a part in Python (~12 ms of CPU, half of it on the main thread
before the pool started, the rest holding the GIL in the jobs). Here numpy and Arrow do it at once; the
parts come out as token_tables.pairs gives them, grouped by key (pair, step, rank) in sorted order, a
key's parts in the tensor index's order. None where the columnar rule does not apply (a tensor saved twice
under one name and call, a null step): token_tables then pairs the rows in Python.

Then rollout and trainer rows paired by sample identity (the dump's `sample` rows, written by
`save(..., sample_ids=...)` or derived from the prompt ids: docs/dump-format.md, "Samples"), for trainers that
save the rollout and the shuffled update micro-batches in different calls (TRL): the join is
sql/check/sample_pairs.sql, and sample_parts makes its rows kernel parts, one per pair of save calls, with the
row indices to gather from each tensor."""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rlprobe.checks.token_rows import Part, float_dtype, is_float
from rlprobe.key_names import canonical_names
from rlprobe.lake import npy_header
from rlprobe.lake.layout import PACK_SUFFIX
from rlprobe.lake.npy_header import header_bytes
from rlprobe.lake.reader import Dump
from rlprobe.lake.sql_runner import run

#: pair kinds in the order of their names (token_tables sorts keys by name, step, rank)
KINDS = ("on_policy", "rollout_vs_log_prob", "rollout_vs_old")
ON_POLICY, ROLLOUT_VS_LOG_PROB, ROLLOUT_VS_OLD = range(3)
_NAMES = ("log_prob", "old_log_prob", "rollout_log_prob", "response_mask")
_LOG_PROB, _OLD, _ROLLOUT, _MASK = range(4)
_ROW = ("canonical", "step", "rank", "micro_step", "index", "dtype", "shape", "tensor_file", "tensor_offset",
        "tensor_length")


class PairIndex(NamedTuple):
    """Parts (one a pair: kind, step, rank, rows a, b and mask of `table`, -1: no mask) by key; per tensor
    row its (sequences, tokens a sequence) as token_batch reads it, its float dtype, its numpy header
    (a row of `headers`) and its file's name in `paths` and folder in `folders`."""

    table: pa.Table
    kind: np.ndarray
    step: np.ndarray
    rank: np.ndarray
    a: np.ndarray
    b: np.ndarray
    mask: np.ndarray
    starts: np.ndarray  # key k's parts: starts[k]:starts[k + 1]
    micro_step: np.ndarray
    rows: np.ndarray
    width: np.ndarray
    header: np.ndarray
    headers: np.ndarray
    header_sizes: np.ndarray
    name_at: np.ndarray
    paths: np.ndarray
    folder: np.ndarray
    folders: list[str]
    dtypes: list[str | None]
    offset: np.ndarray  # where each row's .npy record starts in its file (a packed file's; else 0)

    def keys(self) -> list[tuple[str, int, int]]:
        first = self.starts[:-1]
        return list(zip([KINDS[k] for k in self.kind[first].tolist()], self.step[first].tolist(),
                        self.rank[first].tolist()))

    def part(self, i: int) -> Part:
        """Part i as token_tables.pairs builds it (its rows as dicts): for the jobs that read it in Python."""
        m = int(self.mask[i])
        return Part(KINDS[self.kind[i]], self._row(int(self.a[i])), self._row(int(self.b[i])),
                    None if m < 0 else self._row(m))

    def _row(self, i: int) -> dict[str, Any]:
        return {name: self.table[name][i].as_py() for name in _ROW}


def pair_index(stats: pa.Table, min_keys: int = 0) -> PairIndex | None:
    """The within-call pairs of `stats` (inputs.stats_table), as token_tables.pairs without samples or a
    selection; None where the rule needs the rows one by one (see the module's docstring) or where they
    make fewer than `min_keys` keys (token_tables then cuts each key between the threads)."""
    mask = pc.and_(pc.is_in(stats["canonical"], pa.array(_NAMES)), pc.is_valid(stats["tensor_file"]))
    table = stats.select(list(_ROW)).filter(pc.and_(mask, pc.invert(pc.fill_null(stats["absent"], False))))
    n = table.num_rows
    if n == 0 or any(table[c].null_count for c in ("canonical", "step", "rank", "micro_step", "index")):
        return None
    name = pc.index_in(table["canonical"], pa.array(_NAMES)).to_numpy()
    step, rank, micro = (table[c].to_numpy() for c in ("step", "rank", "micro_step"))
    index = pc.dictionary_encode(table["index"]).combine_chunks()
    idx = index.indices.to_numpy().astype(np.int64)
    call = _numbered(step, rank, micro, idx)
    if call is None:
        return None
    ncalls = int(call.max()) + 1
    row_of = np.full((len(_NAMES), ncalls), -1, np.int64)
    row_of[name, call] = np.arange(n)
    if (row_of[name, call] != np.arange(n)).any():  # a name saved twice in one call: the dict keeps the last
        return None
    empty = index.dictionary.index("").as_py()  # a mask saved without an index serves each index of its call
    if empty >= 0:
        group = _numbered(step, rank, micro)
        mask_of_group = np.full(int(group.max()) + 1, -1, np.int64)
        masks = np.flatnonzero((name == _MASK) & (idx == empty))
        mask_of_group[group[masks]] = masks
    shape_id, shapes = _shapes(table["shape"])
    floats = _floats(table["dtype"])

    b = np.flatnonzero((name == _ROLLOUT) | ((name == _LOG_PROB) & (micro == 0)))
    old = row_of[_OLD, call[b]]
    rollout = name[b] == _ROLLOUT
    kind = np.where(rollout, ROLLOUT_VS_OLD, ON_POLICY)
    fallback = rollout & (old < 0) & (micro[b] == 0)  # no old_log_prob: rollout vs log_prob at micro-step 0
    a = np.where(fallback, row_of[_LOG_PROB, call[b]], old)
    kind = np.where(fallback, ROLLOUT_VS_LOG_PROB, kind)
    keep = a >= 0
    a, b, kind = a[keep], b[keep], kind[keep]
    keep = (shape_id[a] == shape_id[b]) & floats[a] & floats[b]
    a, b, kind = a[keep], b[keep], kind[keep]
    m = row_of[_MASK, call[b]]
    if empty >= 0:
        m = np.where(m < 0, mask_of_group[group[b]], m)
    numel = np.array([int(np.prod(s)) if s else 1 for s in shapes], np.int64)[shape_id]
    m = np.where((m >= 0) & (numel[np.maximum(m, 0)] == numel[a]), m, -1)

    order = np.lexsort((b, rank[b], step[b], kind))  # keys sorted, a key's parts in the index's order
    a, b, m, kind = a[order], b[order], m[order], kind[order]
    new = np.ones(len(b), bool)
    new[1:] = (kind[1:] != kind[:-1]) | (step[b][1:] != step[b][:-1]) | (rank[b][1:] != rank[b][:-1])
    starts = np.append(np.flatnonzero(new), len(b))
    if len(starts) - 1 < max(min_keys, 1):
        return None
    rows, width, header, headers, sizes = _layout(shapes, shape_id)
    name_at, paths, folder, folders = _files(table["tensor_file"])
    if name_at is None:
        return None
    return PairIndex(table, kind, step[b], rank[b], a, b, m, starts, micro, rows, width, header, headers, sizes,
                     name_at, paths, folder, folders, table["dtype"].to_pylist(),
                     pc.fill_null(table["tensor_offset"], 0).to_numpy().astype(np.int64))


def _numbered(*columns: np.ndarray) -> np.ndarray | None:
    """Each row's tuple of the columns' values as a number 0, 1, … (equal tuples, equal numbers); None where
    the tuples do not fit in 62 bits."""
    key, span = np.zeros(len(columns[0]), np.int64), 1
    for c in columns:
        lo, hi = int(c.min()), int(c.max())
        span *= hi - lo + 1
        if span >= 1 << 62:
            return None
        key = key * (hi - lo + 1) + (c - lo)
    return np.unique(key, return_inverse=True)[1].reshape(-1)


def _shapes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[tuple[int, ...] | None]]:
    """Each row's shape as a number (equal numbers: equal shapes, a null shape apart), and the shapes."""
    shape = column.combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(shape), 0).to_numpy()
    values = pc.list_flatten(shape).to_numpy(zero_copy_only=False)
    padded = np.full((len(shape), int(lengths.max(initial=0)) + 1), -1, np.int64)
    padded[:, 0] = np.where(shape.is_null().to_numpy(zero_copy_only=False), -1, lengths)
    at = np.repeat(np.cumsum(lengths) - lengths, lengths)
    padded[np.repeat(np.arange(len(shape)), lengths), np.arange(len(values)) - at + 1] = values
    if (padded == padded[0]).all():  # one shape (np.unique on rows: ~3 ms for 3,000)
        unique, shape_id = padded[:1], np.zeros(len(padded), np.int64)
    else:
        rows = np.ascontiguousarray(padded).view(np.dtype((np.void, padded.shape[1] * 8))).reshape(-1)
        _, first, shape_id = np.unique(rows, return_index=True, return_inverse=True)
        unique = padded[first]
    shapes = [None if u[0] < 0 else tuple(u[1:1 + u[0]].tolist()) for u in unique]
    return shape_id.reshape(-1), shapes


def _floats(column: pa.ChunkedArray) -> np.ndarray:
    dtypes = pc.dictionary_encode(column).combine_chunks()
    known = np.array([float_dtype(d) for d in dtypes.dictionary.to_pylist()] + [float_dtype(None)], bool)
    return known[pc.fill_null(dtypes.indices, len(dtypes.dictionary)).to_numpy()]


def _layout(shapes: list, shape_id: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per row: sequences and tokens a sequence (token_batch._rows_width) and the header numpy writes for
    its shape (a row of the headers' table, their sizes)."""
    dims = [tuple(s or ()) for s in shapes]
    rows = np.array([1 if len(d) < 2 else d[0] for d in dims], np.int64)
    width = np.array([1 if not d else d[0] if len(d) == 1 else int(np.prod(d[1:])) for d in dims], np.int64)
    texts = [header_bytes(npy_header.STORED, d) for d in dims]
    sizes = np.array([len(t) for t in texts], np.int64)
    table = np.zeros((len(texts), int(sizes.max())), np.uint8)
    for i, t in enumerate(texts):
        table[i, :len(t)] = np.frombuffer(t, np.uint8)
    return rows[shape_id], width[shape_id], shape_id, table, sizes


def _files(column: pa.ChunkedArray) -> tuple[Any, ...]:
    """Per row where its file's name starts in the NUL-terminated paths (`paths`) and its folder's number,
    from the column's characters (a regular expression took ~10 ms for 3,000 names)."""
    names = column.combine_chunks()
    if names.null_count or not pa.types.is_string(names.type):
        return None, None, None, None
    ends = np.frombuffer(names.buffers()[1], np.int32)[names.offset:names.offset + len(names) + 1].astype(np.int64)
    data = np.frombuffer(names.buffers()[2], np.uint8)
    starts, ends = ends[:-1], ends[1:]
    slash = np.flatnonzero(data[:ends[-1]] == ord("/"))
    last = np.searchsorted(slash, ends)  # slashes before each name's end
    cut = starts - 1  # the slash before the name (token_batch._split): none with fewer than 4
    within = last - np.searchsorted(slash, starts)  # slashes in each name
    four = within >= 4
    cut[four] = slash[last[four] - 4]
    suffix = np.frombuffer(PACK_SUFFIX.encode(), np.uint8)  # a packed file: its base name
    long = np.flatnonzero(ends - starts >= len(suffix))
    packed = long[(data[ends[long, None] - len(suffix) + np.arange(len(suffix))] == suffix).all(axis=1)]
    packed = packed[within[packed] >= 1]
    cut[packed] = slash[last[packed] - 1]
    joined = pc.binary_join_element_wise(names, "", "\0")  # each path and a NUL, the name its last part
    at = np.frombuffer(joined.buffers()[1], np.int32)[joined.offset:joined.offset + len(joined) + 1]
    paths = np.frombuffer(joined.buffers()[2], np.uint8)[at[0]:at[-1]]
    name_at = (at[:-1] - at[0]) + (cut + 1 - starts)
    lengths = np.maximum(cut - starts, 0)
    first = data[starts[0]:starts[0] + lengths[0]]
    same = lengths == lengths[0]
    if same.all() and (data[starts[:, None] + np.arange(lengths[0])] == first).all():
        return name_at, paths, np.zeros(len(starts), np.int64), [first.tobytes().decode()]
    folders: dict[str, int] = {}  # folders that differ from row to row: each named once
    numbers = [folders.setdefault(data[s:s + n].tobytes().decode(), len(folders))
               for s, n in zip(starts.tolist(), lengths.tolist())]
    return name_at, paths, np.array(numbers, np.int64), list(folders)


_COLUMNS = ("key", "index", "step", "rank", "micro_step", "row", "sample", "occurrence", "group_id", "row_numel")


def samples_table(dump: Dump, names: Mapping[str, str] | None = None) -> pa.Table:
    """The dump's sample rows with each key's canonical name (no rows: a dump without sample identity):
    from `names` (saved key -> canonical: the `stats` table's) where given, else rlprobe/key_names.csv
    decided by the keys of the sample rows."""
    table = dump.arrow("sample")
    if table.num_rows == 0 or not set(_COLUMNS) <= set(table.column_names):
        return pa.table({})
    table = table.select(list(_COLUMNS))
    saved = pc.unique(table["key"])
    keys = saved.to_pylist()
    table_names = canonical_names(keys) if names is None else names
    canonical = pa.array([table_names.get(k, k) for k in keys], pa.string())
    return table.append_column("canonical", pc.take(canonical, pc.index_in(table["key"], saved)))


def sample_parts(samples: pa.Table, rows: dict[tuple, dict[str, Any]]) -> list[Part]:
    """One part per (trainer call, rollout call, mask call) whose rows share samples, float tensors only."""
    import duckdb


    con = duckdb.connect()
    con.register("samples", samples)
    found = run(con, "check/sample_pairs.sql")
    con.close()
    if found.num_rows == 0:
        return []
    groups: dict[tuple, list[tuple[int, int, int | None]]] = {}
    for r in found.to_pylist():
        call = (r["pair"], r["step"], r["rank"], r["a_key"], r["a_micro"], r["a_index"], r["b_micro"], r["b_index"],
                r["m_micro"], r["m_index"])
        groups.setdefault(call, []).append((r["a_row"], r["b_row"], r["m_row"]))
    parts = []
    for (pair, step, rank, a_key, a_micro, a_index, b_micro, b_index, m_micro, m_index), picks in groups.items():
        a = rows.get((a_key, step, rank, a_micro, a_index))
        b = rows.get(("rollout_log_prob", step, rank, b_micro, b_index))
        if a is None or b is None or not is_float(a) or not is_float(b):
            continue  # statistics only, or not log-probs
        mask = None if m_micro is None else rows.get(("response_mask", step, rank, m_micro, m_index))
        index = np.array([(ia, ib, -1 if im is None else im) for ia, ib, im in picks], np.int64)
        mask_rows = index[:, 2] if mask is not None and (index[:, 2] >= 0).all() else None
        parts.append(Part(pair, a, b, None if mask_rows is None else mask, index[:, 0], index[:, 1], mask_rows))
    return parts
