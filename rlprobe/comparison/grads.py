"""Gradient comparison: sign agreement per (monitor, rank, step, param) by XOR + popcount of the
packed sign bits, then SQL (grad_similarity.sql, grad_flags.sql) for similarity, drift and flags.
Reads rlprobe dumps and msprobe grad_probe dumps alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rlprobe.comparison.sample_alignment import first_rank_only, layout_tolerance
from rlprobe.comparison.tolerance import EPS, Tolerance
from rlprobe.lake.reader import Dump
from rlprobe.lake.regular_files import SIGNS, load_npy
from rlprobe.lake.schema import GRAD, with_rank
from rlprobe.lake.sql_runner import run

# layout_similarity_min: the weighted sign similarity a step's first compared gradients need when
# the runs' layouts differ (docs/grads.md, "Runs with different layouts"): the bundled example's
# 2 vs 4 micro-batches and 1 vs 2 gloo ranks measure 0.9989 and above, its lr and advantage-bug
# faults 0.81 and below.
DEFAULTS = {"first_step_min": 0.97, "max_drop": 0.03, "norm_rtol": 1e-3, "layout_similarity_min": 0.99}
KEY = ("monitor", "rank", "step", "param")
SIGN_COLUMNS = [*KEY, "numel", "sign_file", "sign_offset", "sign_numel"]
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], np.uint8)


def grad_table(dump: Dump, errors: list[str] | None = None) -> pa.Table:
    table = dump.arrow("grad", errors=errors) if dump.format == "rlprobe" else dump.arrow("grad")
    schema = with_rank(GRAD)
    if table.num_rows == 0:
        return schema.empty_table()
    return table.select(schema.names).cast(schema)


def packed_signs(dump: Dump, row: dict[str, Any], cache: dict[str, np.ndarray]) -> np.ndarray:
    """The packed sign bytes of one row (np.packbits order; padding bits of the last byte are 0)."""
    file = row["sign_file"]
    if row["sign_offset"] is None:  # msprobe: a bool .npy per parameter
        return np.packbits(load_npy(dump.path / file, SIGNS).reshape(-1))
    whole = cache.get(file)
    if whole is None:
        cache.clear()  # rows come a file (step) at a time: one open map, not one per step of the run
        whole = cache[file] = load_npy(dump.path / file, SIGNS, mmap=True)
    start = int(row["sign_offset"])
    return np.asarray(whole[start: start + (int(row["sign_numel"]) + 7) // 8])


def agreeing_bits(a: np.ndarray, b: np.ndarray, numel: int) -> int:
    """Elements whose sign bits agree, of `numel`, from two packed arrays (padding ignored)."""
    if a.size != b.size or a.size != (numel + 7) // 8:
        raise ValueError(f"packed sizes {a.size} and {b.size} bytes do not hold {numel} bits")
    x = np.bitwise_xor(a, b)
    if numel % 8 and x.size:
        x = x.copy()
        x[-1] &= (0xFF << (8 - numel % 8)) & 0xFF
    count = _popcount(x).sum(dtype=np.int64)
    return numel - int(count)


def sign_results(dump_a: Dump, dump_b: Dump, table_a: pa.Table, table_b: pa.Table) -> pa.Table:
    """same_count for every pair with sign maps on both sides and equal element counts.

    rlprobe's maps come one file per (monitor, step, rank) holding every parameter: where both
    runs laid a file out alike (the same offsets), its pairs are counted together (one XOR of
    the file's bytes, the padding bits of each parameter's last byte cleared, one popcount, one
    sum per parameter). Other pairs (msprobe's bool .npy per parameter, layouts that differ,
    files that cannot be read) go one at a time, and a failure is that pair's error."""
    import pyarrow.compute as pc

    def with_signs(table: pa.Table) -> pa.Table:
        return table.select(SIGN_COLUMNS).filter(pc.is_valid(table["sign_file"]))

    pairs = with_signs(table_a).join(with_signs(table_b), list(KEY), join_type="inner", left_suffix="_a",
                                     right_suffix="_b")
    pairs = pairs.filter(pc.fill_null(pc.equal(pairs["sign_numel_a"], pairs["sign_numel_b"]), False))
    pairs = pairs.sort_by([("sign_file_a", "ascending"), ("sign_file_b", "ascending"),
                           ("sign_offset_a", "ascending")])
    n = pairs.num_rows
    same = np.zeros(n, np.int64)
    errors: list[str | None] = [None] * n
    files_a, files_b = pairs["sign_file_a"].to_pylist(), pairs["sign_file_b"].to_pylist()
    offset_a = pairs["sign_offset_a"].fill_null(-1).to_numpy()
    offset_b = pairs["sign_offset_b"].fill_null(-1).to_numpy()
    numel = pairs["sign_numel_a"].to_numpy()
    params = pairs["param"].to_pylist()
    steps = pairs["step"].to_numpy()
    start = 0
    while start < n:
        end = start + 1
        while end < n and files_a[end] == files_a[start] and files_b[end] == files_b[start]:
            end += 1
        group = slice(start, end)
        counted = None
        if offset_a[start] >= 0 and np.array_equal(offset_a[group], offset_b[group]):
            counted = _same_counts_in_file(dump_a.path / files_a[start], dump_b.path / files_b[start],
                                           offset_a[group], numel[group])
        if counted is not None:
            same[group] = counted
        else:  # one pair at a time
            cache_a: dict[str, np.ndarray] = {}
            cache_b: dict[str, np.ndarray] = {}
            for i in range(start, end):
                try:
                    same[i] = agreeing_bits(_packed(dump_a, files_a[i], offset_a[i], numel[i], cache_a),
                                            _packed(dump_b, files_b[i], offset_b[i], numel[i], cache_b), int(numel[i]))
                except (OSError, ValueError) as e:
                    errors[i] = f"sign maps of {params[i]!r} step {steps[i]}: {e}"
        start = end
    valid = pa.array([e is None for e in errors])
    return pa.table({
        "monitor": pairs["monitor"], "rank": pairs["rank"].cast(pa.int64()), "step": pairs["step"].cast(pa.int64()),
        "param": pairs["param"], "same_count": pc.if_else(valid, pa.array(same), pa.nulls(n, pa.int64())),
        "error": pa.array(errors, pa.string())})


