"""Runs with different layouts (micro-batches, data-parallel ranks, shuffled micro-batches):
key data compared per sample instead of per (rank, micro_step) row. docs/compare.md, "Runs
with different layouts".

`layout(con, ...)` loads both runs' `sample` rows (lake/samples.py) and says whether the layouts
differ; `sample_key_data(con, ...)` then builds key_data (the columns of sql/key_data.sql) from
sql/sample_pairs.sql, the rows gathered from the tensor files, and sql/sample_key_data.sql.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rlprobe.lake.encoding import restore
from rlprobe.lake.reader import Dump
from rlprobe.lake.schema import SAMPLE, with_rank
from rlprobe.lake.sql_runner import records, run, store
from rlprobe.lake.regular_files import NPY, load_npy
from rlprobe.lake.tensor_pack import load_record, split_address

if TYPE_CHECKING:
    import duckdb

# The tolerance of a value compared across layouts, relative to the scale of its row (the
# largest magnitude among both rows' values): ULPS units in the last place of the dtype, times
# the square root of REDUCTION, the length of the sums that a layout change reorders. Rounding
# errors of a sum of n terms grow like sqrt(n) when they are independent (Higham, "Accuracy and
# Stability of Numerical Algorithms", 2nd ed., 4.2); REDUCTION 4096 covers hidden sizes and
# micro-batch sums of the models rlprobe is used on, ULPS 16 the few layers and updates the
# difference travels through before it is saved. float32: 1.2e-4; float16 and bfloat16 are
# capped at MAX_RTOL (0.05). Integer and bool values (token ids, masks) must be equal.
ULPS, REDUCTION, MAX_RTOL = 16, 4096, 0.05
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "tf32": 2.0**-10, "float16": 2.0**-10, "bfloat16": 2.0**-7,
       "float8_e4m3fn": 2.0**-3, "float8_e5m2": 2.0**-2}


def layout_rtol(dtype: str) -> float:
    """The relative tolerance of `dtype` across layouts (0 for integers and bools: exact)."""
    eps = EPS.get(dtype)
    return 0.0 if eps is None else min(MAX_RTOL, ULPS * eps * math.sqrt(REDUCTION))


def layout_tolerance() -> pa.Table:
    """layout_rtol of every float dtype, as the table `layout_tolerance` (dtype, rtol) the SQL joins."""
    return pa.table({"dtype": list(EPS), "rtol": [layout_rtol(d) for d in EPS]})


def layout(con: "duckdb.DuckDBPyConnection", dump_a: Dump, dump_b: Dump, read_errors: list[str]) -> dict[str, Any]:
    """Both runs' layouts, as summary.json's `layout`; leaves samples_a and samples_b in `con`.
    `per_sample` is true when they differ and both runs saved sample rows."""
    for name, dump, side in (("samples_a", dump_a, "A"), ("samples_b", dump_b, "B")):
        errors: list[str] = []
        table = dump.arrow("sample", errors=errors) if dump.format == "rlprobe" else with_rank(SAMPLE).empty_table()
        read_errors.extend(f"run {side}: {e}" for e in errors)
        store(con, name, table.select(with_rank(SAMPLE).names) if table.num_rows else with_rank(SAMPLE).empty_table())
    (ranks_a, micro_a, ranks_b, micro_b, moved, size_a, size_b, samples_a,
     samples_b) = records(con, "sample_layout.sql")[0].values()
    differs = (ranks_a, micro_a) != (ranks_b, micro_b) or moved > 0
    per_sample = differs and samples_a > 0 and samples_b > 0
    note = None
    if differs:
        shape = (f"A {micro_a} micro-batch{'es' if micro_a != 1 else ''} x {ranks_a} rank{'s' if ranks_a != 1 else ''}"
                 f", B {micro_b} x {ranks_b}")
        if (ranks_a, micro_a) == (ranks_b, micro_b):
            shape = f"{moved} sample rows sit at another rank, micro-batch or row in B"
        how = "compared per sample" if per_sample else \
            "compared by position: save prompts or sample_ids in both runs to compare per sample"
        note = f"layout differs: {shape}; {how}"
    return {"a": {"ranks": ranks_a, "micro_batches": micro_a, "micro_batch_size": size_a},
            "b": {"ranks": ranks_b, "micro_batches": micro_b, "micro_batch_size": size_b},
            "moved_samples": moved, "per_sample": per_sample, "note": note}


def modules_not_compared(layout: dict[str, Any]) -> str | None:
    """Why module dumps cannot be compared under `layout` (summary.json's), or None where they can. A module's
    calls are matched by position (its call count in the step), so under another micro-batch layout, or with
    micro-batches that hold other samples, each pair would hold other samples: docs/modules.md."""
    a, b = layout["a"], layout["b"]
    if (a["ranks"], a["micro_batches"]) != (b["ranks"], b["micro_batches"]):
        def shape(side: dict[str, Any]) -> str:
            size = "" if side.get("micro_batch_size") is None else f" x {side['micro_batch_size']}"
            ranks = f" on {side['ranks']} rank{'s' if side['ranks'] != 1 else ''}" \
                if max(a["ranks"], b["ranks"]) > 1 else ""
            return f"{side['micro_batches']}{size}{ranks}"

        return f"module dumps not compared: the runs' micro-batch layouts differ ({shape(a)} vs {shape(b)})"
    if layout["moved_samples"]:
        return (f"module dumps not compared: the runs' micro-batches hold other samples ({layout['moved_samples']} "
                "sample rows sit at another rank, micro-batch or row in B)")
    return None


def first_rank_only(table_a: pa.Table, table_b: pa.Table, layout: dict[str, Any], entry: str,
                    what: str, ranks: list[int] | None = None) -> tuple[pa.Table, pa.Table]:
    """Each run's rows of its first rank (rank 0), B's under A's rank number, for per-rank rows
    that every data-parallel rank holds alike (all-reduced gradients, the weights after a step).
    The other ranks' rows are counted in layout[entry] and, where there are any, the note says
    they are covered, instead of showing them as only in B. `ranks` (`--ranks`; None: all): each
    run's first rank among them; a run holding none of them (its rank count differs) is represented
    by its first rank, and the note says so, rather than leaving the other run's rows unmatched."""
    import pyarrow.compute as pc

    stand_ins = []

    def first_rank(table: pa.Table, side: str) -> tuple[pa.Table, int | None, int]:
        if table.num_rows == 0:
            return table, None, 0
        pool = table if ranks is None else table.filter(pc.is_in(table["rank"], pa.array(ranks, pa.int64())))
        if pool.num_rows == 0:  # the run holds none of the selected ranks
            rank = pc.min(table["rank"]).as_py()
            stand_ins.append(f"{side} holds none of ranks {sorted(ranks)}: its rank {rank} stands in for them")
            return table.filter(pc.equal(table["rank"], rank)), rank, 0
        rank = pc.min(pool["rank"]).as_py()
        kept = pool.filter(pc.equal(pool["rank"], rank))
        return kept, rank, pool.num_rows - kept.num_rows

    kept_a, rank_a, covered_a = first_rank(table_a, "A")
    kept_b, rank_b, covered_b = first_rank(table_b, "B")
    layout[entry] = {"rank_a": rank_a, "rank_b": rank_b, "rows_covered_a": covered_a, "rows_covered_b": covered_b}
    if rank_a is not None and rank_b is not None:
        if rank_a != rank_b:
            at = kept_b.schema.get_field_index("rank")
            kept_b = kept_b.set_column(at, "rank", pa.array(np.full(kept_b.num_rows, rank_a, np.int64)))
        covered = covered_a + covered_b
        if covered or stand_ins:  # with one rank on each side there is nothing to explain
            layout["note"] = (f"{layout['note']}; {what}s: rank {rank_a} of A against rank {rank_b} of B, within "
                              "the layout tolerance")
            if covered:
                layout["note"] += (f"; the {covered} {what} rows of the other ranks are covered by this note "
                                   "(every data-parallel rank holds the same)")
            if stand_ins:
                layout["note"] += f" ({'; '.join(stand_ins)}: every data-parallel rank holds the same)"
    return kept_a, kept_b


def sample_key_data(con: "duckdb.DuckDBPyConnection", dump_a: Dump, dump_b: Dump,
                    params: dict[str, Any], read_errors: list[str]) -> tuple[pa.Table, int]:
    """key_data of runs with different layouts, and how many sample pairs were gathered from files.
    `params`: keys, steps, ranks (lists, None = all)."""
    pairs = run(con, "sample_pairs.sql", **params)
    results = _gather(pairs, dump_a, dump_b)
    con.register("sample_pairs", _append(pairs, results))
    con.register("layout_tolerance", layout_tolerance())
    summed = {f"summed_{side.lower()}": summed_keys(dump, side, read_errors) or None
              for side, dump in (("A", dump_a), ("B", dump_b))}
    try:
        table = run(con, "sample_key_data.sql", **params, **summed)
    finally:
        con.unregister("sample_pairs")
        con.unregister("layout_tolerance")
    return table, int(np.count_nonzero(results["compared"]))


def summed_keys(dump: Dump, side: str, read_errors: list[str]) -> list[str]:
    """The keys run `side` declares summed over a step's micro-batches (its manifest's `summed_keys`,
    Probe(summed_keys=)); a manifest entry of another form is a read error, and the run's keys means."""
    if dump.format != "rlprobe":
        return []
    value = dump.manifest.get("summed_keys", [])
    if isinstance(value, list) and all(isinstance(k, str) for k in value):
        return value
    read_errors.append(f"run {side}: {dump.layout.run_manifest}: summed_keys is {value!r}; expected a list of key "
                       "names: every key of this run is compared as its mean over the step's micro-batches")
    return []


def _gather(pairs: pa.Table, dump_a: Dump, dump_b: Dump) -> dict[str, np.ndarray]:
    """Per pair: the two rows read from their tensor files and compared (where both runs saved
    the tensor, the rows' hashes differ and their shapes agree), vectorised per pair of files."""
    n = pairs.num_rows
    out = {"compared": np.zeros(n, bool), "equal_count": np.zeros(n, np.int64), "max_abs_err": np.full(n, np.nan),
           "max_rel_err": np.full(n, np.nan), "scale": np.full(n, np.nan), "nan_mismatch_count": np.zeros(n, np.int64)}
    errors: list[Any] = [None] * n
    cols = {c: pairs[c].to_numpy(zero_copy_only=False) for c in
            ("file_a", "file_b", "row_a", "row_b", "hash_a", "hash_b", "dtype_a", "dtype_b")}
    shapes_a, shapes_b = pairs["shape_a"].to_pylist(), pairs["shape_b"].to_pylist()
    groups: dict[tuple[str, str], list[int]] = {}
    for i in np.flatnonzero(pd_notnull(cols["file_a"]) & pd_notnull(cols["file_b"])):
        if cols["hash_a"][i] != cols["hash_b"][i] and shapes_a[i] == shapes_b[i] \
                and cols["dtype_a"][i] == cols["dtype_b"][i]:
            groups.setdefault((cols["file_a"][i], cols["file_b"][i]), []).append(int(i))
    for (file_a, file_b), idx in groups.items():
        at = np.asarray(idx)
        try:
            a = _rows(dump_a, file_a, cols["dtype_a"][at[0]], cols["row_a"][at].astype(np.int64))
            b = _rows(dump_b, file_b, cols["dtype_b"][at[0]], cols["row_b"][at].astype(np.int64))
        except (OSError, ValueError, IndexError) as e:
            for i in idx:
                errors[i] = f"cannot read the rows from {file_a} / {file_b}: {type(e).__name__}: {e}"
            continue
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(nan_a | nan_b, 0.0, np.abs(a - b))
            largest = np.maximum(np.abs(np.where(nan_a, 0, a)), np.abs(np.where(nan_b, 0, b)))
            rel = np.where(diff == 0, 0.0, diff / np.where(largest == 0, 1.0, largest))
        out["compared"][at] = True
        out["equal_count"][at] = ((a == b) | (nan_a & nan_b)).sum(axis=1)
        out["max_abs_err"][at] = diff.max(axis=1, initial=0.0)
        out["max_rel_err"][at] = rel.max(axis=1, initial=0.0)
        out["scale"][at] = largest.max(axis=1, initial=0.0)
        out["nan_mismatch_count"][at] = (nan_a != nan_b).sum(axis=1)
    out["error"] = np.array(errors, dtype=object)
    return out


def pd_notnull(values: np.ndarray) -> np.ndarray:
    return np.array([v is not None and v == v and v != "" for v in values], bool)


def _rows(dump: Dump, file: str, dtype: str, rows: np.ndarray) -> np.ndarray:
    """Rows `rows` of a saved batch tensor (`file`: its address, sql/pair_macros.sql's tensor_address) as
    float64, one row of values per line."""
    path, record = split_address(file)
    stored = load_npy(dump.path / path, NPY, mmap=True) if record is None \
        else load_record(str(dump.path / path), record, mmap=True)
    picked = restore(np.asarray(stored[rows]), dtype)
    return picked.reshape(len(rows), -1).astype(np.float64)


def _append(pairs: pa.Table, results: dict[str, np.ndarray]) -> pa.Table:
    for name, values in results.items():
        kind = {"error": pa.string(), "compared": pa.bool_()}.get(name)
        pairs = pairs.append_column(name, pa.array(values, kind))
    return pairs