def _packed(dump: Dump, file: str, offset: int, numel: int, cache: dict[str, np.ndarray]) -> np.ndarray:
    return packed_signs(dump, {"sign_file": file, "sign_offset": None if offset < 0 else int(offset),
                               "sign_numel": int(numel)}, cache)


def _same_counts_in_file(path_a: Path, path_b: Path, offsets: np.ndarray, numel: np.ndarray) -> np.ndarray | None:
    """Agreeing bits of every parameter packed at `offsets` in both files (None: count them one at
    a time: a file that cannot be read or is too short). The XOR of the files' bytes is counted
    in 64-bit words; a parameter's count is the sum of the whole words inside it plus at most 7
    bytes at each end (summing a count per byte cost 8x the time)."""
    try:
        a, b = load_npy(path_a, SIGNS, mmap=True), load_npy(path_b, SIGNS, mmap=True)
    except (OSError, ValueError):
        return None
    nbytes = (numel + 7) // 8
    ends = offsets + nbytes
    lo, hi = int(offsets.min()), int(ends.max())
    if a.dtype != np.uint8 or b.dtype != np.uint8 or a.ndim != 1 or b.ndim != 1 or hi > min(a.size, b.size):
        return None
    x = np.zeros(-(-(hi - lo) // 8) * 8 + 8, np.uint8)  # whole words and a zero word after the last byte
    np.bitwise_xor(a[lo:hi], b[lo:hi], out=x[:hi - lo])
    tail = (numel % 8 != 0) & (nbytes > 0)
    x[ends[tail] - 1 - lo] &= ((0xFF << (8 - numel[tail] % 8)) & 0xFF).astype(np.uint8)  # clear padding bits
    ones = _popcount(x.view(np.uint64))
    start, stop = offsets - lo, ends - lo
    first_word, end_word = (start + 7) // 8, stop // 8  # the whole words inside: [first_word, end_word)
    sums = np.add.reduceat(ones, np.stack([first_word, end_word], axis=1).reshape(-1), dtype=np.int64)[0::2]
    sums = np.where(first_word < end_word, sums, 0)  # reduceat gives one element for an empty range

    def ones_in(begin: np.ndarray, end: np.ndarray) -> np.ndarray:  # ranges of at most 7 bytes
        at = begin[:, None] + np.arange(7)
        return np.where(at < end[:, None], _popcount(x[np.minimum(at, x.size - 1)]), 0).sum(axis=1, dtype=np.int64)

    sums += ones_in(start, np.minimum(8 * first_word, stop))
    sums += ones_in(np.where(end_word >= first_word, 8 * end_word, stop), stop)
    return numel - sums


def _popcount(values: np.ndarray) -> np.ndarray:
    """Set bits per element of a uint8 or uint64 array."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(values)
    per_byte = _POPCOUNT[values.view(np.uint8)]
    return per_byte if values.dtype == np.uint8 else per_byte.reshape(-1, values.itemsize).sum(axis=1)


def compare_grads(dump_a: Dump, dump_b: Dump, read_errors: list[str] | None = None, *,
                  steps: list[int] | None = None, ranks: list[int] | None = None,
                  layout: dict[str, Any] | None = None, tolerance: Tolerance | None = None,
                  **thresholds: float) -> tuple[dict[str, pa.Table], dict[str, Any] | None]:
    """({'grads', 'grad_steps'}, grad_first_flagged) for two dumps; thresholds as in DEFAULTS.
    `steps`/`ranks` (None: all) select as select_steps_ranks says. `layout`: summary.json's
    `layout` (sample_alignment.layout); where its note says the layouts differ, only each run's
    first rank is compared (sample_alignment.first_rank_only: after the all-reduce every
    data-parallel rank holds the step's gradient, with accumulation the sum over the
    micro-batches), within the layout tolerance, and `layout` gets a `grads` entry and a longer
    note in place. `tolerance`: the comparison's (comparison/tolerance.py; None: the defaults per dtype):
    a gradient whose statistics agree within its dtype's rtol, or that is within rounding of zero, is
    not flagged by its digest or sign similarity (docs/grads.md, "Rounding noise"); rtol 0 judges bitwise."""
    import duckdb

    unknown = set(thresholds) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown gradient thresholds {sorted(unknown)}; expected {sorted(DEFAULTS)}")
    params = {**DEFAULTS, **{k: float(v) for k, v in thresholds.items()}}
    errors: list[str] = []
    across = bool(layout and layout.get("note"))
    table_a, table_b = select_steps_ranks(grad_table(dump_a, errors), grad_table(dump_b, errors), steps,
                                          None if across else ranks)  # across: first_rank_only selects the ranks
    if read_errors is not None:
        read_errors.extend(f"grad stats: {e}" for e in errors)
    if across:
        table_a, table_b = first_rank_only(table_a, table_b, layout, "grads", "gradient", ranks)
    con = duckdb.connect()
    con.register("grad_a", _with_position(table_a))
    con.register("grad_b", _with_position(table_b))
    con.register("sign_results", sign_results(dump_a, dump_b, table_a, table_b))
    con.register("layout_tolerance", layout_tolerance())
    con.register("grad_tolerance", (tolerance or Tolerance()).table((None, None, dtype) for dtype in EPS)
                 .select(["dtype", "rtol"]))
    grads = run(con, "grad_similarity.sql", across=across,
                **{k: params[k] for k in ("first_step_min", "max_drop", "norm_rtol")})
    grads = grads.append_column("flagged", pa.compute.is_valid(grads["flag_reason"]))
    con.register("grads", grads)
    first_step_min = params["layout_similarity_min"] if across else params["first_step_min"]
    steps = run(con, "grad_flags.sql", first_step_min=first_step_min, max_drop=params["max_drop"])
    first = first_flagged(grads, steps)
    if first is not None and across:
        first["compared"] = "layouts differ: rank 0 of each run compared, within the layout tolerance"
    return {"grads": grads, "grad_steps": steps}, first


def select_steps_ranks(table_a: pa.Table, table_b: pa.Table, steps: list[int] | None,
                       ranks: list[int] | None) -> tuple[pa.Table, pa.Table]:
    """The rows of the selected ranks and probe steps (`rlprobe compare --steps/--ranks`). A row's
    probe step is the one it was recorded in (an msprobe row, which has none: its optimizer
    step). An optimizer step (monitor, rank, step) is kept on both sides when either side's row
    is selected, so runs whose optimizer steps fall in different probe steps still pair up."""
    if steps is None and ranks is None:
        return table_a, table_b
    import pyarrow.compute as pc

    group = ["monitor", "rank", "step"]

    def selected(table: pa.Table) -> pa.Table:
        conditions = []
        if ranks is not None:
            conditions.append(pc.is_in(table["rank"], pa.array(ranks, pa.int64())))
        if steps is not None:
            conditions.append(pc.is_in(pc.coalesce(table["probe_step"], table["step"]), pa.array(steps, pa.int64())))
        mask = conditions[0] if len(conditions) == 1 else pc.and_(*conditions)
        return table.filter(mask).select(group)

    chosen = pa.concat_tables([selected(table_a), selected(table_b)]).group_by(group).aggregate([])

    def keep(table: pa.Table) -> pa.Table:  # a semi join on the keys only (list columns cannot be joined)
        rows = table.select(group).append_column("_row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
        kept = rows.join(chosen, group, join_type="left semi")["_row"].to_numpy()
        return table.take(np.sort(kept))  # in the table's own row order

    return keep(table_a), keep(table_b)


def first_flagged(grads: pa.Table, steps: pa.Table, worst: int = 10) -> dict[str, Any] | None:
    """The earliest flagged step (by step, then monitor, rank) and its worst parameters."""
    flagged = [r for r in steps.to_pylist() if r["flagged"]]
    if not flagged:
        return None
    first = min(flagged, key=lambda r: (r["step"], r["monitor"], r["rank"]))
    rows = [r for r in grads.select([*KEY, "similarity", "norm_rel_diff", "flag_reason"]).to_pylist()
            if (r["monitor"], r["rank"], r["step"]) == (first["monitor"], first["rank"], first["step"])]
    rows.sort(key=lambda r: (r["similarity"] if r["similarity"] is not None else 2.0, -(r["norm_rel_diff"] or 0.0)))
    return {"monitor": first["monitor"], "rank": first["rank"], "step": first["step"],
            "weighted_similarity": first["weighted_similarity"], "reason": first["reason"],
            "worst_params": [{"param": r["param"], "similarity": r["similarity"], "reason": r["flag_reason"]}
                             for r in rows[:worst]]}


def _with_position(table: pa.Table) -> pa.Table:
    return table.append_column("position", pa.array(np.arange(table.num_rows, dtype=np.int64)))

